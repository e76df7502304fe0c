"""A joint's limits (:class:`JointLimit`) and the ``limits.<joint>.min``, ``.max``, ``.max_velocity``,
``.max_acceleration`` parameters: parsing them (the node's and the chunk executor's, the same scheme) and laying them
over a URDF's limits (:mod:`.urdf`; parameters win, field by field). ``.max_acceleration`` (parameters only: a URDF
has none) bounds the chunk executor's setpoint stream (:mod:`oxygen_ros.executor.setpoint_limits`); the chunk check
(:mod:`.limiter`) does not use it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["LIMIT_FIELDS", "LIMIT_POLICIES", "JointLimit", "joint_limit_names", "merge_limits",
           "parse_limit_parameters"]


@dataclass(frozen=True)
class JointLimit:
    """One joint's limits; None = no such limit. ``source`` says where each came from (urdf, param)."""

    lower: float | None = None
    upper: float | None = None
    max_velocity: float | None = None
    source: str = ""
    max_acceleration: float | None = None  # limits.<joint>.max_acceleration only (URDF has none)

    @property
    def empty(self) -> bool:
        return self.lower is None and self.upper is None and self.max_velocity is None \
            and self.max_acceleration is None

    def describe(self) -> str:
        """e.g. ``[-1.5, 1.5], 2 /s (urdf)`` (``, 4 /s^2`` with an acceleration limit)."""
        lo = "-inf" if self.lower is None else f"{self.lower:g}"
        hi = "inf" if self.upper is None else f"{self.upper:g}"
        vel = "no velocity limit" if self.max_velocity is None else f"{self.max_velocity:g} /s"
        acc = "" if self.max_acceleration is None else f", {self.max_acceleration:g} /s^2"
        return f"[{lo}, {hi}], {vel}{acc} ({self.source or 'none'})"


def merge_limits(urdf: Mapping[str, JointLimit], overrides: Mapping[str, Mapping[str, float]]) -> dict[str, JointLimit]:
    """URDF limits with the ``limits.<joint>.<field>`` parameters applied on top (each given field wins)."""
    out = dict(urdf)
    for joint, fields in overrides.items():
        base = out.get(joint, JointLimit())
        changes = {{"min": "lower", "max": "upper"}.get(k, k): float(v) for k, v in fields.items()}
        if not changes:
            continue
        source = "param" if base.empty else f"{base.source}+param" if "param" not in base.source else base.source
        out[joint] = replace(base, **changes, source=source)
    return out


LIMIT_FIELDS = ("min", "max", "max_velocity", "max_acceleration")  # limits.<joint>.<field>
LIMIT_POLICIES = ("clamp", "reject")  # limits.policy: what the chunk check (:mod:`.limiter`) does


def joint_limit_names(values: Mapping[str, Any]) -> list[str]:
    """The ``limits.<joint>.<field>`` names among ``values`` (flat ROS names; fields unchecked)."""
    return [k for k in values if k.startswith("limits.") and k.count(".") >= 2]


def parse_limit_parameters(values: Mapping[str, Any]) -> tuple[dict[str, dict[str, float]], list[str]]:
    """``{joint: {field: value}}`` from the ``limits.<joint>.<field>`` values (ROS's flat names, or a YAML file's
    nested ``limits: {<joint>: {<field>: value}}``), and the problems found. The node's parameters and the chunk
    executor's (the same scheme)."""
    raw: dict[tuple[str, str], Any] = {}
    for name in joint_limit_names(values):
        joint, field_name = name[len("limits."):].rsplit(".", 1)
        raw[(joint, field_name)] = values[name]
    nested = values.get("limits")
    if isinstance(nested, Mapping):
        for joint, fields in nested.items():
            if isinstance(fields, Mapping):
                raw.update({(str(joint), str(k)): v for k, v in fields.items()})
    out: dict[str, dict[str, float]] = {}
    problems = []
    for (joint, field_name), value in raw.items():
        name = f"limits.{joint}.{field_name}"
        if field_name not in LIMIT_FIELDS:
            problems.append(f"{name}: unknown field (limits.<joint>.min, .max, .max_velocity or .max_acceleration)")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            problems.append(f"{name}: expected a finite number, got {type(value).__name__} {value!r}"[:200])
        elif field_name in ("max_velocity", "max_acceleration") and not value > 0:
            problems.append(f"{name}: must be > 0; got {value}")
        else:
            out.setdefault(joint, {})[field_name] = float(value)
    for joint, fields in out.items():
        if "min" in fields and "max" in fields and fields["min"] > fields["max"]:
            problems.append(f"limits.{joint}.min: {fields['min']} > limits.{joint}.max {fields['max']}")
    return out, problems
