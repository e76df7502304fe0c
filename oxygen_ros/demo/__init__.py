"""The embedded demo over ROS 2 (``python -m oxygen_ros.demo``, ``make demo``): the oxygen node as a child process
drives the tabletop simulator (:mod:`oxygen_ros.sim`) while a probe records and scores what it publishes.
:mod:`.run` (the loop, summary, ``main``), :mod:`.scenes` (tabletop / synthetic), :mod:`.config` (finding the
presets in a checkout or an install; ROS-free). The names below load their module on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {"DemoSummary": "run", "main": "run", "print_summary": "run", "run_demo": "run",
            "config_dirs": "config", "find_config": "config"}

__all__ = sorted(_MODULES)


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULES[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULES))
