"""The check every chunk passes before the node publishes it (:class:`ActionLimiter`), against the joint
limits (:mod:`.limits`: the URDF's and the ``limits.<joint>.*`` parameters).

The check, on the action timing rule (action i is the target for ``stamp + (i + 1) * dt``):

- **non-finite** actions are never published, whatever the policy;
- **position**: every action within ``[min, max]``;
- **velocity** between consecutive actions: ``|a[i+1] - a[i]| <= max_velocity * dt``;
- **jump from the present**: the first action still ahead of now (k) against the joint's newest measured position
  q (time t_q: its arrival, node clock): ``|a[k] - q| <= max_velocity * (stamp + (k + 1) * dt - t_q)``, the
  farthest the joint can move before that action is due (LeRobot's ``max_relative_target``, timed).

``clamp`` makes a chunk that satisfies them: from the first action still ahead on, each action is clipped to what
the joint can reach from the previous one (from the present position for action k), then every action is clipped to
the position range (a position range and the present position that lies outside it cannot both hold; the range
wins). ``reject`` drops the chunk and reports which rule and joints failed.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .limits import LIMIT_POLICIES, JointLimit, merge_limits

__all__ = ["ActionLimiter", "LimitCheck"]

_REL_TOL, _ABS_TOL = 1e-6, 1e-9  # float32 actions compared with float64 limits


@dataclass
class LimitCheck:
    """The outcome for one chunk: ``actions`` to publish (a clamped copy under clamp), or None (rejected: ``reason``
    names the first failed rule, ``detail`` the joints and values)."""

    actions: np.ndarray | None
    reason: str = ""
    detail: str = ""
    clamped: list[str] = field(default_factory=list)  # joints changed by clamp
    notes: list[str] = field(default_factory=list)  # first clamp of a joint and rule: to log once


class ActionLimiter:
    """Checks chunks against the joint limits (see the module docstring); thread-safe, with per joint statistics
    for ``/diagnostics``.

    Args:
        names: the published action dimensions' names (the URDF's joint names).
        policy: clamp or reject.
        overrides: ``{joint: {field: value}}`` from the ``limits.<joint>.<field>`` parameters.
        required: reject (reason ``limits_missing``) while an action joint has no limit at all.
    """

    def __init__(self, names: Sequence[str], policy: str = "clamp",
                 overrides: Mapping[str, Mapping[str, float]] | None = None, required: bool = False) -> None:
        if policy not in LIMIT_POLICIES:
            raise ValueError(f"limits.policy must be one of {LIMIT_POLICIES}, got {policy!r}")
        self.names, self.policy, self.required = tuple(names), policy, required
        self._overrides = {k: dict(v) for k, v in (overrides or {}).items()}
        self._lock = threading.Lock()
        self.robot = ""  # the URDF's robot name ('' = none received)
        self.chunks = {"checked": 0, "clamped": 0, "rejected": 0}
        self.set_urdf({})

    # ------------------------------------------------------------------------------------------ limits
    def set_urdf(self, limits: Mapping[str, JointLimit], robot: str = "") -> list[str]:
        """Take a URDF's limits (replacing the previous URDF's); returns the action joints it has no limits for.
        The statistics restart."""
        merged = merge_limits(limits, self._overrides)
        d = len(self.names)
        per = [merged.get(n, JointLimit()) for n in self.names]
        with self._lock:
            self.robot = robot
            self.limits = dict(zip(self.names, per, strict=True))
            self._lo = np.array([-np.inf if j.lower is None else j.lower for j in per], dtype=np.float64)
            self._hi = np.array([np.inf if j.upper is None else j.upper for j in per], dtype=np.float64)
            self._vel = np.array([np.inf if j.max_velocity is None else j.max_velocity for j in per], np.float64)
            self._missing = [n for n, j in zip(self.names, per, strict=True) if j.empty]
            self.margin = np.full(d, np.inf)  # lowest position margin seen (fraction of the range)
            self.velocity_use = np.zeros(d)  # highest |velocity| / max_velocity seen
            self.clamped_by_joint = np.zeros(d, dtype=np.int64)
            self._logged: set[tuple[str, str]] = set()
        return [n for n in self.names if limits.get(n) is None]

    @property
    def missing(self) -> list[str]:
        """Action joints without any limit."""
        with self._lock:
            return list(self._missing)

    # ------------------------------------------------------------------------------------------ the check
    def check(self, actions: np.ndarray, dt_s: float, stamp_ns: int, now_ns: int,
              present: np.ndarray | None = None, present_ns: np.ndarray | None = None,
              first_step: int = 0) -> LimitCheck:
        """Check (and under clamp, fix) one chunk ``actions`` [H, D] (robot units, row i due at
        ``stamp + (first_step + i + 1) * dt``) at node time ``now_ns``. ``present`` [D]: each action joint's newest
        measured position (NaN = unknown), ``present_ns`` [D] its node-clock time."""
        out = self._check(actions, dt_s, stamp_ns + first_step * round(dt_s * 1e9), now_ns, present, present_ns)
        with self._lock:
            self.chunks["checked"] += 1
            if out.actions is None:
                self.chunks["rejected"] += 1
            elif out.clamped:
                self.chunks["clamped"] += 1
        return out

    def _check(self, actions: np.ndarray, dt_s: float, stamp_ns: int, now_ns: int, present: np.ndarray | None,
               present_ns: np.ndarray | None) -> LimitCheck:
        a = np.asarray(actions, dtype=np.float64)
        h, d = a.shape
        if d != len(self.names):
            return LimitCheck(None, "action_dim_mismatch", f"{d} action dims for {len(self.names)} names")
        bad = ~np.isfinite(a)
        if bad.any():
            joints = [self.names[j] for j in np.flatnonzero(bad.any(axis=0))]
            return LimitCheck(None, "non_finite", f"{int(bad.sum())} non-finite value(s) for {_join(joints)}")
        with self._lock:
            lo, hi, vel, missing = self._lo, self._hi, self._vel, self._missing
        if self.required and missing:
            return LimitCheck(None, "limits_missing", f"no limits known for {_join(missing)} (limits.required; "
                              "publish the URDF on robot_description or set limits.<joint>.* parameters)")
        dt_ns = dt_s * 1e9
        due = stamp_ns + (np.arange(h) + 1) * dt_ns
        ahead = np.flatnonzero(due > now_ns)
        k = int(ahead[0]) if ahead.size else h  # the first action still ahead of now
        # the present position bounds action k: reach = max_velocity * (its due time - the position's time)
        q = np.full(d, np.nan) if present is None else np.asarray(present, dtype=np.float64)
        span = np.zeros(d) if present_ns is None or k >= h else (due[min(k, h - 1)] - present_ns) / 1e9
        known = np.isfinite(q) & (span > 0) & (k < h)

        step = np.abs(np.diff(a, axis=0)) if h > 1 else np.zeros((0, d))
        jump = np.where(known, np.abs(a[min(k, h - 1)] - np.where(known, q, 0.0)), 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            use = np.maximum(step.max(axis=0, initial=0.0) / (vel * dt_s),
                             np.where(known, jump / (vel * np.where(known, span, 1.0)), 0.0))
            width = hi - lo
            margin = np.minimum((a - lo).min(axis=0), (hi - a).min(axis=0))
            margin = np.where(np.isfinite(width) & (width > 0), margin / np.where(width > 0, width, 1.0), margin)
        self._record(margin, use)

        tol = lambda limit: limit * (1 + _REL_TOL) + _ABS_TOL  # noqa: E731
        with np.errstate(invalid="ignore"):  # inf * 0 where a joint has no velocity limit and no present
            over_pos = (a < lo - _ABS_TOL - _REL_TOL * np.abs(lo)) | (a > hi + _ABS_TOL + _REL_TOL * np.abs(hi))
            over_step = step > tol(vel * dt_s)
            over_jump = known & (jump > tol(vel * np.where(known, span, 1.0)))
        if not (over_pos.any() or over_step.any() or over_jump.any()):
            return LimitCheck(np.asarray(actions))
        if self.policy == "reject":
            return self._rejection(a, over_pos, over_step, over_jump, q, lo, hi, vel, dt_s)
        return self._clamp(a, k, known, q, span, lo, hi, vel, dt_s, over_pos, over_step, over_jump,
                           np.asarray(actions).dtype)

    def _rejection(self, a, over_pos, over_step, over_jump, q, lo, hi, vel, dt_s) -> LimitCheck:
        if over_pos.any():
            j = int(np.flatnonzero(over_pos.any(axis=0))[0])
            x = a[over_pos[:, j], j]
            worst = float(x[np.argmax(np.maximum(lo[j] - x, x - hi[j]))])
            return LimitCheck(None, "position_limit", f"{_join(self._joints(over_pos))}: e.g. {self.names[j]} "
                              f"{worst:.4g} outside [{lo[j]:.4g}, {hi[j]:.4g}]")
        if over_jump.any():
            j = int(np.flatnonzero(over_jump)[0])
            return LimitCheck(None, "jump_from_present", f"{_join([self.names[i] for i in np.flatnonzero(over_jump)])}"
                              f": e.g. {self.names[j]} is at {q[j]:.4g}, the first action ahead asks for more than "
                              f"max_velocity {vel[j]:.4g} /s allows by its time")
        j = int(np.flatnonzero(over_step.any(axis=0))[0])
        fastest = float(np.abs(np.diff(a[:, j])).max() / dt_s)
        return LimitCheck(None, "velocity_limit", f"{_join(self._joints(over_step))}: e.g. {self.names[j]} at "
                          f"{fastest:.4g} /s > max_velocity {vel[j]:.4g}")

    def _clamp(self, a, k, known, q, span, lo, hi, vel, dt_s, over_pos, over_step, over_jump, dtype) -> LimitCheck:
        out = a.copy()
        for i in range(out.shape[0]):  # each action from the (clamped) previous one; action k from the present
            prev = out[i - 1] if i > 0 else np.full_like(q, np.nan)
            anchor, reach = prev, vel * dt_s
            if i == k:
                anchor, reach = np.where(known, q, prev), np.where(known, vel * np.where(known, span, 1.0), reach)
            free = np.isnan(anchor)
            out[i] = np.where(free, out[i], np.clip(out[i], np.where(free, 0.0, anchor - reach),
                                                    np.where(free, 0.0, anchor + reach)))
        out = np.clip(out, lo, hi)
        changed = np.abs(out - a) > _ABS_TOL + _REL_TOL * np.abs(a)
        joints = self._joints(changed)
        notes = []
        rules = (("position", over_pos.any(axis=0)), ("velocity", over_step.any(axis=0)), ("jump", over_jump))
        with self._lock:
            self.clamped_by_joint += changed.any(axis=0)
            for rule, hit in rules:
                for j in np.flatnonzero(hit):
                    key = (self.names[j], rule)
                    if key not in self._logged:
                        self._logged.add(key)
                        notes.append(f"clamping {self.names[j]} ({rule} limit: {self.limits[self.names[j]].describe()})"
                                     "; further clamps of this joint and rule are counted, not logged")
        return LimitCheck(out.astype(dtype), clamped=joints, notes=notes)

    def _joints(self, mask: np.ndarray) -> list[str]:
        return [self.names[j] for j in np.flatnonzero(mask.any(axis=0))]

    def _record(self, margin: np.ndarray, use: np.ndarray) -> None:
        with self._lock:
            np.minimum(self.margin, margin, out=self.margin)
            np.maximum(self.velocity_use, np.nan_to_num(use, nan=0.0, posinf=0.0), out=self.velocity_use)

    # ------------------------------------------------------------------------------------------ diagnostics
    def diagnostics(self) -> dict[str, object]:
        """Per action joint: its limits and source, the lowest position margin seen (a fraction of the range: 0 =
        at a limit, negative = beyond it before clamping; joint units when the range is one-sided), the highest
        velocity as a fraction of max_velocity (above 1 = over), and how many chunks clamped it."""
        with self._lock:
            values: dict[str, object] = {"limits.policy": self.policy, "limits.robot": self.robot or "none",
                                         "limits.missing": ", ".join(self._missing) or "none",
                                         **{f"limits.{k}_chunks": n for k, n in self.chunks.items()}}
            for j, name in enumerate(self.names):
                lim = self.limits[name]
                if lim.empty:
                    continue
                key = f"limits.{name}"
                values[key] = lim.describe()
                if lim.lower is not None or lim.upper is not None:
                    values[f"{key}.position_margin"] = "nan" if math.isinf(self.margin[j]) else f"{self.margin[j]:.3f}"
                if lim.max_velocity is not None:
                    values[f"{key}.velocity_use"] = f"{self.velocity_use[j]:.3f}"
                values[f"{key}.clamped"] = int(self.clamped_by_joint[j])
        return values


def _join(names: Sequence[str], most: int = 6) -> str:
    more = f" (+{len(names) - most} more)" if len(names) > most else ""
    return ", ".join(names[:most]) + more
