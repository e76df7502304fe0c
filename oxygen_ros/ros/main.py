"""The node's process: ROS init, signal handling, the executor thread and an orderly shutdown.

    python -m oxygen_ros.ros --ros-args --params-file config/tabletop.yaml     (or oxygen-node, ros2 run)
"""

from __future__ import annotations

import signal
import sys
import threading
import traceback

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.signals import SignalHandlerOptions

from .node import OxygenNode
from .node import __doc__ as node_doc
from .params import PARAMS

__all__ = ["main"]


def main(args: list[str] | None = None) -> int:
    """Entry point of ``oxygen_node`` / ``python -m oxygen_ros.ros``; returns 0 on a clean shutdown.

    SIGINT/SIGTERM are handled here rather than by rclpy (whose handler shuts the context down and destroys the
    node while callbacks may still run): stop the executor, wait for the running frame, release, then shut down.
    """
    argv = list(args if args is not None else sys.argv)
    own = argv[1:argv.index("--ros-args")] if "--ros-args" in argv else argv[1:]
    if {"-h", "--help"} & set(own):
        print(node_doc.strip() + "\n\nParameters (-p name:=value or --params-file FILE after --ros-args):")
        for spec in PARAMS:
            print(f"  {spec.name} ({spec.type_name}, default {spec.ros_default!r}): {spec.description}")
        return 0
    rclpy.init(args=argv, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    executor = SingleThreadedExecutor()
    node = OxygenNode()
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
    while not stop.wait(0.2):  # short waits: the signal handler runs in this thread
        pass
    executor.shutdown(timeout_sec=30.0)
    spinner.join(timeout=5.0)
    # a running frame gets a few seconds to end; a hung one (past watchdog_s) none: it cannot be interrupted, and
    # its daemon thread ends with the process
    node.release(timeout_s=3.0)
    node.destroy_node()
    rclpy.try_shutdown()
    # Shut down: a further SIGINT/SIGTERM (a terminal's Ctrl-C reaches every process of the group and `ros2 launch`
    # forwards it once more) must not kill the exiting interpreter, whose finalisation resets Python-function
    # handlers to the default action (exit by signal, -2, instead of 0).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    if failure:
        traceback.print_exception(failure[0])
        return 1
    return 0



if __name__ == "__main__":
    sys.exit(main())
