"""Wall-clock timing that is correct on CUDA (synchronises) and cheap on CPU."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


class Stopwatch:
    """``with sw("denoise"): ...`` accumulates seconds per stage name."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = device
        self.times: dict[str, float] = {}
        self._name = ""
        self._t0 = 0.0

    def __call__(self, name: str) -> Stopwatch:
        self._name = name
        return self

    def __enter__(self) -> Stopwatch:
        synchronize(self.device)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        synchronize(self.device)
        self.times[self._name] = self.times.get(self._name, 0.0) + time.perf_counter() - self._t0


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
