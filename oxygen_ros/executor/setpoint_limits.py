"""Joint limits at the streaming rate: each setpoint moves from the previous one (or from the measured position) by
no more than the position range, the velocity and the acceleration limits allow (:class:`SetpointLimiter`), with the
real elapsed time ``h`` of each tick, whatever the spacing of the ticks.

The limits are the node's (:mod:`oxygen_ros.robot.limits`: the URDF on ``robot_description`` and the
``limits.<joint>.min / .max / .max_velocity / .max_acceleration`` parameters, parameters winning field by field).
Per joint and tick, from the previous setpoint p commanded with velocity v (= its step over its own h) toward the
target x, over the h elapsed since p:

- the target is clipped to [min, max];
- the velocity u = (x - p) / h is clipped to +-max_velocity, then to what still allows stopping at the target and
  before either end of the range: ``u^2 / (2 a) + u h <= d`` (d the distance left, a = max_acceleration), then to
  v +- a h;
- the setpoint is p + u h (never moved out of [min, max], never jumped into it).

The stopping bound holds for any later tick spacing: from speed u, ticks of any lengths h_1, h_2, ... that each
take a h_i off the speed cover at most u^2 / (2 a) (a right Riemann sum of a falling line under its integral), and
the bound keeps that distance free after this tick's own step u h. So when the previous setpoint respected it, the
fastest allowed deceleration v - a h still does, and the acceleration clip never has to break it: on every setpoint
``|p' - p| / h <= max_velocity``, ``|u - v| / h <= max_acceleration`` and ``min <= p' <= max``, and a setpoint never
overshoots a target that stands still. A joint without a limit is not bounded by it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from oxygen_ros.robot.limits import JointLimit

__all__ = ["SetpointLimiter"]


class SetpointLimiter:
    """Limits for the joints ``names`` (the executor's chunk action order)."""

    def __init__(self, names: Sequence[str], limits: Mapping[str, JointLimit] | None = None) -> None:
        self.names = tuple(names)
        self.set_limits(limits or {})

    def set_limits(self, limits: Mapping[str, JointLimit]) -> None:
        """Take per-joint limits (joints not named: none)."""
        per = [limits.get(n, JointLimit()) for n in self.names]
        self.limits = dict(zip(self.names, per, strict=True))
        inf = np.inf
        self.lo = np.array([-inf if j.lower is None else j.lower for j in per], dtype=np.float64)
        self.hi = np.array([inf if j.upper is None else j.upper for j in per], dtype=np.float64)
        self.vmax = np.array([inf if j.max_velocity is None else j.max_velocity for j in per], dtype=np.float64)
        self.amax = np.array([inf if j.max_acceleration is None else j.max_acceleration for j in per],
                             dtype=np.float64)
        self.limited = np.zeros(len(per), dtype=np.int64)  # setpoints changed by a limit, per joint

    @property
    def missing(self) -> list[str]:
        """Joints without any limit."""
        return [n for n, j in self.limits.items() if j.empty]

    def _brake(self, distance: np.ndarray, h: float) -> np.ndarray:
        """The fastest speed u from which the joint still stops within ``distance`` at max_acceleration after a
        step of ``h`` seconds, whatever the later ticks: ``u^2 / (2 a) + u h <= distance``."""
        a = self.amax
        d = np.maximum(distance, 0.0)
        with np.errstate(invalid="ignore", over="ignore"):
            u = np.sqrt((a * h) ** 2 + 2.0 * a * d) - a * h
            u = np.where(d > 0, np.maximum(u, 0.0), 0.0)
            return np.where(np.isfinite(a), u, np.inf)

    def step(self, previous: np.ndarray, velocity: np.ndarray, target: np.ndarray,
             h: float) -> tuple[np.ndarray, np.ndarray]:
        """The next setpoint and its velocity ((setpoint - previous) / h): from ``previous`` (commanded with
        ``velocity`` per second) toward ``target``, ``h`` seconds (the real time since ``previous``) later, within
        the limits (see the module docstring)."""
        p, v = np.asarray(previous, np.float64), np.asarray(velocity, np.float64)
        x = np.clip(np.asarray(target, np.float64), self.lo, self.hi)
        if h <= 0:
            return p.copy(), np.zeros_like(p)
        want = (x - p) / h
        u = np.clip(want, -self.vmax, self.vmax)
        to_target = self._brake(np.abs(x - p), h)
        u = np.clip(u, -to_target, to_target)
        u = np.minimum(u, self._brake(self.hi - p, h))  # room to stop before the upper end
        u = np.maximum(u, -self._brake(p - self.lo, h))
        u = np.clip(u, v - self.amax * h, v + self.amax * h)
        free = u == want  # no limit acted: the target itself (no rounding through the velocity)
        # never out of the range, and never jumped into it from a start outside (a measured position beyond it)
        out = np.clip(np.where(free, x, p + u * h), np.minimum(self.lo, p), np.maximum(self.hi, p))
        u = np.where(free, want, (out - p) / h)
        self.limited += np.abs(u - want) * h > 1e-12 + 1e-9 * np.abs(x)
        return out, u
