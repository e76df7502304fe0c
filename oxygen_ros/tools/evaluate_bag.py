"""``python -m oxygen_ros.tools.evaluate_bag BAG --params-file FILE [-p name:=value ...] --out DIR``: an alias of
``python -m oxygen_ros.evaluation`` (the command line is :mod:`oxygen_ros.evaluation.cli`)."""

import sys

from oxygen_ros.evaluation.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
