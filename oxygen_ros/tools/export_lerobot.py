"""``python -m oxygen_ros.tools.export_lerobot BAG... --contract FILE --out DATASET``: bags -> a LeRobotDataset
(:mod:`oxygen_ros.export.cli`; ``oxygen-export-lerobot``)."""

import sys

from oxygen_ros.export.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
