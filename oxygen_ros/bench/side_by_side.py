"""oxygen-bench's measurement: engines side by side on one model and workload, with that model's stage profile.

The measured frames of all points are interleaved round-robin after each point's warm-up (the ``parallel``
baseline runs alone afterwards); the profiled stage costs predict each engine's frame time (``cost_model``).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import torch
from torch import nn

from oxygen_ros.bench.models import dtype_name
from oxygen_ros.bench.observation import benchmark_prompt_len
from oxygen_ros.bench.profile import profile_stages
from oxygen_ros.bench.progress import progress_bar
from oxygen_ros.bench.report import add_derived
from oxygen_ros.bench.runner import machine_info, pool_size, run_interleaved, run_point, warmup_frames
from oxygen_ros.engine import Pi05Model
from oxygen_ros.engine.engine import EngineConfig
from oxygen_ros.study.workload import Workload

Plan = list[tuple[EngineConfig, Workload]]


def make_plan(ns: list[int], engines: list[str], ks: list[int | str], num_steps: int, template: Workload,
              deadline_s: float | None = None) -> Plan:
    """One point per N x engine (x k for oxygen; the other engines take the first k), in that order.

    ``template`` is the workload with every field but ``max_new_tokens``, which each point sets to its N."""
    plan = []
    for n in ns:
        for mode in engines:
            for k in ks if mode == "oxygen" else [ks[0]]:
                ec = EngineConfig(mode=mode, num_steps=num_steps, k=k, deadline_s=deadline_s, eos_id=-1,
                                  max_new_tokens=max(ns), max_inflight=pool_size(n, k, template.burst_size))
                plan.append((ec, replace(template, max_new_tokens=n)))
    return plan


def profile_batches(ns: list[int], ks: list[int | str]) -> list[int]:
    """Decode batch sizes to profile: powers of two up to 32 and the largest in-flight batch of the plan."""
    max_batch = max(max(math.ceil(n / k) if isinstance(k, int) else n for n in ns for k in ks), 2)
    return sorted({1, 2, 4, 8, 16, 32, max_batch})


def measure_plan(model: Pi05Model, plan: Plan, frames: int, seed: int = 0,
                 heads: nn.ModuleList | None = None) -> list[dict]:
    """Every point's record, in plan order: the parallel points alone after the others, interleaved."""
    total_frames = sum(warmup_frames(ec, wl) + frames for ec, wl in plan)
    with progress_bar(total=total_frames, desc="benchmark frames (interleaved)") as bar:
        tick = lambda _: bar.update(1)  # noqa: E731
        # the parallel baseline's worker thread leaves its own OpenMP team spinning after each frame, which would
        # slow whichever engine runs next: it is measured on its own, after the interleaved points
        shared = [(ec, wl) for ec, wl in plan if ec.mode != "parallel"]
        alone = [(ec, wl) for ec, wl in plan if ec.mode == "parallel"]
        records = run_interleaved(model, shared, frames, seed, heads=heads, on_frame=tick)
        records += [run_point(model, ec, wl, frames, seed, heads=heads, on_frame=tick) for ec, wl in alone]
        order = [id(ec) for ec, _ in shared + alone]
        return [records[order.index(id(ec))] for ec, _ in plan]


def run_bench(model: Pi05Model, plan: Plan, frames: int, *, device: torch.device, preset: str, onednn: bool,
              batches: list[int], seed: int = 0, heads: nn.ModuleList | None = None) -> dict:
    """Profile the model's stages, measure the plan, derive predictions and ratios: the ``results.json`` dict."""
    profile = profile_stages(model, batches, repeats=5, prompt_len=benchmark_prompt_len(model))
    points = measure_plan(model, plan, frames, seed, heads)
    add_derived(points, profile)
    cfg = model.config
    return {
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine_info(device),
        "config": {"model": cfg.name, "preset": preset, "parameters": model.num_parameters(),
                   "dtype": dtype_name(model.dtype), "onednn_linear": onednn, "S": cfg.num_steps,
                   "H": cfg.action_horizon, "workload": plan[0][1].kind, "frames": frames},
        "profile": profile,
        "points": points,
    }
