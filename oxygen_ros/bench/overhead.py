"""Fused vs eager stages side by side: prefill, the S-step denoise loop and decode steps per batch size.

Every repeat runs each variant once, alternating (A B A B ...), so a noisy host slows both alike; the speedup is
the median of the per-repeat ratios (and the ratio of the medians is kept beside it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from oxygen_ros.bench.observation import dummy_observation
from oxygen_ros.engine import KVCache, Pi05Model
from oxygen_ros.engine.timing import synchronize

VARIANTS = ("eager", "fused")


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> int:
    """ATen operations one call of ``fn`` dispatches (views and in-place writes included): the per-operation
    framework cost a stage pays whatever the host, which CUDA graphs or a compiler remove."""
    with _OpCounter() as counter:
        fn()
    return counter.count


def _time(fn: Callable[[], object], device: torch.device) -> float:
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


def side_by_side(model: Pi05Model, fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict:
    """Interleaved timing of ``fns`` (variant -> call) on ``model``, each run with ``model.fused`` set to match."""
    times: dict[str, list[float]] = {v: [] for v in fns}
    for rep in range(warmup + repeats):
        for v, fn in fns.items():
            model.use_fused(v == "fused")
            t = _time(fn, model.device)
            if rep >= warmup:
                times[v].append(t)
    out = {f"{v}_s": statistics.median(ts) for v, ts in times.items()}
    for v, fn in fns.items():
        model.use_fused(v == "fused")
        out[f"{v}_ops"] = count_ops(fn)
    model.use_fused(True)
    out["speedup"] = statistics.median(e / f for e, f in zip(times["eager"], times["fused"], strict=True))
    out["ratio_of_medians"] = out["eager_s"] / out["fused_s"]
    out["samples"] = {v: ts for v, ts in times.items()}
    return out


def stage_overhead(model: Pi05Model, batches: list[int], repeats: int = 7, decode_context: int = 30,
                   prompt_len: int | None = None) -> dict:
    """Fused vs eager per stage: ``{"prefill": .., "denoise": .., "decode_B<b>": ..}`` from :func:`side_by_side`."""
    cfg, dev = model.config, model.device
    obs = dummy_observation(model, 1, prompt_len)
    max_b = max(batches)
    cache = KVCache.for_model(cfg, max_b, extra_tokens=decode_context + 1, dtype=model.dtype, device=dev)
    rows = slice(0, 1)
    res = {"prefill": side_by_side(model, {v: lambda: model.prefill(obs, cache, rows) for v in VARIANTS}, repeats)}
    prefix = model.prefill(obs, cache, rows)
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, device=dev)
    res["denoise"] = side_by_side(model, {v: lambda: model.denoise(prefix, cache, noise) for v in VARIANTS}, repeats)
    cache.k[:, 1:max_b] = cache.k[:, :1]
    cache.v[:, 1:max_b] = cache.v[:, :1]
    cache.valid[1:max_b] = cache.valid[:1]
    cache.valid[:, prefix.length:prefix.length + decode_context] = True
    for b in batches:
        idx = torch.full((b,), prefix.length + decode_context, device=dev)
        pos = prefix.num_valid.expand(b) + decode_context
        tokens = torch.full((b,), 5, device=dev)

        def step(b: int = b, idx: torch.Tensor = idx, pos: torch.Tensor = pos, tokens: torch.Tensor = tokens):
            return model.decode_step(cache, slice(0, b), tokens, pos, idx, prefix.length + decode_context + 1)

        res[f"decode_B{b}"] = side_by_side(model, {v: step for v in VARIANTS}, repeats)
    return res
