"""Coverage: a published chunk must last until the next one replaces it.

On the action timing rule (action i of a chunk stamped t is due at ``t + (i + 1) * dt``), a chunk whose published
part ends at action ``end`` covers the robot until ``t + end * dt``. The next chunk is expected about one control
period later, plus its age when ready (observation stamp -> chunk ready): ``t + period + age``. A chunk that ends
before that leaves a robot following the timing rule without a target (it holds or starves) every period.

Under real-time chunking the whole chunk is published (LeRobot's RTC queue: ``n_action_steps`` plays no role), so
the chunk lasts until replaced whenever it is longer than period + age. Without it, ``n_action_steps`` actions at
the action rate must span period + age. :func:`coverage_warning` checks a configuration once (age from a warm-up
frame); :class:`CoverageWatch` checks every published chunk against the recent ages (p90 over a window).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

__all__ = ["Coverage", "CoverageWatch", "coverage_warning"]


@dataclass(frozen=True)
class Coverage:
    """One published chunk: how long after its stamp it covers, and when the next one is expected (seconds)."""

    covered_s: float
    expected_s: float

    @property
    def short(self) -> bool:
        """The published actions end before the next chunk is expected: the robot starves."""
        return self.covered_s < self.expected_s - 1e-9

    @property
    def gap_s(self) -> float:
        """Seconds without a target (0 when covered)."""
        return max(0.0, self.expected_s - self.covered_s)


class CoverageWatch:
    """Checks each published chunk against ``period_s`` + the ``quantile`` (p90) of the recent chunk ages."""

    def __init__(self, period_s: float, window: int = 30, quantile: float = 0.9) -> None:
        if not period_s > 0 or window < 1 or not 0 < quantile <= 1:
            raise ValueError("coverage watch needs period_s > 0, window >= 1, quantile in (0, 1]")
        self.period_s, self.quantile = period_s, quantile
        self.ages: deque[float] = deque(maxlen=window)
        self.last: Coverage | None = None
        self.checked = 0
        self.short = 0

    @property
    def age_s(self) -> float:
        """The percentile chunk age (0 before the first)."""
        if not self.ages:
            return 0.0
        return float(np.quantile(np.fromiter(self.ages, float), self.quantile, method="higher"))

    def observe(self, age_s: float, end: int, dt_s: float) -> Coverage:
        """One chunk published ``age_s`` after its stamp whose published part ends before action ``end``
        (``first_step`` + published rows)."""
        if math.isfinite(age_s) and age_s >= 0:
            self.ages.append(age_s)
        self.last = cov = Coverage(end * dt_s, self.period_s + self.age_s)
        self.checked += 1
        self.short += cov.short
        return cov


def coverage_warning(n_publish: int, dt_s: float, period_s: float, age_s: float, rtc: bool) -> str | None:
    """Why a configuration starves a robot that follows the timing rule (None: it does not): ``n_publish``
    actions at ``dt_s`` against period + ``age_s`` (a measured or estimated chunk age)."""
    cov = Coverage(n_publish * dt_s, period_s + age_s)
    if not cov.short:
        return None
    what = (f"the whole chunk ({n_publish} actions) is published under real-time chunking" if rtc else
            f"{n_publish} actions per chunk are published (actions_per_chunk / the checkpoint's n_action_steps)")
    return (f"coverage: {what}, spanning {cov.covered_s * 1e3:.0f} ms at {1 / dt_s:g} Hz, but the next chunk is "
            f"expected {cov.expected_s * 1e3:.0f} ms after a chunk's stamp (control period {period_s * 1e3:.0f} ms "
            f"+ about {age_s * 1e3:.0f} ms inference): a robot following the timing rule starves "
            f"{cov.gap_s * 1e3:.0f} ms every period. "
            + ("A longer chunk or a faster control rate fixes it." if rtc else
               "Enable rtc.enabled (publishes the whole chunk), raise actions_per_chunk, or lower action_rate_hz."))
