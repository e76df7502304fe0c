"""The executor's process: ROS init, a single-threaded executor for the inputs, diagnostics and lifecycle (the
command loop is a thread of its own, :mod:`.loop`; ``loop: timer`` keeps the former multi-threaded executor),
signal handling and an orderly shutdown: the loop stops first, then the executor, then the node.

    python -m oxygen_ros.executor --ros-args -p command_rate_hz:=100.0     (or oxygen-executor, ros2 run)
"""

from __future__ import annotations

import signal
import sys
import threading
import traceback

import rclpy
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor, SingleThreadedExecutor
from rclpy.signals import SignalHandlerOptions

from .node import ExecutorNode
from .node import __doc__ as node_doc
from .params import EXECUTOR_PARAMS, ParamError

__all__ = ["main"]


def main(args: list[str] | None = None) -> int:
    """Entry point of ``oxygen-executor`` / ``ros2 run oxygen_ros oxygen_executor``; 0 on a clean shutdown, 2 on
    invalid parameters."""
    argv = list(args if args is not None else sys.argv)
    own = argv[1:argv.index("--ros-args")] if "--ros-args" in argv else argv[1:]
    if {"-h", "--help"} & set(own):
        print(node_doc.strip() + "\n\nParameters (-p name:=value or --params-file FILE after --ros-args):")
        for spec in EXECUTOR_PARAMS:
            print(f"  {spec.name} ({spec.type_name}, default {spec.ros_default!r}): {spec.description}")
        return 0
    rclpy.init(args=argv, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        node = ExecutorNode()
    except ParamError as e:
        print(f"oxygen_executor: {e}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    # loop: thread: one thread for the inputs, the diagnostics and the lifecycle (the setpoints have their own);
    # loop: timer: the former multi-threaded executor, the command timer in its own callback group
    executor = SingleThreadedExecutor() if node.params.loop == "thread" else MultiThreadedExecutor(num_threads=3)
    executor.add_node(node)
    failure: list[BaseException] = []

    def spin() -> None:
        try:
            executor.spin()
        except ExternalShutdownException:
            pass
        except BaseException as e:  # reported below, after an orderly shutdown
            failure.append(e)
        finally:
            stop.set()

    spinner = threading.Thread(target=spin, name="executor", daemon=True)
    spinner.start()
    while not stop.wait(0.2):
        pass
    node.stop_loop()  # no setpoint after this; then no callback runs while the node's handles go
    executor.shutdown(timeout_sec=5.0)
    spinner.join(timeout=5.0)
    node.destroy_node()
    rclpy.try_shutdown()
    for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C while exiting: not an exit by signal
        signal.signal(sig, signal.SIG_IGN)
    if failure:
        traceback.print_exception(failure[0])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
