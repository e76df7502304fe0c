"""The robot description (URDF) subscription of the node's action guard and of the chunk executor: a latched topic
whose joint limits each of them applies in its own way."""

from __future__ import annotations

from collections.abc import Callable

from rclpy.callback_groups import CallbackGroup
from rclpy.node import Node
from rclpy.subscription import Subscription
from std_msgs.msg import String

from oxygen_ros.robot.limits import JointLimit
from oxygen_ros.robot.urdf import UrdfError, urdf_limits

from . import qos

__all__ = ["subscribe_robot_description"]


def subscribe_robot_description(node: Node, topic: str, apply: Callable[[str, dict[str, JointLimit]], str],
                                reject: Callable[[str], None],
                                group: CallbackGroup | None = None) -> Subscription:
    """Subscribe (latched, as robot_state_publisher publishes it) to a URDF on ``topic``.

    Each URDF's limits go to ``apply(robot_name, limits)``, whose summary is logged with the parser's notes; a URDF
    that does not parse goes to ``reject(error)`` and the previous limits stay.
    """
    def on_robot_description(msg: String) -> None:
        try:
            robot, limits, notes = urdf_limits(msg.data)
        except UrdfError as e:  # the previous limits stay
            reject(str(e))
            return
        summary = apply(robot, limits)
        node.get_logger().info(f"robot_description: URDF {robot!r}, {summary}"
                               + (f" ({'; '.join(notes)})" if notes else ""))

    return node.create_subscription(String, topic, on_robot_description, qos.latched(), callback_group=group)
