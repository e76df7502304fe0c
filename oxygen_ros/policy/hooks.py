"""The runner hook: the one way a test installs code around a frame (e.g. :mod:`oxygen_ros.testing.fault_injection`)
without any production module importing it.

When the environment variable ``OXYGEN_ROS_RUNNER_HOOK`` names a module, the node's configure and bag evaluation
import it and call its ``install(runner, model, log)``; unset (always, outside tests), nothing is imported.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["RUNNER_HOOK_ENV", "InstalledHook", "install_runner_hook"]

RUNNER_HOOK_ENV = "OXYGEN_ROS_RUNNER_HOOK"


class InstalledHook(Protocol):
    """What a hook module's ``install`` returns (or None when it installed nothing)."""

    def release(self) -> None: ...


def install_runner_hook(runner: Any, model: Any, log: Callable[[str], None]) -> InstalledHook | None:
    """Install the hook named by ``OXYGEN_ROS_RUNNER_HOOK`` on ``runner`` and ``model``; None when unset.

    Raises:
        ImportError: the named module does not exist.
        AttributeError: it has no ``install`` function.
    """
    name = os.environ.get(RUNNER_HOOK_ENV, "")
    if not name:
        return None
    module = importlib.import_module(name)
    return module.install(runner, model, log)
