"""The executor's messages: the setpoint in the output's joint order (Float64MultiArray for a
forward_command_controller, JointState, single-point JointTrajectory) and ExecutedPlan (``~/executed``), plus the
reordering by name (:class:`JointOrder`) and the chunk message's conversion (:func:`chunk_from_msg`)."""

from __future__ import annotations

import array
from collections.abc import Mapping, Sequence

import numpy as np
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, MultiArrayDimension
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.msg import ActionChunk, ExecutedPlan
from oxygen_ros.ros.stamps import duration_msg, stamp_to_ns, time_msg

from .streamer import Setpoint
from .timeline import Chunk

__all__ = ["JointOrder", "OutputWriter", "chunk_from_msg", "executed_msg", "output_msg"]


class JointOrder:
    """Where each output joint's value is among the actions: ``names`` the actions' (robot) joint names,
    ``output`` the output's joint order ([] = ``names``).

    Raises:
        ValueError: an output joint that no action names.
    """

    def __init__(self, names: Sequence[str], output: Sequence[str] = ()) -> None:
        self.names = tuple(output) or tuple(names)
        index = {n: i for i, n in enumerate(names)}
        missing = [n for n in self.names if n not in index]
        if missing:
            raise ValueError(f"output_joints {missing} are not among the actions' joints {list(names)} "
                             "(ActionChunk.joint_names after joint_map)")
        self.index = np.array([index[n] for n in self.names], dtype=np.int64)

    def __call__(self, values: np.ndarray) -> list[float]:
        return [float(x) for x in np.asarray(values, dtype=np.float64)[self.index]]


def chunk_from_msg(msg: ActionChunk, renames: Mapping[str, str] | None = None,
                   default_names: Sequence[str] = ()) -> Chunk:
    """An ActionChunk as a :class:`Chunk` with the robot's joint names (``renames``: action -> joint).

    Raises:
        ValueError: sizes that do not match (actions, horizon, action_dim, names).
    """
    h, d = int(msg.horizon), int(msg.action_dim)
    if h * d != len(msg.actions) or h == 0 or d == 0:
        raise ValueError(f"{len(msg.actions)} actions for horizon {h} x action_dim {d}")
    names = tuple(msg.joint_names) or tuple(default_names)
    if names and len(names) != d:
        raise ValueError(f"{len(names)} joint_names for action_dim {d}")
    renames = renames or {}
    actions = np.frombuffer(array.array("f", msg.actions).tobytes(), dtype=np.float32).astype(np.float64)
    return Chunk(stamp_to_ns(msg.header.stamp), int(msg.frame_index), stamp_to_ns(msg.dt),
                 actions.reshape(h, d), int(msg.first_step), tuple(renames.get(n, n) for n in names))


def output_msg(kind: str, sp: Setpoint, order: JointOrder, period_s: float, with_velocity: bool):
    """The setpoint as ``kind`` (float64_array | joint_state | trajectory) in ``order``."""
    if kind == "float64_array":
        msg = Float64MultiArray()
        msg.layout.dim = [MultiArrayDimension(label="joints", size=len(order.names), stride=len(order.names))]
        msg.data = order(sp.position)
        return msg
    if kind == "joint_state":
        msg = JointState(name=list(order.names), position=order(sp.position))
        msg.header.stamp = time_msg(sp.stamp_ns)
        if with_velocity:
            msg.velocity = order(sp.velocity)
        return msg
    msg = JointTrajectory(joint_names=list(order.names))  # stamp 0: start on receipt; reach it in one period
    point = JointTrajectoryPoint(positions=order(sp.position), time_from_start=duration_msg(period_s))
    if with_velocity:
        point.velocities = order(sp.velocity)
    msg.points = [point]
    return msg


class OutputWriter:
    """The output message allocated once (names, layout, the trajectory point) and refilled every tick with the
    setpoint's values (what :func:`output_msg` builds anew): the command loop allocates no message. Every field a
    tick sets is set on every tick, so nothing of an earlier tick remains."""

    def __init__(self, kind: str, order: JointOrder, period_s: float, with_velocity: bool) -> None:
        self.kind, self.order, self.with_velocity = kind, order, with_velocity
        width = int(order.index.max()) + 1 if len(order.index) else 0  # the actions the order picks from
        self.msg = output_msg(kind, Setpoint(0, np.zeros(width), np.zeros(width), True, "not_started"), order,
                              period_s, with_velocity)

    def __call__(self, sp: Setpoint):
        """The reused message holding ``sp`` (publish it before the next call)."""
        msg, order = self.msg, self.order
        if self.kind == "float64_array":
            msg.data = order(sp.position)
        elif self.kind == "joint_state":
            msg.header.stamp = time_msg(sp.stamp_ns)
            msg.position = order(sp.position)
            if self.with_velocity:
                msg.velocity = order(sp.velocity)
        else:
            point = msg.points[0]
            point.positions = order(sp.position)
            if self.with_velocity:
                point.velocities = order(sp.velocity)
        return msg


def executed_msg(sp: Setpoint, names: Sequence[str]) -> ExecutedPlan:
    """ExecutedPlan for one tick (arrays in the chunk's action order ``names``, its own names)."""
    msg = ExecutedPlan()
    msg.header.stamp = time_msg(sp.stamp_ns)
    if sp.chunk is not None:
        msg.chunk_stamp = time_msg(sp.chunk.stamp_ns)
        msg.frame_index = int(sp.chunk.frame_index)
        msg.dt = duration_msg(sp.chunk.dt_ns / 1e9)
    msg.step = int(sp.step)
    msg.joint_names = list(names)
    if sp.position is not None:
        msg.setpoint = [float(x) for x in sp.position]
    msg.holding = bool(sp.holding)
    if len(sp.plan):
        msg.plan_start = time_msg(sp.plan_start_ns)
        msg.plan_length = len(sp.plan)
        msg.plan = array.array("f", np.ascontiguousarray(sp.plan, dtype=np.float32).tobytes())
    return msg
