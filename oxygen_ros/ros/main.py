"""The node's process (:func:`.process.run_node`): ROS init, signal handling, the executor thread and an orderly
shutdown that lets the running frame end before the model is released.

    python -m oxygen_ros.ros --ros-args --params-file config/tabletop.yaml     (or oxygen-node, ros2 run)
"""

from __future__ import annotations

import sys

from oxygen_ros.runtime.params import PARAMS

from .node import OxygenNode
from .node import __doc__ as node_doc
from .process import parameter_help, run_node

__all__ = ["main"]


def main(args: list[str] | None = None) -> int:
    """Entry point of ``oxygen_node`` / ``python -m oxygen_ros.ros``; returns 0 on a clean shutdown."""
    # a running frame gets a few seconds to end; a hung one (past watchdog_s) none: it cannot be interrupted, and
    # its daemon thread ends with the process
    return run_node(OxygenNode, args=args, help_text=parameter_help(node_doc or "", PARAMS),
                    on_stopped=lambda node: node.release(timeout_s=3.0), shutdown_timeout_s=30.0)


if __name__ == "__main__":
    sys.exit(main())
