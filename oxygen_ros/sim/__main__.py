"""``python -m oxygen_ros.sim``: the tabletop simulator node (see :mod:`oxygen_ros.sim.node`)."""

import sys

from .node import main

if __name__ == "__main__":
    sys.exit(main())
