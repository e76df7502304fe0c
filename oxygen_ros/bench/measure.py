"""Measuring one sweep point: the engine and workload it describes, its deadline, and the run (or stage profile)."""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from oxygen_ros.bench.cost_model import denoise_at
from oxygen_ros.bench.model_pool import ModelPool
from oxygen_ros.bench.observation import benchmark_prompt_len
from oxygen_ros.bench.points import Point
from oxygen_ros.bench.profile import profile_stages
from oxygen_ros.bench.runner import pool_size, run_point, warmup_frames
from oxygen_ros.engine.engine import EngineConfig
from oxygen_ros.engine.requests import FrameResult
from oxygen_ros.study.workload import Workload

PROFILE_BATCHES = (1, 2, 4, 6, 8, 16, 32)


def make_workload(p: Point) -> Workload:
    """The runner's workload for a point ("none": no language request at all)."""
    if p.workload == "none":
        return Workload(kind="burst", burst_size=0, max_new_tokens=p.N, seed=p.seed)
    if p.workload == "random_length":
        return Workload(kind="random_length", max_new_tokens=p.N, min_tokens=p.min_tokens, max_tokens=p.N,
                        seed=p.seed)
    return Workload(kind=p.workload, max_new_tokens=p.N, period=p.period, burst_size=p.burst, rate=p.rate,
                    seed=p.seed)


def inflight_bound(p: Point) -> int:
    """Pool size for oxygen: runner.pool_size for one request per frame, widened for faster or bursty arrivals."""
    if p.engine != "oxygen" or p.N == 0:
        return 1
    k = p.k if p.k is not None else 1
    steady = math.ceil(p.N / k) if isinstance(k, int) else p.N
    rate = {"every_n": 1 / p.period, "poisson": p.rate, "burst": p.burst / max(p.period, 1)}.get(p.workload, 1.0)
    extra = p.burst + math.ceil(max(rate - 1, 0) * steady)
    if p.workload == "poisson":
        extra += math.ceil(3 * math.sqrt(rate * steady))  # three standard deviations of the in-flight count
    return pool_size(p.N, k, extra)


def engine_config(p: Point, deadline_s: float | None = None) -> EngineConfig:
    """The engine configuration a point measures."""
    return EngineConfig(mode=p.engine, num_steps=p.S, k=p.k if p.k is not None else 1, deadline_s=deadline_s,
                        eos_id=-1, max_new_tokens=max(p.N, 1), max_inflight=inflight_bound(p))


def units(p: Point) -> int:
    """Progress-bar units of a point: its frames including warm-up (profile: its repeats)."""
    if p.engine == "profile":
        return p.frames
    return warmup_frames(engine_config(p), make_workload(p)) + p.frames


@contextmanager
def cuda_peak(device: torch.device, into: dict) -> Iterator[None]:
    """On CUDA, ``into["cuda_peak_bytes"]``: torch.cuda.max_memory_allocated over the block (model included)."""
    cuda = device.type == "cuda"
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        into["cuda_resident_bytes"] = torch.cuda.memory_allocated(device)
    yield
    if cuda:
        into["cuda_peak_bytes"] = torch.cuda.max_memory_allocated(device)


def deadline_seconds(p: Point, profile: dict | None) -> float | None:
    """``"120ms"`` as is; ``"1.3x"``: that factor of the profiled prefill + denoise (at the point's S)."""
    if not p.deadline:
        return None
    if p.deadline.endswith("ms"):
        return float(p.deadline[:-2]) / 1e3
    if profile is None:
        raise RuntimeError(f"{p.id}: a relative deadline needs the model's profile point")
    return float(p.deadline[:-1]) * (profile["prefill_s"] + denoise_at(profile, p.S))


def measure_profile(p: Point, pool: ModelPool, tick: Callable[[], None]) -> dict:
    """A profile point: the stage costs of its model (``p.frames`` repeats per stage)."""
    model, _ = pool.get(p)
    prof = profile_stages(model, list(PROFILE_BATCHES), repeats=p.frames, prompt_len=benchmark_prompt_len(model))
    for _ in range(p.frames):
        tick()
    return {"profile": {**prof, "num_steps": model.config.num_steps}}


def measure(p: Point, pool: ModelPool, profile: dict | None, tick: Callable[[], None]) -> dict:
    """Run one point; returns its measurements (run_point's record, or the stage profile).

    ``profile``: the stage profile of the point's model (relative deadlines); ``tick`` is called once per frame
    (warm-up included) or profile repeat. The auto suite's points also record a per-frame trace."""
    if p.engine == "profile":
        return measure_profile(p, pool, tick)
    model, extra = pool.get(p)
    deadline = deadline_seconds(p, profile)
    extras: dict = {"deadline_ms": 1e3 * deadline if deadline else None}
    trace: dict[str, list] | None = {} if p.suite == "auto" else None

    def on_frame(res: FrameResult) -> None:
        tick()
        if trace is not None:  # per-frame record (warm-up included) for the k=auto plot
            for name, value in (("frame_ms", round(1e3 * res.timings["frame"], 3)), ("backlog", res.inflight),
                                ("decode_steps", res.decode_steps)):
                trace.setdefault(name, []).append(value)

    with cuda_peak(pool.device, extras):
        rec = run_point(model, engine_config(p, deadline), make_workload(p), p.frames, p.seed, heads=extra,
                        on_frame=on_frame)
    if trace is not None:
        extras["trace"] = {**trace, "warmup": len(trace["frame_ms"]) - p.frames}
    return {**rec, **extras, "k": p.k}

