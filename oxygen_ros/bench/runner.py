"""Run benchmark points (engine x workload) and compute the paper's metrics; oxygen-bench's plan of engines side by
side on one model (measured frames interleaved round-robin after each point's warm-up, the ``parallel`` baseline
alone afterwards), with that model's stage profile predicting each engine's frame time (``cost_model``)."""

from __future__ import annotations

import math
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import torch
from torch import nn

from oxygen_ros.bench.models import dtype_name
from oxygen_ros.bench.observation import benchmark_prompt_len, dummy_observation
from oxygen_ros.bench.profile import profile_stages
from oxygen_ros.bench.progress import progress_bar
from oxygen_ros.bench.report import add_derived
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.model import Pi05Model
from oxygen_ros.engine.requests import Frame, FrameResult
from oxygen_ros.study.workload import Workload

STAGES = ("prefill", "language_prefill", "denoise", "decode", "manager", "frame")
STALL_FACTOR = 5.0  # a frame over 5x the median frame time is a host stall (a noisy neighbour), not the engine


def frame_statistics(frame_s: list[float], horizon: int) -> dict:
    """Median-based frame statistics beside the mean-based action frequency: median frame time and the action
    frequency it gives, the frames over ``STALL_FACTOR`` x the median (host stalls) and the mean without them."""
    median = statistics.median(frame_s)
    calm = [t for t in frame_s if t <= STALL_FACTOR * median]
    return {"frame_ms_median": 1e3 * median, "action_hz_median": horizon / median,
            "host_stalls": len(frame_s) - len(calm), "frame_ms_mean_without_stalls": 1e3 * statistics.fmean(calm)}


def machine_info(device: torch.device) -> dict:
    """Platform, processor, torch version, threads and device (with the GPU's name on CUDA) of this run."""
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def warmup_frames(ec: EngineConfig, workload: Workload) -> int:
    """Frames until the in-flight batch reaches steady state (the paper skips N // k)."""
    if ec.mode != "oxygen":
        return 2
    k = ec.k if isinstance(ec.k, int) else 1
    return math.ceil(workload.max_new_tokens / k) + 2


def pool_size(n: int, k: int | str, burst: int = 1) -> int:
    """In-flight bound sized to the workload: ceil(N/k) requests in steady state, plus slack for arrivals."""
    steady = math.ceil(n / k) if isinstance(k, int) else n
    return steady + max(burst, 2)


class PointRun:
    """One engine on one workload: warm-up frames, then measured frames one at a time, then a record."""

    def __init__(self, model: Pi05Model, ec: EngineConfig, workload: Workload, frames: int, seed: int = 0,
                 heads: nn.ModuleList | None = None, on_frame: Callable[[FrameResult], None] | None = None) -> None:
        self.model, self.ec, self.workload, self.heads, self.on_frame = model, ec, workload, heads, on_frame
        self.engine = build_engine(model, ec, heads=heads)
        self.obs = dummy_observation(model, 1, prompt_len=benchmark_prompt_len(model))
        self.warm = warmup_frames(ec, workload)
        self.schedule = workload.schedule(self.warm + frames)
        gen = torch.Generator(device="cpu").manual_seed(seed)
        self.noise = torch.randn(1, model.config.action_horizon, model.config.action_dim, generator=gen)
        self.noise = self.noise.to(model.device)
        self.frame = 0
        self.records: list[FrameResult] = []

    @property
    def done(self) -> bool:
        """Every frame of the schedule (warm-up and measured) has run."""
        return self.frame >= len(self.schedule)

    def step(self) -> None:
        """Run the next frame of the schedule."""
        res = self.engine.step(Frame(self.obs, self.schedule[self.frame], self.noise))
        if self.on_frame is not None:
            self.on_frame(res)
        if self.frame >= self.warm:
            self.records.append(res)
        self.frame += 1

    def warm_up(self) -> None:
        """Run the warm-up frames (not recorded)."""
        while self.frame < self.warm:
            self.step()

    def record(self) -> dict:
        """Close the engine and summarize the measured frames."""
        close = getattr(self.engine, "close", None)
        if close:
            close()
        return summarize(self.records, self.ec, self.workload, self.model.config.action_horizon, self.engine,
                         self.heads)


def run_point(model: Pi05Model, ec: EngineConfig, workload: Workload, frames: int, seed: int = 0,
              heads: nn.ModuleList | None = None, on_frame: Callable[[FrameResult], None] | None = None) -> dict:
    """Measure ``frames`` frames after warm-up; returns one JSON-able record.

    ``on_frame`` sees every frame's result, warm-up included (progress bars, traces)."""
    run = PointRun(model, ec, workload, frames, seed, heads, on_frame)
    while not run.done:
        run.step()
    return run.record()


def run_interleaved(model: Pi05Model, plan: list[tuple[EngineConfig, Workload]], frames: int, seed: int = 0,
                    heads: nn.ModuleList | None = None,
                    on_frame: Callable[[FrameResult], None] | None = None) -> list[dict]:
    """Several points measured round-robin, one frame each in turn after every point's warm-up, so slow drift of
    the machine (frequency, neighbours on a shared host) affects every engine alike. Records in plan order."""
    runs = [PointRun(model, ec, wl, frames, seed, heads, on_frame) for ec, wl in plan]
    for run in runs:
        run.warm_up()
    while not all(run.done for run in runs):
        for run in runs:
            if not run.done:
                run.step()
    return [run.record() for run in runs]


def summarize(records: list[FrameResult], ec: EngineConfig, workload: Workload, horizon: int, engine: Any,
              heads: nn.ModuleList | None = None) -> dict:
    """The paper's metrics over the measured frames of one point."""
    deadline = ec.deadline_s
    total = sum(r.timings["frame"] for r in records)
    frame_times = sorted(r.timings["frame"] for r in records)
    batches = [b for r in records for b in r.batch_sizes]
    stage = {s: sum(r.timings.get(s, 0.0) for r in records) / len(records) for s in STAGES}
    return {
        "engine": ec.mode, "k": ec.k, "speculate": ec.speculate, "graphs": ec.graphs, "N": workload.max_new_tokens,
        "S": ec.num_steps, "H": horizon,
        "workload": asdict(workload),
        "frames": len(records),
        "action_hz": horizon * len(records) / total,
        "tokens_per_s": sum(r.tokens_generated for r in records) / total,
        "frame_ms_mean": 1e3 * total / len(records),
        "frame_ms_p99": 1e3 * frame_times[min(len(frame_times) - 1, int(0.99 * len(frame_times)))],
        **frame_statistics(frame_times, horizon),
        "stage_ms": {s: 1e3 * v for s, v in stage.items()},
        "manager_share": stage["manager"] / stage["frame"],
        # frame time not spent in a measured stage: what the engine adds beyond the model's work
        "unaccounted_share": 1 - sum(v for k, v in stage.items() if k != "frame") / stage["frame"],
        "decode_steps_per_frame": statistics.mean(r.decode_steps for r in records),
        "batch_mean": statistics.mean(batches) if batches else 0.0,
        "batch_max": max(batches, default=0),
        "deadline_misses": sum(r.timings["frame"] > deadline for r in records) if deadline else None,
        "backlog_end": engine.backlog,
        "rejected": sum(r.rejected for r in records),
        "drafted": sum(r.drafted for r in records),
        "draft_accepted": sum(r.draft_accepted for r in records),
        "memory_bytes": engine.memory_bytes(),
        "num_heads": 1 + (len(heads) if heads else 0),
    }


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
