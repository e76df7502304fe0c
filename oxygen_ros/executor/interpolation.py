"""The setpoint between actions: a path from an anchor (the setpoint commanded when the plan last changed, its time
and velocity) through the plan's actions at their due times (:class:`Curve`).

- ``hold`` (zero-order): the last action whose due time has passed (the anchor before the first one is due).
- ``linear``: straight lines between consecutive actions (from the anchor to the first action ahead).
- ``cubic``: a cubic Hermite spline through the actions, velocities by central differences (Catmull-Rom on the
  actual due times); it starts with the anchor's velocity, so a chunk switch is continuous in position *and*
  velocity, and ends at rest on the last action.

Past the last action every mode holds it (velocity 0): the executor never extrapolates a chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["INTERPOLATIONS", "Curve"]

INTERPOLATIONS = ("hold", "linear", "cubic")
_NS = 1e9


@dataclass(frozen=True)
class Curve:
    """The path (see the module docstring). ``times_ns`` [N] ascending (the anchor first), ``values`` [N, D],
    ``velocities`` [N, D] per second (used by cubic)."""

    mode: str
    times_ns: np.ndarray
    values: np.ndarray
    velocities: np.ndarray

    @classmethod
    def through(cls, mode: str, anchor_ns: int, anchor: np.ndarray, anchor_velocity: np.ndarray | None,
                times_ns: np.ndarray, values: np.ndarray) -> Curve:
        """The path from ``anchor`` (position at ``anchor_ns``, velocity ``anchor_velocity`` or 0) through the
        actions ``values`` [N, D] due at ``times_ns`` [N] (those not after the anchor are left out)."""
        if mode not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {mode!r}")
        anchor = np.asarray(anchor, dtype=np.float64)
        keep = np.asarray(times_ns) > anchor_ns
        t = np.concatenate([[float(anchor_ns)], np.asarray(times_ns, dtype=np.float64)[keep]])
        p = np.vstack([anchor[None], np.asarray(values, dtype=np.float64)[keep]])
        v = np.zeros_like(p)
        if anchor_velocity is not None:
            v[0] = anchor_velocity
        if len(t) > 2:  # interior knots: central differences over the actual times; the last knot: at rest
            v[1:-1] = (p[2:] - p[:-2]) / ((t[2:] - t[:-2]) / _NS)[:, None]
        return cls(mode, t, p, v)

    @property
    def end_ns(self) -> float:
        """Time of the last action (the anchor's when there is none)."""
        return float(self.times_ns[-1])

    def at(self, t_ns: int) -> tuple[np.ndarray, np.ndarray]:
        """(position [D], velocity [D] per second) at node time ``t_ns``."""
        t, p = self.times_ns, self.values
        if len(t) == 1 or t_ns >= t[-1]:  # past the last action: hold it
            return p[-1].copy(), np.zeros(p.shape[1])
        if t_ns <= t[0]:  # not after the anchor (the last command)
            return p[0].copy(), self.velocities[0].copy() if self.mode == "cubic" else np.zeros(p.shape[1])
        i = int(np.searchsorted(t, t_ns, side="right")) - 1  # t[i] <= t_ns < t[i + 1]
        if self.mode == "hold":
            return p[i].copy(), np.zeros(p.shape[1])
        h = (t[i + 1] - t[i]) / _NS
        s = (t_ns - t[i]) / (t[i + 1] - t[i])
        if self.mode == "linear":
            return p[i] + s * (p[i + 1] - p[i]), (p[i + 1] - p[i]) / h
        # cubic Hermite on [t_i, t_i+1]
        m0, m1 = self.velocities[i] * h, self.velocities[i + 1] * h
        s2, s3 = s * s, s * s * s
        pos = (2 * s3 - 3 * s2 + 1) * p[i] + (s3 - 2 * s2 + s) * m0 + (-2 * s3 + 3 * s2) * p[i + 1] + (s3 - s2) * m1
        vel = ((6 * s2 - 6 * s) * p[i] + (3 * s2 - 4 * s + 1) * m0 + (-6 * s2 + 6 * s) * p[i + 1]
               + (3 * s2 - 2 * s) * m1) / h
        return pos, vel
