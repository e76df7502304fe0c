"""Output messages: action chunks (ActionChunk, JointTrajectory) and language outputs (LanguageOutput)."""

from __future__ import annotations

import array
from collections.abc import Sequence

import numpy as np
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.engine.requests import FinishedRequest
from oxygen_ros.msg import ActionChunk, LanguageOutput

from .stamps import NS_PER_S, duration_msg, time_msg

__all__ = ["duration_msg", "language_output", "make_action_chunk", "make_trajectory", "time_msg"]

def make_action_chunk(actions: np.ndarray, stamp_ns: int, frame_index: int, names: Sequence[str], dt_s: float,
                      latency_s: float, frame_id: str = "", subtask: str = "", first_step: int = 0) -> ActionChunk:
    """ActionChunk for robot-unit ``actions`` [H, D] (row-major), stamped with the observation time;
    ``subtask``: the subtask its action prompt was conditioned on ('' = none); ``first_step``: the denoised chunk's
    index of ``actions[0]`` (the committed ones before it are not sent)."""
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
    msg.first_step = int(first_step)
    msg.subtask = subtask
    return msg


def make_trajectory(actions: np.ndarray, names: Sequence[str], dt_s: float, stamp_ns: int = 0,
                    now_ns: int | None = None, first_step: int = 0) -> JointTrajectory | None:
    """JointTrajectory for ros2_control's joint_trajectory_controller, on the action timing rule: action i is the
    target for ``stamp + (first_step + i + 1) * dt``, so ``header.stamp`` = the observation time and point i's
    ``time_from_start`` = (first_step + i + 1) * dt (``stamp_ns`` 0: start on receipt).

    Points whose time is not after ``now_ns`` are dropped (their time_from_start is kept, so the rest stay on
    the observation's time line): the controller would pass over them anyway, sampling the trajectory at its own
    now and interpolating from the current state to the first future point, and it rejects a trajectory with a
    non-zero stamp that ends in the past. None when no point is left.
    """
    msg = JointTrajectory()
    msg.header.stamp = time_msg(stamp_ns)
    msg.joint_names = list(names)
    rows = np.asarray(actions, dtype=np.float64)
    dt_ns = round(dt_s * NS_PER_S)
    for i, row in enumerate(rows, start=first_step):
        if now_ns is not None and stamp_ns and stamp_ns + (i + 1) * dt_ns <= now_ns:
            continue
        point = JointTrajectoryPoint()
        point.positions = row.tolist()
        point.time_from_start = duration_msg((i + 1) * dt_s)
        msg.points.append(point)
    return msg if msg.points else None


def language_output(done: FinishedRequest) -> LanguageOutput:
    """LanguageOutput for a finished request; header stamp = its originating frame's observation time
    (``done.stamp`` carries that stamp in nanoseconds)."""
    msg = LanguageOutput()
    msg.header.stamp = time_msg(int(done.stamp or 0))
    msg.request_id = int(done.request_id)
    msg.frame_index = int(done.frame_index)
    msg.task = done.task
    msg.stream = done.stream or done.task
    msg.text = done.text or ""
    msg.num_tokens = len(done.tokens)
    msg.eos = bool(done.eos)
    msg.latency = duration_msg(done.latency_s)
    return msg
