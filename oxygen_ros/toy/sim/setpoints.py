"""The simulator's setpoint-stream input (ROS-free): a stream of joint setpoints, e.g. from the chunk executor
(:mod:`oxygen_ros.executor`), instead of action chunks. Each step the arm moves toward the newest setpoint within
the world's speed limits, the way a position controller follows its command.

Two message shapes are taken: a ``sensor_msgs/JointState`` command (positions by name, any order, extra joints
ignored) and a ``std_msgs/Float64MultiArray`` in the simulator's joint order (a ``forward_command_controller``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["SETPOINT_TYPES", "setpoint_from_array", "setpoint_from_joint_state"]

SETPOINT_TYPES = ("joint_state", "float64_multi_array")


def setpoint_from_joint_state(names: Sequence[str], positions: Sequence[float],
                              joint_names: Sequence[str]) -> np.ndarray | str:
    """The setpoint for ``joint_names`` from a JointState's ``names`` / ``positions``, or why it is unusable."""
    if len(names) != len(positions):
        return f"{len(names)} names for {len(positions)} positions"
    index = {n: i for i, n in enumerate(names)}
    missing = [n for n in joint_names if n not in index]
    if missing:
        return f"joints {missing} missing from the setpoint ({list(names)})"
    out = np.array([positions[index[n]] for n in joint_names], dtype=np.float64)
    return out if np.all(np.isfinite(out)) else "non-finite setpoint"


def setpoint_from_array(data: Sequence[float], joint_names: Sequence[str]) -> np.ndarray | str:
    """The setpoint from a Float64MultiArray's ``data`` in ``joint_names`` order, or why it is unusable."""
    if len(data) != len(joint_names):
        return f"{len(data)} values for the {len(joint_names)} joints {list(joint_names)}"
    out = np.asarray(data, dtype=np.float64)
    return out if np.all(np.isfinite(out)) else "non-finite setpoint"
