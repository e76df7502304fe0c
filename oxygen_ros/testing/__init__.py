"""Test and demo support: run an oxygen node as a child process (:class:`NodeProcess`, :mod:`.process`, ROS-free)
and drive it over real DDS from a helper node (:class:`Probe`, :mod:`.probe`, needs rclpy and the built messages).
Works from a source checkout and from an installed package alike.

The names below load their module on first use, so ``from oxygen_ros.testing import NodeProcess`` needs no ROS.
"""

from oxygen_ros._lazy import lazy_exports

_EXPORTS = {
    "NodeProcess": "process", "ros_env": "process", "source_checkout": "process", "yaml_value": "process",
    "Probe": "probe", "Received": "probe", "chunk_array": "probe", "header_ns": "probe", "joint_state_msg": "probe",
    "ExecutorProbe": "executor_probe", "make_chunk": "executor_probe",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
