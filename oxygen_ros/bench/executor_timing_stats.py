"""The executor timing benchmark's figures from recorded ExecutedPlan ticks (numpy only): the command period's
error against ``1 / rate``, and the setpoint jumps at chunk switches.

- period error: ``|t_k - t_{k-1} - 1/rate|`` over consecutive ticks' stamps (the node time each setpoint was
  commanded for); p50 / p99 / max, in ms and in % of the period. A tick the timer skipped shows as an error of a
  whole period (counted as ``late_ticks``: a gap over 1.5 periods).
- switch jump: at a tick whose chunk in force (``frame_index``) differs from the previous tick's, the largest
  joint's ``|setpoint_k - setpoint_{k-1}| / (t_k - t_{k-1})`` (units/s: a velocity). Ticks within a chunk give the
  baseline (the motion's own speed); a switch that jumps shows well above it. ``columns`` picks the joints (the
  benchmark leaves out grippers: an open / close command is a step by design and would be the max of every tick).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["period_errors", "switch_jumps"]


def _pcts(values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {"p50": None, "p99": None, "max": None, "mean": None}
    return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99)),
            "max": float(values.max()), "mean": float(values.mean())}


def period_errors(stamps_ns: np.ndarray, rate_hz: float) -> dict[str, Any]:
    """Period error statistics of consecutive tick stamps (sorted, ns) commanded at ``rate_hz``."""
    stamps = np.sort(np.asarray(stamps_ns, dtype=np.int64))
    period_ms = 1e3 / rate_hz
    periods = np.diff(stamps) / 1e6
    err = np.abs(periods - period_ms)
    stats = _pcts(err)
    return {"period_ms": period_ms, "ticks": int(stamps.size), "error_ms": stats,
            "error_pct": {k: None if v is None else 100 * v / period_ms for k, v in stats.items()},
            "late_ticks": int(np.sum(periods > 1.5 * period_ms)),
            "mean_period_ms": float(periods.mean()) if periods.size else None}


def switch_jumps(stamps_ns: np.ndarray, frame_index: np.ndarray, setpoints: np.ndarray,
                 holding: np.ndarray | None = None, columns: list[int] | None = None) -> dict[str, Any]:
    """Setpoint speed (max over joints of |delta| / dt) at chunk switches and within chunks.

    ``stamps_ns`` [N] tick stamps (sorted), ``frame_index`` [N] the chunk in force, ``setpoints`` [N, D],
    ``holding`` [N] ticks that held (excluded from both sides)."""
    t = np.asarray(stamps_ns, dtype=np.int64)
    fi = np.asarray(frame_index)
    sp = np.asarray(setpoints, dtype=np.float64)
    if columns is not None:
        sp = sp[:, columns]
    hold = np.zeros(t.size, bool) if holding is None else np.asarray(holding, bool)
    if t.size < 2:
        return {"switches": 0, "switch": _pcts(np.zeros(0)), "within": _pcts(np.zeros(0)), "switch_over_within": None}
    dt = np.diff(t) / 1e9
    speed = np.abs(np.diff(sp, axis=0)).max(axis=1) / np.where(dt > 0, dt, np.nan)
    valid = np.isfinite(speed) & ~hold[1:] & ~hold[:-1]
    switch = (fi[1:] != fi[:-1]) & valid
    within = (fi[1:] == fi[:-1]) & valid
    s, w = _pcts(speed[switch]), _pcts(speed[within])
    return {"switches": int(switch.sum()), "switch": s, "within": w,
            "switch_over_within": (s["mean"] / w["mean"]) if s["mean"] is not None and w["mean"] else None}
