"""Output messages: action chunks (ActionChunk, JointTrajectory) and language outputs (LanguageOutput)."""

from __future__ import annotations

import array
from collections.abc import Sequence

import numpy as np
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.engine.requests import FinishedRequest
from oxygen_ros.msg import ActionChunk, LanguageOutput

from .stamps import duration_msg, time_msg

__all__ = ["duration_msg", "language_output", "make_action_chunk", "make_trajectory", "time_msg"]

def make_action_chunk(actions: np.ndarray, stamp_ns: int, frame_index: int, names: Sequence[str], dt_s: float,
                      latency_s: float, frame_id: str = "") -> ActionChunk:
    """ActionChunk for robot-unit ``actions`` [H, D] (row-major), stamped with the observation time."""
    h, d = actions.shape
    msg = ActionChunk()
    msg.header.stamp = time_msg(stamp_ns)
    msg.header.frame_id = frame_id
    msg.frame_index = int(frame_index)
    msg.joint_names = list(names)
    msg.horizon, msg.action_dim = int(h), int(d)
    msg.actions = array.array("f", np.ascontiguousarray(actions, dtype=np.float32).tobytes())
    msg.dt = duration_msg(dt_s)
    msg.inference_latency = duration_msg(latency_s)
    return msg


def make_trajectory(actions: np.ndarray, names: Sequence[str], dt_s: float, stamp_ns: int = 0) -> JointTrajectory:
    """JointTrajectory for ros2_control's joint_trajectory_controller: point i at (i + 1) * dt after
    ``stamp_ns`` (0 = start on receipt), so the first point is in the future and times strictly increase."""
    msg = JointTrajectory()
    msg.header.stamp = time_msg(stamp_ns)
    msg.joint_names = list(names)
    rows = np.asarray(actions, dtype=np.float64)
    for i, row in enumerate(rows):
        point = JointTrajectoryPoint()
        point.positions = row.tolist()
        point.time_from_start = duration_msg((i + 1) * dt_s)
        msg.points.append(point)
    return msg


def language_output(done: FinishedRequest) -> LanguageOutput:
    """LanguageOutput for a finished request; header stamp = its originating frame's observation time
    (``done.stamp`` carries that stamp in nanoseconds)."""
    msg = LanguageOutput()
    msg.header.stamp = time_msg(int(done.stamp or 0))
    msg.request_id = int(done.request_id)
    msg.frame_index = int(done.frame_index)
    msg.task = done.task
    msg.text = done.text or ""
    msg.num_tokens = len(done.tokens)
    msg.eos = bool(done.eos)
    msg.latency = duration_msg(done.latency_s)
    return msg
