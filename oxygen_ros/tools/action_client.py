"""What ``oxygen-ask`` and ``oxygen-run`` share: a client node of their own and the connection to one of the
node's actions (``<node>/ask``, ``<node>/run``)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def client_node(name: str) -> Iterator[Any]:
    """An rclpy node named ``name`` in a context of its own, destroyed and shut down on exit."""
    import rclpy

    rclpy.init()
    node = rclpy.create_node(name)
    try:
        yield node
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


def connect(node: Any, action_type: type, target: str, action: str, timeout_s: float) -> Any:
    """An action client of ``<target>/<action>`` once its server is up; None (said on stderr) when none came in
    ``timeout_s``."""
    from rclpy.action import ActionClient

    client = ActionClient(node, action_type, f"{target.rstrip('/')}/{action}")
    if not client.wait_for_server(timeout_sec=timeout_s):
        print(f"no action server {target}/{action} (is the node active?)", file=sys.stderr)
        return None
    return client


def send_goal(node: Any, client: Any, goal: Any, feedback: Any, timeout_s: float) -> Any:
    """The handle of ``goal`` once its server accepted it (``feedback`` gets each feedback message); None when it
    was rejected or no answer came in ``timeout_s``."""
    import rclpy

    sent = client.send_goal_async(goal, feedback_callback=feedback)
    rclpy.spin_until_future_complete(node, sent, timeout_sec=timeout_s)
    handle = sent.result()
    return handle if handle is not None and handle.accepted else None
