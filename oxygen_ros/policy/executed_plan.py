"""What a chunk executor really executes, as the remainder real-time chunking guides the next chunk toward
(``rtc.remainder_source: executor``; the executor publishes ``oxygen_ros/ExecutedPlan`` every command period).

By default the node assumes the robot follows the timing rule: from an observation stamped ``t1`` on, it executes
the last published chunk's actions from ``t1`` on. An executor that blends chunks (aggregation), holds, or has
not switched yet executes something else; its plan says what. Each plan lists the actions it will execute next:
row i due at ``plan_start + i * dt``, the first row still ahead of its stamp.

The remainder for an observation stamped ``t1`` is the action for each time ``t1 + (k + 1) * dt`` (k = 0, 1, ...:
the new chunk's own timing), taken from the **newest plan stamped before that time** (whose row for it was still
ahead): for a time already past when the frame runs, the last plan before that action was executed (what the
robot did); for a time still ahead, the latest plan (what the robot will do). Plans are aligned on the nearest row
(the executor's grid and the observation's may be offset by under ``dt / 2``). The remainder ends where that plan
ends (the executor would hold there, not follow an older plan).
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

__all__ = ["ExecutedPlanRecord", "PlanHistory"]


@dataclass(frozen=True)
class ExecutedPlanRecord:
    """One executor plan in the node's action order and robot units."""

    stamp_ns: int  # the node time its setpoint was commanded for
    plan_start_ns: int  # row 0 is due then
    dt_ns: int
    rows: np.ndarray  # [L, action_dims]


class PlanHistory:
    """The executor's recent plans (thread-safe: a subscription adds, the inference thread reads).

    Args:
        dt_s: the node's action period; plans with another ``dt`` are refused.
        max_age_s: a plan older than this (its stamp against the reader's clock) is not fresh: no remainder.
        keep: plans kept (enough to reach back from the frame to its observation stamp at the command rate).
    """

    def __init__(self, dt_s: float, max_age_s: float = 0.25, keep: int = 1024) -> None:
        if not dt_s > 0 or not max_age_s > 0:
            raise ValueError("plan history needs dt_s > 0 and max_age_s > 0")
        self.dt_ns = round(dt_s * 1e9)
        self.max_age_ns = round(max_age_s * 1e9)
        self._plans: deque[ExecutedPlanRecord] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()

    def check(self, record: ExecutedPlanRecord) -> str | None:
        """Why ``record`` cannot be used (None: it can)."""
        if abs(record.dt_ns - self.dt_ns) > max(1000, self.dt_ns // 100):
            return f"plan dt {record.dt_ns / 1e6:.2f} ms != the node's action period {self.dt_ns / 1e6:.2f} ms"
        if record.rows.ndim != 2 or not np.all(np.isfinite(record.rows)):
            return "plan rows are not a finite [length x dims] array"
        return None

    def add(self, record: ExecutedPlanRecord) -> str | None:
        """Keep ``record`` (plans arrive in stamp order; an older one than the newest is dropped). Returns why it
        was refused, or None."""
        why = self.check(record)
        if why is not None:
            return why
        with self._lock:
            if self._plans and record.stamp_ns < self._plans[-1].stamp_ns:
                return "plan older than the newest one"
            self._plans.append(record)
        return None

    @property
    def newest_stamp_ns(self) -> int | None:
        with self._lock:
            return self._plans[-1].stamp_ns if self._plans else None

    def remainder(self, stamp_ns: int, now_ns: int, horizon: int) -> np.ndarray | None:
        """Robot-unit actions [T <= horizon, D] due at ``stamp_ns + (k + 1) * dt``, k < T (see the module
        docstring); None when no fresh plan covers ``stamp_ns + dt``."""
        with self._lock:
            plans = list(self._plans)
        if not plans or now_ns - plans[-1].stamp_ns > self.max_age_ns or horizon < 1:
            return None
        dims = plans[-1].rows.shape[1]
        stamps = [plan.stamp_ns for plan in plans]
        rows = []
        for k in range(horizon):
            t = stamp_ns + (k + 1) * self.dt_ns
            found = None
            # the newest plan stamped before t whose nearest row to t was still ahead of it decides what executes at t
            for p in range(bisect.bisect_left(stamps, t) - 1, -1, -1):
                plan = plans[p]
                j = round((t - plan.plan_start_ns) / self.dt_ns)
                if j >= 0:
                    found = (plan, j)
                    break
            if found is None or found[1] >= found[0].rows.shape[0] or found[0].rows.shape[1] != dims:
                break  # that plan ended there (the executor holds, not a plan to guide toward)
            rows.append(found[0].rows[found[1]])
        return np.stack(rows).astype(np.float64) if rows else None
