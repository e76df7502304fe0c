"""``python -m oxygen_ros.toy.sim``: the tabletop simulator node (see :mod:`oxygen_ros.toy.sim.node`)."""

import sys

from .node import main

if __name__ == "__main__":
    sys.exit(main())
