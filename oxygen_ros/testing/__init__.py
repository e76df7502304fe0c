"""Test and demo support: run an oxygen node as a child process (:class:`NodeProcess`, :mod:`.process`, ROS-free)
and drive it over real DDS from a helper node (:class:`Probe`, :mod:`.probe`, needs rclpy and the built messages).
Works from a source checkout and from an installed package alike.

The names below load their module on first use, so ``from oxygen_ros.testing import NodeProcess`` needs no ROS.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "NodeProcess": "process", "ros_env": "process", "source_checkout": "process", "yaml_value": "process",
    "Probe": "probe", "Received": "probe", "chunk_array": "probe", "header_ns": "probe", "joint_state_msg": "probe",
}

__all__ = sorted(_MODULES)


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULES[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULES))
