"""Parameters declared once, as dataclass fields (:func:`param`), and read from plain mappings (a YAML file's
``ros__parameters``, the values a ROS node got): :class:`ParamSpec` (name, type, default, help, one-field checks),
:func:`specs_of` (a dataclass's specs), :func:`read_specs` (coerce and check values, every problem at once) and
:class:`ParamError`. Types: bool, int, float, str, ``'str[]'`` and ``'bool[]'`` (tuples in Python, lists in ROS).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MISSING", "ParamError", "ParamSpec", "declared", "lookup", "markdown_table", "param", "read_specs",
           "specs_of"]

MISSING: Any = object()  # a value that is not in the mapping
_KINDS = {"bool": bool, "int": int, "float": float, "str": str, "tuple[str, ...]": "str[]",
          "tuple[bool, ...]": "bool[]"}


class ParamError(ValueError):
    """Invalid parameters; ``problems`` lists one message per offending parameter."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid parameters:\n  - " + "\n  - ".join(self.problems))


@dataclass(frozen=True)
class ParamSpec:
    """One declared parameter. ``kind`` is bool, int, float, str, 'str[]' or 'bool[]'; ``attr`` is the dataclass
    field ('' = ``name``); ``int_ok``: a str parameter that also takes a whole number (``rtc.delay: 3``)."""

    name: str
    kind: Any
    default: Any
    description: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    positive: bool = False
    attr: str = ""
    int_ok: bool = False

    @property
    def type_name(self) -> str:
        return self.kind if isinstance(self.kind, str) else self.kind.__name__

    @property
    def ros_default(self) -> Any:
        """The default as ROS declares it (lists, not tuples)."""
        return list(self.default) if isinstance(self.default, tuple) else self.default

    def coerce(self, value: Any) -> tuple[Any, str | None]:
        """(value converted to this type, None) or (None, the problem)."""
        kind, name = self.kind, self.name
        got = f"got {type(value).__name__} {value!r}"[:160]
        if kind is bool:
            return (value, None) if isinstance(value, bool) else (None, f"{name}: expected true/false, {got}")
        if kind is int:
            if isinstance(value, bool):
                return None, f"{name}: expected an integer, {got}"
            if isinstance(value, int):
                return value, None
            if isinstance(value, float) and value.is_integer():
                return int(value), None
            return None, f"{name}: expected an integer, {got}"
        if kind is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value), None
            return None, f"{name}: expected a number, {got}"
        if kind is str:
            if self.int_ok and isinstance(value, int) and not isinstance(value, bool):
                return str(value), None
            return (value, None) if isinstance(value, str) else (None, f"{name}: expected a string, {got}")
        item = str if kind == "str[]" else bool
        if value is None:  # a YAML `[]` has no element type: rclpy hands it over unset (None)
            return (), None
        if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
            items = list(value.tolist() if hasattr(value, "tolist") else value)
            if all(isinstance(v, item) for v in items):
                return tuple(items), None
        what = "strings" if item is str else "booleans"
        return None, f"{name}: expected a list of {what}, {got}"

    def field_problem(self, value: Any) -> str | None:
        """The one-field checks (choices, minimum, positive) of an already coerced value."""
        if self.choices is not None and value not in self.choices:
            return f"{self.name}: must be one of {', '.join(self.choices)}; got {value!r}"
        if self.minimum is not None and value < self.minimum:
            return f"{self.name}: must be >= {self.minimum}; got {value}"
        if self.positive and not value > 0:
            return f"{self.name}: must be > 0; got {value}"
        return None

    def check(self, value: Any) -> tuple[Any, str | None]:
        """(the value as this type, None) or (None, the problem): :meth:`coerce`, then :meth:`field_problem`."""
        value, problem = self.coerce(value)
        problem = problem or self.field_problem(value)
        return (None, problem) if problem else (value, None)


def param(default: Any, help: str, *, choices: tuple[str, ...] | None = None, minimum: float | None = None,
          positive: bool = False, ros_name: str | None = None, int_ok: bool = False) -> Any:
    """A parameter field: default, help text and the checks that apply to it alone. ``ros_name``: the ROS name when
    it is not the field's (a group's ``<group>.<name>``, e.g. ``ask.*``)."""
    return field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum,
                                            "positive": positive, "ros_name": ros_name, "int_ok": int_ok})


def declared(spec: ParamSpec) -> Any:
    """A dataclass field for an already declared :class:`ParamSpec`: :func:`specs_of` returns that very object, so a
    parameter two dataclasses share is declared once (:mod:`oxygen_ros.params.robot`)."""
    return field(default=spec.default, metadata={
        "help": spec.description, "choices": spec.choices, "minimum": spec.minimum, "positive": spec.positive,
        "ros_name": spec.name if spec.name != spec.attr else None, "int_ok": spec.int_ok, "spec": spec})


def spec_of(f: dataclasses.Field) -> ParamSpec:
    """The :class:`ParamSpec` of a field declared with :func:`param` or :func:`declared`."""
    if "spec" in f.metadata:
        return f.metadata["spec"]
    m = f.metadata
    return ParamSpec(m.get("ros_name") or f.name, _KINDS[str(f.type)], f.default, m["help"], m.get("choices"),
                     m.get("minimum"), bool(m.get("positive")), attr=f.name, int_ok=bool(m.get("int_ok")))


def specs_of(cls: type, skip: Iterable[str] = ()) -> tuple[ParamSpec, ...]:
    """The specs of a parameter dataclass, in field order (``skip``: fields that are not parameters)."""
    skipped = set(skip)
    return tuple(spec_of(f) for f in dataclasses.fields(cls) if f.name not in skipped)


def lookup(values: Mapping[str, Any], name: str) -> Any:
    """``values[name]``; a group's ``<group>.<field>`` from ROS's flat name or a YAML file's nested mapping
    (``<group>: {<field>: ...}``); :data:`MISSING` when absent."""
    if name in values:
        return values[name]
    if "." not in name:
        return MISSING
    group, rest = name.split(".", 1)
    nested = values.get(group)
    return nested.get(rest, MISSING) if isinstance(nested, Mapping) else MISSING


def read_specs(specs: Iterable[ParamSpec], values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Each spec's value from ``values`` (missing: its default), coerced and checked: ({attr: value}, problems).
    A value with a problem is replaced by its default (so cross-parameter rules can still run)."""
    out: dict[str, Any] = {}
    problems: list[str] = []
    for spec in specs:
        raw = lookup(values, spec.name)
        value, problem = spec.check(spec.default if raw is MISSING else raw)
        if problem:
            problems.append(problem)
            value = spec.default
        out[spec.attr or spec.name] = value
    return out, problems


def markdown_table(specs: Iterable[ParamSpec]) -> str:
    """A Markdown table of ``specs`` (name, type, default, description)."""
    rows = ["| name | type | default | description |", "|---|---|---|---|"]
    for s in specs:
        default = repr(s.default) if isinstance(s.default, str) else str(s.default).lower() \
            if isinstance(s.default, bool) else str(list(s.default)) if isinstance(s.default, tuple) \
            else str(s.default)
        # a bare | would split the table cell; a bare <name> would be read as an HTML tag
        description = s.description.replace("|", "\\|").replace("<", "&lt;")
        rows.append(f"| `{s.name}` | {s.type_name} | `{default}` | {description} |")
    return "\n".join(rows)
