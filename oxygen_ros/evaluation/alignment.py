"""Aligning predicted action chunks with what the robot was commanded (pure numpy; the bag side is
:mod:`.reference`).

The action timing rule of the node (and of the simulator that executes its chunks): action ``i`` of a chunk computed
from the observation stamped ``t`` is meant for ``t + (i + 1) * dt``. A reference is a time series of joint
positions; its value at any time between two samples is linearly interpolated. A time before the first or after the
last sample is not covered: a chunk that runs past the recording's end is scored on its covered steps only, and a
chunk with no covered step is not scored at all.

Command trajectories overlap (a controller replans before the previous trajectory has run out); the robot follows
the newest one, so :func:`merge_trajectories` keeps each trajectory's points only up to the first point of the next
one (``joint_trajectory_controller``'s replacement rule).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Annotations", "ReferenceSeries", "Trajectory", "action_times", "merge_trajectories"]


@dataclass(frozen=True)
class ReferenceSeries:
    """Joint positions over time: ``values[k]`` [J] (float64) at ``times_ns[k]`` (int64, increasing), columns
    named ``names``."""

    names: tuple[str, ...]
    times_ns: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        t, v = np.asarray(self.times_ns, np.int64), np.asarray(self.values, np.float64)
        if t.ndim != 1 or v.shape != (t.size, len(self.names)):
            raise ValueError(f"reference: {t.shape} times and {v.shape} values for {len(self.names)} joints")
        if t.size > 1 and np.any(np.diff(t) <= 0):
            raise ValueError("reference times must increase strictly")
        object.__setattr__(self, "times_ns", t)
        object.__setattr__(self, "values", v)

    @classmethod
    def from_samples(cls, names: Sequence[str], samples: Sequence[tuple[int, np.ndarray]]) -> ReferenceSeries:
        """From (time_ns, values [J]) samples in any order; of samples sharing a time the last one given wins."""
        by_time: dict[int, np.ndarray] = {}
        for t, v in samples:
            by_time[int(t)] = np.asarray(v, np.float64)
        times = sorted(by_time)
        values = np.stack([by_time[t] for t in times]) if times else np.zeros((0, len(names)))
        return cls(tuple(names), np.asarray(times, np.int64), values)

    def __len__(self) -> int:
        return int(self.times_ns.size)

    @property
    def span_ns(self) -> tuple[int, int] | None:
        """(first, last) sample time, None when empty."""
        return (int(self.times_ns[0]), int(self.times_ns[-1])) if len(self) else None

    def select(self, joints: Sequence[str]) -> ReferenceSeries:
        """The columns ``joints``, in that order (KeyError naming the missing ones)."""
        missing = [j for j in joints if j not in self.names]
        if missing:
            raise KeyError(f"joints {missing} are not in the reference {list(self.names)}")
        cols = [self.names.index(j) for j in joints]
        return ReferenceSeries(tuple(joints), self.times_ns, self.values[:, cols])

    def at(self, times_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Values [M, J] at ``times_ns`` [M], linearly interpolated, and the covered mask [M] (uncovered rows: NaN).

        Times are taken relative to the first sample before the float conversion, so ns stamps stay exact."""
        q = np.asarray(times_ns, np.int64).reshape(-1)
        out = np.full((q.size, len(self.names)), np.nan)
        if not len(self):
            return out, np.zeros(q.size, bool)
        t0 = self.times_ns[0]
        covered = (q >= t0) & (q <= self.times_ns[-1])
        if covered.any():
            x, xp = (q[covered] - t0).astype(np.float64), (self.times_ns - t0).astype(np.float64)
            for j in range(len(self.names)):
                out[covered, j] = np.interp(x, xp, self.values[:, j])
        return out, covered


def action_times(stamp_ns: int, horizon: int, dt_ns: int) -> np.ndarray:
    """The times [H] (int64 ns) the actions of a chunk stamped ``stamp_ns`` are meant for: stamp + (i + 1) * dt."""
    return int(stamp_ns) + np.arange(1, horizon + 1, dtype=np.int64) * int(dt_ns)


@dataclass(frozen=True)
class Trajectory:
    """One command trajectory: its points' absolute times (int64 ns, increasing) and positions [P, J]."""

    times_ns: np.ndarray
    positions: np.ndarray


def merge_trajectories(names: Sequence[str], trajectories: Sequence[Trajectory]) -> ReferenceSeries:
    """What the robot was commanded when the trajectories (in the order they were sent) each replace the previous
    one: a trajectory's points count up to (excluding) the first point of the next trajectory; the last one counts
    whole. Empty trajectories are ignored."""
    trajs = [t for t in trajectories if np.asarray(t.times_ns).size]
    samples: list[tuple[int, np.ndarray]] = []
    for k, traj in enumerate(trajs):
        times = np.asarray(traj.times_ns, np.int64)
        until = int(np.asarray(trajs[k + 1].times_ns)[0]) if k + 1 < len(trajs) else None
        for t, p in zip(times, np.asarray(traj.positions, np.float64), strict=True):
            if until is None or t < until:
                samples.append((int(t), p))
    return ReferenceSeries.from_samples(names, samples)


@dataclass(frozen=True)
class Annotations:
    """A language annotation stream: texts valid from ``times_ns`` (increasing) on."""

    topic: str
    times_ns: np.ndarray
    texts: tuple[str, ...]

    def at(self, stamp_ns: int) -> str | None:
        """The annotation valid at ``stamp_ns``: the latest at or before it (None before the first)."""
        i = int(np.searchsorted(self.times_ns, stamp_ns, side="right")) - 1
        return self.texts[i] if i >= 0 else None
