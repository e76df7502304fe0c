"""Wall-clock timing that is correct on CUDA (synchronises) and cheap on CPU."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


class Stopwatch:
    """``with sw("denoise"): ...`` accumulates seconds per stage name.

    Nested stages are exclusive: time spent in an inner stage is not counted in the outer one, so the stage
    times of a frame add up to (at most) its wall time.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = device
        self.times: dict[str, float] = {}
        self._next = ""
        self._stack: list[list] = []  # [name, start, time spent in children]

    def __call__(self, name: str) -> Stopwatch:
        self._next = name
        return self

    def __enter__(self) -> Stopwatch:
        synchronize(self.device)
        self._stack.append([self._next, time.perf_counter(), 0.0])
        return self

    def __exit__(self, *exc) -> None:
        synchronize(self.device)
        name, start, children = self._stack.pop()
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
