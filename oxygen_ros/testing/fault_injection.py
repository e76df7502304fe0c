"""TEST-ONLY fault injection: makes the node's model raise, produce NaN actions or hang inside a frame, so that the
node's fault handling can be tested over real DDS (``test/test_safety.py``).

No production module imports it: a test installs it through the runner hook (:mod:`oxygen_ros.policy.hooks`), by
setting the environment of the node's process to :func:`fault_env` (``OXYGEN_ROS_RUNNER_HOOK`` naming this module
and ``OXYGEN_ROS_FAULT_INJECTION`` the program; no parameter can turn it on). The node then logs a warning at
configure.

The value is a program of comma-separated phases, run frame by frame (a frame = one ``FrameRunner.step``):

    pass:N       N frames run normally
    raise:N      N frames raise RuntimeError inside the action expert's forward (mid-frame, as a driver error would)
    nan:N        N frames' action expert outputs are NaN (the chunk is NaN)
    hang:N[:S]   N frames block inside the action expert's forward for S seconds (default: for ever)

N is a count or ``*`` (every frame from there on); after the last phase frames run normally. Or ``@/path/file``:
the program is read from that file, and restarted whenever the file's content changes (a test injects a fault at
the moment it wants). The program's position survives a reconfigure (one injector per process).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from oxygen_ros.policy.hooks import RUNNER_HOOK_ENV

__all__ = ["FAULT_INJECTION_ENV", "FaultInjector", "Phase", "fault_env", "install", "parse_program"]

FAULT_INJECTION_ENV = "OXYGEN_ROS_FAULT_INJECTION"
KINDS = ("pass", "raise", "nan", "hang")


@dataclass
class Phase:
    kind: str
    frames: float  # math.inf = every frame
    seconds: float = math.inf  # hang only


def parse_program(text: str) -> list[Phase]:
    """The phases of a program (see the module docstring).

    Raises:
        ValueError: an unknown kind or a malformed count.
    """
    phases = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        kind, *rest = part.split(":")
        if kind not in KINDS or len(rest) > (2 if kind == "hang" else 1):
            raise ValueError(f"{FAULT_INJECTION_ENV}: bad phase {part!r} (pass|raise|nan:N, hang:N[:S])")
        frames = math.inf if not rest or rest[0] == "*" else int(rest[0])
        seconds = float(rest[1]) if len(rest) > 1 else math.inf
        phases.append(Phase(kind, frames, seconds))
    return phases


class FaultInjector:
    """Runs a program (or the one in a file) over the frames of a runner whose model it hooks."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._file = Path(spec[1:]) if spec.startswith("@") else None
        self._file_text: str | None = None
        self._phases = [] if self._file else parse_program(spec)
        self._lock = threading.Lock()
        self._current = "pass"
        self._seconds = math.inf
        self._fired = False
        self.frames = 0
        self._released = threading.Event()
        self._hook: Any = None

    def _next(self) -> tuple[str, float]:
        """This frame's action (advancing the program)."""
        if self._file is not None:
            try:
                text = self._file.read_text()
            except OSError:
                text = ""
            if text != self._file_text:
                self._file_text, self._phases = text, parse_program(text)
        while self._phases and self._phases[0].frames <= 0:
            self._phases.pop(0)
        if not self._phases:
            return "pass", math.inf
        phase = self._phases[0]
        phase.frames -= 1
        return phase.kind, phase.seconds

    def install(self, runner: Any, model: torch.nn.Module) -> None:
        """Wrap ``runner.step`` (chooses each frame's action) and hook the model's action output projection (acts
        on it). Call again after a reconfigure: the program continues."""
        step = runner.step

        def injected_step(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self._current, self._seconds = self._next()
                self._fired = False
                self.frames += 1
            return step(*args, **kwargs)

        runner.step = injected_step
        self._hook = model.action_out_proj.register_forward_hook(self._on_forward)

    def _on_forward(self, module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor | None:
        with self._lock:
            kind, seconds, first = self._current, self._seconds, not self._fired
            self._fired = True
        if kind == "raise" and first:
            raise RuntimeError(f"injected fault ({FAULT_INJECTION_ENV}), frame {self.frames}")
        if kind == "nan":
            return torch.full_like(output, float("nan"))
        if kind == "hang" and first:
            self._released.wait(None if math.isinf(seconds) else seconds)
        return None

    def release(self) -> None:
        """End any hang and unhook the model."""
        self._released.set()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


_INJECTOR: FaultInjector | None = None


def fault_env(program: str) -> dict[str, str]:
    """The environment that installs the injector running ``program`` (a program or ``@/path/file``)."""
    return {RUNNER_HOOK_ENV: __name__, FAULT_INJECTION_ENV: program}


def install(runner: Any, model: torch.nn.Module, log: Callable[[str], None]) -> FaultInjector | None:
    """The runner hook: install the process's injector when ``OXYGEN_ROS_FAULT_INJECTION`` is set (logging a
    warning); else None."""
    global _INJECTOR
    spec = os.environ.get(FAULT_INJECTION_ENV, "")
    if not spec:
        return None
    if _INJECTOR is None or _INJECTOR.spec != spec:
        _INJECTOR = FaultInjector(spec)
    _INJECTOR._released.clear()
    _INJECTOR.install(runner, model)
    log(f"TEST-ONLY fault injection is active ({FAULT_INJECTION_ENV}={spec!r}): frames will fail on purpose")
    return _INJECTOR
