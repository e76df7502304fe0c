"""``python -m oxygen_ros.tools.replay_bag BAG [--clock] [--rate 1.0] [--loop]``: publish a bag over DDS
(:mod:`oxygen_ros.evaluation.replay`; the command line is :mod:`oxygen_ros.evaluation.cli`)."""

import sys

from oxygen_ros.evaluation.cli import replay_bag_main as main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
