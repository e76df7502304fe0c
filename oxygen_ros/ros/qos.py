"""The QoS profiles of the package, named for what they carry, and the latched + volatile subscription pair.

- :func:`latched`: reliable, transient local: the last message reaches late joiners (instruction, halt, URDF).
- :func:`reliable`: reliable, volatile: commands and outputs that must not be lost (chunks, plans, /clock).
- :func:`best_effort`: best effort, volatile: a subscription that matches every publisher (a reliable one would
  not match a best-effort publisher), e.g. ``joint_states``.
- :func:`camera`: one image deep, the newest only; best effort or reliable (``camera_reliability``).
- :func:`keep_all`: reliable, every message kept (test probes that count what arrived).

Each call returns a new profile (a ``QoSProfile`` is mutable).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rclpy.callback_groups import CallbackGroup
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.subscription import Subscription

__all__ = ["best_effort", "camera", "keep_all", "latched", "reliable", "subscribe_latched_and_volatile"]


def latched(depth: int = 1) -> QoSProfile:
    """Reliable, transient local (as robot_state_publisher's URDF): a later subscriber gets the last message."""
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL)


def reliable(depth: int = 10) -> QoSProfile:
    """Reliable, volatile, the newest ``depth`` messages."""
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.VOLATILE)


def best_effort(depth: int = 10) -> QoSProfile:
    """Best effort, volatile: as a subscription it matches reliable and best-effort publishers alike."""
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth, reliability=ReliabilityPolicy.BEST_EFFORT,
                      durability=DurabilityPolicy.VOLATILE)


def camera(best_effort_delivery: bool = True) -> QoSProfile:
    """Images: only the newest one is worth having (depth 1, volatile), best effort or reliable."""
    return best_effort(1) if best_effort_delivery else reliable(1)


def keep_all() -> QoSProfile:
    """Reliable, volatile, every message kept until taken."""
    return QoSProfile(history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.VOLATILE)


def subscribe_latched_and_volatile(node: Node, msg_type: Any, topic: str, callback: Callable[..., None],
                                   group: CallbackGroup | None = None) -> list[Subscription]:
    """Two subscriptions to ``topic``: a transient-local one receives what a latched publisher sent before this
    node started (restarts, late joining); a volatile one receives volatile publishers, which a transient-local
    subscription cannot match (its incompatible-QoS events are expected and not reported). A latched publisher's
    message arrives on both: the callback drops the duplicate (e.g.
    :class:`~oxygen_ros.robot.newest.NewestPerPublisher`).
    """
    quiet = SubscriptionEventCallbacks(incompatible_qos=lambda event: None)
    return [node.create_subscription(msg_type, topic, callback, latched(), callback_group=group,
                                     event_callbacks=quiet),
            node.create_subscription(msg_type, topic, callback, reliable(10), callback_group=group)]
