"""``python -m oxygen_ros.demo``: the closed-loop demo (see :mod:`oxygen_ros.demo.run`)."""

import sys

from .run import main

if __name__ == "__main__":
    sys.exit(main())
