"""Parameters as command-line flags: ``checkpoint_path`` is ``--checkpoint-path``, a bool is ``--x / --no-x``, a
list takes several values; numbers are converted and checked (minimum, positive) by :func:`arg_type`."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .schema import ParamSpec

__all__ = ["add_arguments", "arg_type", "flag"]


def flag(spec: ParamSpec) -> str:
    """The flag of a parameter: ``--`` + its field name, ``_`` as ``-``."""
    return "--" + (spec.attr or spec.name).replace("_", "-")


def arg_type(spec: ParamSpec) -> Any:
    """An argparse ``type`` converting text to the spec's scalar type and applying its minimum / positive checks."""
    convert = {int: int, float: float, str: str}[spec.kind]

    def parse(text: str) -> Any:
        value = convert(text)
        if spec.minimum is not None and value < spec.minimum or spec.positive and not value > 0:
            raise argparse.ArgumentTypeError(f"must be {'> 0' if spec.positive else f'>= {spec.minimum}'}; "
                                             f"got {value}")
        return value

    parse.__name__ = spec.type_name
    return parse


def add_arguments(group: Any, specs: Iterable[ParamSpec], *, aliases: Mapping[str, Sequence[str]] | None = None,
                  choices: Mapping[str, Sequence[str]] | None = None) -> None:
    """One flag per spec on ``group`` (a parser or argument group), ``dest`` the field name. ``aliases``: extra
    flags per field; ``choices``: choices that replace a field's own."""
    aliases, choices = aliases or {}, choices or {}
    for spec in specs:
        dest = spec.attr or spec.name
        names = [flag(spec), *aliases.get(dest, ())]
        help_text = spec.description.replace("%", "%%")
        if spec.kind is bool:
            group.add_argument(*names, dest=dest, action=argparse.BooleanOptionalAction, default=spec.default,
                               help=help_text)
        elif isinstance(spec.kind, str):  # lists
            group.add_argument(*names, dest=dest, nargs="*", default=list(spec.default), help=help_text)
        else:
            group.add_argument(*names, dest=dest, type=arg_type(spec), choices=choices.get(dest, spec.choices),
                               default=spec.default, help=help_text)
