"""``python -m oxygen_ros.toy.demo``: the closed-loop demo (see :mod:`oxygen_ros.toy.demo.run`)."""

import sys

from .run import main

if __name__ == "__main__":
    sys.exit(main())
