"""The one paired timer every A/B benchmark uses: each round runs every variant once, in turn, the order reversed
every other round (a variant run right after another's different memory and kernel footprint pays for it, so each
gets both places), so a noisy host slows all alike; a comparison is the median of the per-round ratios."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from oxygen_ros.bench.progress import progress_bar
from oxygen_ros.engine.timing import synchronize


def timed(fn: Callable[[], object], device: torch.device | None = None) -> float:
    """Seconds one call of ``fn`` takes (the device synchronized before and after)."""
    if device is not None:
        synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device is not None:
        synchronize(device)
    return time.perf_counter() - t0


def paired(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 1, device: torch.device | None = None,
           alternate: bool = True, before: Callable[[str], None] | None = None,
           after_round: Callable[[], None] | None = None, desc: str | None = None) -> dict[str, list[float]]:
    """Seconds of every variant in each of ``rounds`` measured rounds (after ``warmup`` rounds). ``alternate``:
    the order reversed every other round; ``before(variant)`` runs untimed before each call, ``after_round()``
    after each measured round; ``desc``: a progress bar."""
    times: dict[str, list[float]] = {v: [] for v in fns}
    with progress_bar(total=warmup + rounds, desc=desc or "", disable=desc is None) as bar:
        for rep in range(warmup + rounds):
            for v in list(fns)[::-1] if alternate and rep % 2 else list(fns):
                if before is not None:
                    before(v)
                t = timed(fns[v], device)
                if rep >= warmup:
                    times[v].append(t)
            if rep >= warmup and after_round is not None:
                after_round()
            bar.update()
    return times


def ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """The median of the per-round ratios a / b."""
    return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))


def medians_ms(times: dict[str, list[float]]) -> dict[str, float]:
    """Every variant's median, in milliseconds."""
    return {v: 1e3 * statistics.median(ts) for v, ts in times.items()}
