"""Executing action chunks in time (ROS-free): which actions of a chunk are still ahead, and whether a chunk fits
the robot at all.

A chunk computed from the observation stamped ``t0`` holds actions for ``t0 + (i + 1) * dt``; the ones whose time
has passed when the chunk arrives are skipped, so a slow policy does not replay stale actions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["aligned_actions", "chunk_problem", "chunk_start_index"]


def chunk_start_index(stamp_ns: int, now_ns: int, dt_ns: int, horizon: int) -> int:
    """Index of the first action of a chunk still in the future: action ``i`` is meant for ``stamp + (i + 1) * dt``
    (the step after the observation), so the actions due up to ``now`` are skipped; at most ``horizon - 1``."""
    if dt_ns <= 0 or now_ns <= stamp_ns:
        return 0
    return min(horizon - 1, (now_ns - stamp_ns) // dt_ns)


def chunk_problem(actions: np.ndarray, horizon: int, action_dim: int, names: Sequence[str],
                  joint_names: Sequence[str]) -> str | None:
    """Why a chunk of ``horizon x action_dim`` flat ``actions`` (named ``names``, may be empty) cannot drive a robot
    with ``joint_names`` (which must lead the action dims), or None when it can."""
    joints = list(joint_names)
    if action_dim < len(joints) or horizon < 1 or actions.size != action_dim * horizon:
        return f"shape: horizon {horizon} x action_dim {action_dim} with {actions.size} values"
    if names and list(names[: len(joints)]) != joints:
        return f"joint_names {list(names)} do not start with {joints}"
    if not np.all(np.isfinite(actions)):
        return "non-finite actions"
    return None


def aligned_actions(actions: np.ndarray, horizon: int, action_dim: int, n_joints: int, stamp_ns: int, now_ns: int,
                    dt_ns: int) -> np.ndarray:
    """The rows of a (valid) chunk still ahead at ``now_ns``, cut to the robot's first ``n_joints`` dims:
    [rows, n_joints] float64."""
    start = chunk_start_index(stamp_ns, now_ns, dt_ns, horizon)
    return np.asarray(actions, dtype=np.float64).reshape(horizon, action_dim)[start:, :n_joints]
