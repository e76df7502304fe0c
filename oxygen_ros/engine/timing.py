"""Wall-clock timing that is correct on CUDA (synchronises) and cheap on CPU."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def synchronize(device: torch.device | str) -> None:
    """Wait for ``device``'s work (CUDA: that device's, not the thread's current device; elsewhere nothing)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """``with sw("denoise"): ...`` accumulates seconds per stage name.

    Nested stages are exclusive: time spent in an inner stage is not counted in the outer one, so the stage
    times of a frame add up to (at most) its wall time. ``sw("manager", sync=False)``: a host-only stage does not
    synchronise the device on entry and exit (its time then excludes nothing the device still runs: the next
    synchronising stage counts that).
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = device
        self.times: dict[str, float] = {}
        self._next, self._sync = "", True
        self._stack: list[list] = []  # [name, start, time spent in children, sync]

    def __call__(self, name: str, sync: bool = True) -> Stopwatch:
        self._next, self._sync = name, sync
        return self

    def __enter__(self) -> Stopwatch:
        if self._sync:
            synchronize(self.device)
        self._stack.append([self._next, time.perf_counter(), 0.0, self._sync])
        return self

    def __exit__(self, *exc) -> None:
        name, start, children, sync = self._stack.pop()
        if sync:
            synchronize(self.device)
        elapsed = time.perf_counter() - start
        self.times[name] = self.times.get(name, 0.0) + elapsed - children
        if self._stack:
            self._stack[-1][2] += elapsed


def median_time(fn: Callable[[], object], repeats: int, device: torch.device | str = "cpu", warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]
