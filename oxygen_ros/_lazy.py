"""Package-level names that load their module on first use (so ``from oxygen_ros.toy.sim import chunk_problem`` needs no
rclpy, and importing one evaluation tool does not load torch)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, where: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``where`` maps each exported name to its submodule."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{where[name]}"), name)

    def __dir__() -> list[str]:
        return sorted(set(importlib.import_module(package).__dict__) | set(where))

    return __getattr__, __dir__
