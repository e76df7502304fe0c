"""Percentiles of measured samples, as the benchmarks and reports give them."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["nearest_rank", "percentile", "summary"]


def percentile(values: Sequence[float], q: float, scale: float = 1.0) -> float | None:
    """The ``q``-th percentile (0-100, linear interpolation between samples, numpy's default) times ``scale``;
    None for no samples."""
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) * scale


def nearest_rank(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (an observed value): the smallest value with at least ``q`` percent of them at or
    below it (p99 of fewer than 100 samples is their maximum). ``values`` must not be empty."""
    if not values:
        raise ValueError("nearest_rank of no values")
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def summary(values: Sequence[float], qs: Sequence[float] = (50, 90, 99)) -> dict[str, float | int | None]:
    """count, mean, ``p<q>`` for each of ``qs`` and max of ``values`` (None entries when empty)."""
    keys = ["mean", *(f"p{q:g}" for q in qs), "max"]
    if len(values) == 0:
        return {"count": 0, **dict.fromkeys(keys)}
    a = np.asarray(values, dtype=np.float64)
    return {"count": int(a.size), "mean": float(a.mean()), **{f"p{q:g}": float(np.percentile(a, q)) for q in qs},
            "max": float(a.max())}
