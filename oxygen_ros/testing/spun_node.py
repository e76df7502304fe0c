"""A node in a ROS context of its own, spun by a background thread: what the DDS probes (:class:`~.probe.Probe`,
:class:`~.executor_probe.ExecutorProbe`) are built on."""

from __future__ import annotations

import contextlib
import threading

import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node

__all__ = ["SpunNode"]


class SpunNode:
    """``self.node`` (named ``name``) in its own context on ``domain_id``; :meth:`start_spinning` once its
    publishers and subscriptions exist; :meth:`close` (or the ``with`` block's end) stops it and shuts the context
    down. ``self.executor`` may spin other nodes beside it."""

    def __init__(self, name: str, domain_id: int | None) -> None:
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = Node(name, context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._spin_thread: threading.Thread | None = None

    def start_spinning(self, thread_name: str) -> None:
        """Spin the executor in a daemon thread named ``thread_name``."""
        self._spin_thread = threading.Thread(target=self._spin, daemon=True, name=thread_name)
        self._spin_thread.start()

    def _spin(self) -> None:
        with contextlib.suppress(Exception):  # the context was shut down
            self.executor.spin()

    def close(self) -> None:
        """Stop the executor and the node; shut the context down."""
        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)
        if self._spin_thread is not None:
            self._spin_thread.join(timeout=2.0)

    def __enter__(self) -> SpunNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
