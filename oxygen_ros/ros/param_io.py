"""The rclpy side of the parameter schema (:mod:`oxygen_ros.params`): declare specs on a node and read their values
back. Every parameter is declared with ``dynamic_typing`` so a wrongly typed override never stops a node from
starting; the schema's ``validate`` functions check the values and name every problem at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.node import Node

from oxygen_ros.params import ParamSpec

__all__ = ["declare_specs", "read_specs_of"]


def declare_specs(node: Node, specs: Iterable[ParamSpec], prefix: str = "", description: str = "") -> None:
    """Declare each spec (``<prefix><name>``; ``description`` goes before its help), unless already declared."""
    for spec in specs:
        name = prefix + spec.name
        if not node.has_parameter(name):
            node.declare_parameter(name, spec.ros_default, ParameterDescriptor(
                description=description + spec.description, additional_constraints=f"type: {spec.type_name}",
                dynamic_typing=True))


def read_specs_of(node: Node, specs: Iterable[ParamSpec], prefix: str = "") -> dict[str, Any]:
    """The declared values of ``specs``, by ROS name (``<prefix><name>``), for the schema's ``validate``."""
    return {prefix + spec.name: node.get_parameter(prefix + spec.name).value for spec in specs}
