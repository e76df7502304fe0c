"""One process main for the package's nodes (the oxygen node, the chunk executor, the tabletop simulator): ROS init,
signal handling, an executor thread and an orderly shutdown.

SIGINT/SIGTERM are handled here rather than by rclpy, whose handler shuts the context down and destroys the node
while callbacks may still run. On a signal (or when ``finished`` says so, or the executor fails): ``on_stop`` (e.g.
stop the executor node's command loop: no setpoint after it), then the executor shuts down and its thread ends,
then ``on_stopped`` (e.g. the node releases the model after its running frame), then the node is destroyed and
the context shut down.
"""

from __future__ import annotations

import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

import rclpy
from rclpy.executors import Executor, ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions

__all__ = ["help_requested", "parameter_help", "run_node"]

N = TypeVar("N", bound=Node)


class _Spec(Protocol):
    name: str
    type_name: str
    ros_default: Any
    description: str


def help_requested(argv: list[str]) -> bool:
    """``-h`` / ``--help`` among the arguments before ``--ros-args``."""
    own = argv[1:argv.index("--ros-args")] if "--ros-args" in argv else argv[1:]
    return bool({"-h", "--help"} & set(own))


def parameter_help(doc: str, specs: Iterable[_Spec]) -> str:
    """A node's ``--help``: its docstring and one line per parameter."""
    lines = [doc.strip() + "\n\nParameters (-p name:=value or --params-file FILE after --ros-args):"]
    lines += [f"  {s.name} ({s.type_name}, default {s.ros_default!r}): {s.description}" for s in specs]
    return "\n".join(lines)


def run_node(make_node: Callable[[], N], *, args: list[str] | None = None, help_text: str = "",
             make_executor: Callable[[N], Executor] = lambda node: SingleThreadedExecutor(),
             on_stop: Callable[[N], None] | None = None, on_stopped: Callable[[N], None] | None = None,
             finished: Callable[[N], bool] | None = None, shutdown_timeout_s: float = 30.0,
             config_errors: tuple[type[Exception], ...] = (), name: str = "") -> int:
    """Run one node in its own process until SIGINT/SIGTERM, ``finished(node)`` or a failure of the executor.

    Args:
        make_node: builds the node (after ``rclpy.init``).
        args: the command line (default ``sys.argv``); ``-h``/``--help`` before ``--ros-args`` prints
            ``help_text`` and returns 0.
        make_executor: the rclpy executor for the node (default: single-threaded).
        on_stop / on_stopped: called before the executor shuts down / after its thread ended (see the module).
        finished: polled every 0.2 s; True ends the process as a signal would.
        shutdown_timeout_s: how long the executor's shutdown waits for running callbacks.
        config_errors: exceptions of ``make_node`` that mean invalid parameters: printed as ``name: error``,
            exit status 2.

    Returns:
        0 on a clean shutdown, 1 when the executor failed (its traceback printed), 2 on a config error.
    """
    argv = list(args if args is not None else sys.argv)
    if help_requested(argv):
        print(help_text.strip())
        return 0
    rclpy.init(args=argv, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        node = make_node()
    except config_errors as e:
        print(f"{name}: {e}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    executor = make_executor(node)
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
        if finished is not None and finished(node):
            break
    if on_stop is not None:
        on_stop(node)
    executor.shutdown(timeout_sec=shutdown_timeout_s)
    spinner.join(timeout=5.0)
    if on_stopped is not None:
        on_stopped(node)
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
