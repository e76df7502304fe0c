"""Which chunk is in force and what the executor will execute next: chunks on the timing rule, switching between
them (``replace`` or ``aggregate``), and the plan that results. Pure logic, integer nanoseconds, no ROS.

The timing rule (ActionChunk): row ``t`` of a chunk stamped ``s`` with ``first_step`` ``f`` and period ``dt`` is due
at ``s + (f + t + 1) * dt``. Indices reported as *steps* count from the denoised chunk's first row, ``first_step``
included: step ``j`` is due at ``s + (j + 1) * dt`` (ExecutedPlan.step).

Switching, when a chunk arrives at node time ``now``:

- ``replace`` (default; what real-time chunking assumes): the new chunk takes over at its first row not yet due
  (due > now); the previous plan's remainder is dropped (LeRobot's RTC queue replacement, ros2_control's
  joint_trajectory_controller replacing from the first point after now).
- ``aggregate``: LeRobot's async ``_aggregate_action_queues`` on the time line: every row of the new chunk not yet
  due is merged with what the plan holds for its due time (:mod:`.aggregation`), rows the plan does not cover are
  taken as they are, and the plan becomes the new chunk's rows (the previous plan's steps beyond the new chunk are
  dropped, as LeRobot's queue keeps only the incoming timesteps). When the two chunks' time grids coincide the old
  value is the plan's own; otherwise it is the plan linearly interpolated at the due time.

Never used, and counted (:attr:`Timeline.rejected`): a chunk not newer than the one in force (``superseded``:
stamp, then frame_index), one with no row still ahead of now (``expired``: everything it holds is due before the
last executed step), one observed before the executor was released from a halt (``observed_before_release``), and
a malformed one (``malformed``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .aggregation import Aggregator

__all__ = ["SWITCH_MODES", "Chunk", "Plan", "Timeline"]

SWITCH_MODES = ("replace", "aggregate")
_GRID_TOL = 0.1  # a due time within a tenth of dt of the plan's ends counts as covered (stamp jitter)


@dataclass(frozen=True)
class Chunk:
    """One action chunk: ``actions`` [H, D] (robot units, the chunk's action order ``names``); row ``t`` is due at
    ``stamp_ns + (first_step + t + 1) * dt_ns``."""

    stamp_ns: int
    frame_index: int
    dt_ns: int
    actions: np.ndarray
    first_step: int = 0
    names: tuple[str, ...] = ()

    def due_ns(self, step: int | np.ndarray) -> int | np.ndarray:
        """Due time of step ``step`` (first_step included: row t is step first_step + t)."""
        return self.stamp_ns + (step + 1) * self.dt_ns

    def step_at(self, now_ns: int) -> int:
        """The last step (first_step included) whose due time has passed at ``now_ns``, at most the chunk's last;
        -1 when none has."""
        passed = (now_ns - self.stamp_ns) // self.dt_ns - 1
        return int(max(-1, min(passed, self.first_step + len(self.actions) - 1)))

    @property
    def key(self) -> tuple[int, int]:
        """Order of chunks: observation stamp, then frame index."""
        return (self.stamp_ns, self.frame_index)


@dataclass
class Plan:
    """What the executor will execute: ``values[i]`` is due at ``chunk.due_ns(start + i)`` (the chunk in force's
    grid); ``counts[i]``: predictions merged into it (aggregation)."""

    chunk: Chunk
    start: int
    values: np.ndarray
    counts: np.ndarray

    @property
    def times_ns(self) -> np.ndarray:
        return self.chunk.due_ns(np.arange(self.start, self.start + len(self.values), dtype=np.int64))

    @property
    def end_ns(self) -> int:
        """Due time of the last value."""
        return int(self.chunk.due_ns(self.start + len(self.values) - 1))

    def ahead(self, now_ns: int) -> tuple[int, np.ndarray]:
        """(first step due after ``now_ns``, the values from it on) — the plan ExecutedPlan carries."""
        first = max(self.start, self.chunk.step_at(now_ns) + 1)
        return first, self.values[first - self.start:]

    def value_at(self, t_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The plan at times ``t_ns`` [N]: (covered [N] bool, values [N, D] linearly interpolated between the plan's
        due times, counts [N] of the nearest value). Not covered: before the first or after the last due time."""
        times = self.times_ns.astype(np.float64)
        t = np.asarray(t_ns, dtype=np.float64)
        tol = _GRID_TOL * self.chunk.dt_ns
        covered = (t >= times[0] - tol) & (t <= times[-1] + tol)
        tc = np.clip(t, times[0], times[-1])
        if len(times) == 1:
            values = np.repeat(self.values[:1], len(t), axis=0)
            return covered, values, np.repeat(self.counts[:1], len(t))
        hi = np.clip(np.searchsorted(times, tc, side="left"), 1, len(times) - 1)
        lo = hi - 1
        w = ((tc - times[lo]) / (times[hi] - times[lo]))[:, None]
        values = (1 - w) * self.values[lo] + w * self.values[hi]
        nearest = np.where(w[:, 0] < 0.5, lo, hi)
        return covered, values, self.counts[nearest]


@dataclass
class Timeline:
    """The chunk in force and the plan (see the module docstring). Not thread-safe: one owner."""

    switch: str = "replace"
    aggregator: Aggregator | None = None
    plan: Plan | None = None
    rejected: dict[str, int] = field(default_factory=dict)
    accepted: int = 0
    released_ns: int | None = None  # chunks observed before this are not used (the last halt's release)

    def __post_init__(self) -> None:
        if self.switch not in SWITCH_MODES:
            raise ValueError(f"switch must be one of {SWITCH_MODES}, got {self.switch!r}")
        if self.switch == "aggregate" and self.aggregator is None:
            raise ValueError("switch: aggregate needs an aggregate rule")

    def _reject(self, reason: str) -> str:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        return reason

    def clear(self, released_ns: int | None = None) -> None:
        """Forget the plan (a halt); with ``released_ns``, chunks observed before it are never used."""
        self.plan = None
        if released_ns is not None:
            self.released_ns = released_ns

    @property
    def in_force(self) -> Chunk | None:
        return None if self.plan is None else self.plan.chunk

    def offer(self, chunk: Chunk, now_ns: int) -> str | None:
        """Take ``chunk`` at node time ``now_ns`` under the switch rule: None when it is used (the plan changed),
        else the reason it is not (counted in :attr:`rejected`)."""
        a = np.asarray(chunk.actions, dtype=np.float64)
        if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0 or chunk.dt_ns <= 0 or not np.isfinite(a).all() \
                or chunk.first_step < 0:
            return self._reject("malformed")
        current = self.in_force
        if current is not None and chunk.key <= current.key:
            return self._reject("superseded")
        if self.released_ns is not None and chunk.stamp_ns < self.released_ns:
            return self._reject("observed_before_release")
        rows = np.arange(len(a))
        due = chunk.stamp_ns + (chunk.first_step + rows + 1) * chunk.dt_ns
        ahead = np.flatnonzero(due > now_ns)
        if ahead.size == 0:
            return self._reject("expired")
        k = int(ahead[0])
        values, counts = a[k:].copy(), np.ones(len(a) - k, dtype=np.int64)
        if self.switch == "aggregate" and self.plan is not None and self.plan.values.shape[1] == a.shape[1] \
                and self.plan.chunk.names == chunk.names:
            covered, old, old_counts = self.plan.value_at(due[k:])
            if covered.any():
                merged, n = self.aggregator.merge(old[covered], old_counts[covered], values[covered])
                values[covered], counts[covered] = merged, n
        self.plan = Plan(chunk, chunk.first_step + k, values, counts)
        self.accepted += 1
        return None
