"""The executor's process (:func:`oxygen_ros.ros.process.run_node`): ROS init, a single-threaded executor for the
inputs, diagnostics and lifecycle (the command loop is a thread of its own, :mod:`.loop`; ``loop: timer`` keeps the
former multi-threaded executor), signal handling and an orderly shutdown: the loop stops first, then the executor,
then the node.

    python -m oxygen_ros.executor --ros-args -p command_rate_hz:=100.0     (or oxygen-executor, ros2 run)
"""

from __future__ import annotations

import sys

from rclpy.executors import Executor, MultiThreadedExecutor, SingleThreadedExecutor

from oxygen_ros.ros.process import parameter_help, run_node

from .node import ExecutorNode
from .node import __doc__ as node_doc
from .params import EXECUTOR_PARAMS, ParamError

__all__ = ["main"]


def _executor(node: ExecutorNode) -> Executor:
    # loop: thread: one thread for the inputs, the diagnostics and the lifecycle (the setpoints have their own);
    # loop: timer: the former multi-threaded executor, the command timer in its own callback group
    return SingleThreadedExecutor() if node.params.loop == "thread" else MultiThreadedExecutor(num_threads=3)


def main(args: list[str] | None = None) -> int:
    """Entry point of ``oxygen-executor`` / ``ros2 run oxygen_ros oxygen_executor``; 0 on a clean shutdown, 2 on
    invalid parameters."""
    # stop_loop first: no setpoint after it, then no callback runs while the node's handles go
    return run_node(ExecutorNode, args=args, help_text=parameter_help(node_doc or "", EXECUTOR_PARAMS),
                    make_executor=_executor, on_stop=lambda node: node.stop_loop(), shutdown_timeout_s=5.0,
                    config_errors=(ParamError,), name="oxygen_executor")


if __name__ == "__main__":
    sys.exit(main())
