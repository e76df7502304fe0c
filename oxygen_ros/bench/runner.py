"""Run one benchmark point (engine x workload) and compute the paper's metrics."""

from __future__ import annotations

import math
import platform
import statistics
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from oxygen_ros.bench.observation import benchmark_prompt_len, dummy_observation
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
