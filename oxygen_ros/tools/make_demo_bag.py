"""``python -m oxygen_ros.tools.make_demo_bag OUT [--duration 10] [--size 224] ...``: write the synthetic demo bag
(:mod:`oxygen_ros.evaluation.demo_bag`; the command line is :mod:`oxygen_ros.evaluation.cli`)."""

import sys

from oxygen_ros.evaluation.cli import make_demo_bag_main as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
