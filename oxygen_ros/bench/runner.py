"""Run one benchmark point (engine x workload) and compute the paper's metrics."""

from __future__ import annotations

import math
import platform
import statistics
from collections.abc import Callable
from dataclasses import asdict

import torch

from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.model import Pi05Model
from oxygen_ros.engine.requests import Frame, FrameResult
from oxygen_ros.engine.workload import Workload
from oxygen_ros.tools.profile import dummy_observation

PROMPT_LEN = 48  # valid prompt tokens of the benchmark observation (pi0.5 LIBERO prompts are ~30-50 tokens)
STAGES = ("prefill", "language_prefill", "denoise", "decode", "manager", "frame")


def machine_info(device: torch.device) -> dict:
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


def run_point(model: Pi05Model, ec: EngineConfig, workload: Workload, frames: int, seed: int = 0,
              heads=None, on_frame: Callable[[FrameResult], None] | None = None) -> dict:
    """Measure ``frames`` frames after warm-up; returns one JSON-able record.

    ``on_frame`` sees every frame's result, warm-up included (progress bars, traces)."""
    engine = build_engine(model, ec, heads=heads)
    obs = dummy_observation(model, 1, prompt_len=min(model.config.max_token_len, PROMPT_LEN))
    horizon = model.config.action_horizon
    warm = warmup_frames(ec, workload)
    schedule = workload.schedule(warm + frames)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    noise = torch.randn(1, horizon, model.config.action_dim, generator=gen).to(model.device)
    records = []
    deadline = ec.deadline_s
    for f, reqs in enumerate(schedule):
        res = engine.step(Frame(obs, reqs, noise))
        if on_frame is not None:
            on_frame(res)
        if f >= warm:
            records.append(res)
    close = getattr(engine, "close", None)
    if close:
        close()
    total = sum(r.timings["frame"] for r in records)
    frame_times = sorted(r.timings["frame"] for r in records)
    batches = [b for r in records for b in r.batch_sizes]
    stage = {s: sum(r.timings.get(s, 0.0) for r in records) / len(records) for s in STAGES}
    return {
        "engine": ec.mode, "k": ec.k, "N": workload.max_new_tokens, "S": ec.num_steps, "H": horizon,
        "workload": asdict(workload),
        "frames": len(records),
        "action_hz": horizon * len(records) / total,
        "tokens_per_s": sum(r.tokens_generated for r in records) / total,
        "frame_ms_mean": 1e3 * total / len(records),
        "frame_ms_p99": 1e3 * frame_times[min(len(frame_times) - 1, int(0.99 * len(frame_times)))],
        "stage_ms": {s: 1e3 * v for s, v in stage.items()},
        "manager_share": stage["manager"] / stage["frame"],
        "decode_steps_per_frame": statistics.mean(r.decode_steps for r in records),
        "batch_mean": statistics.mean(batches) if batches else 0.0,
        "batch_max": max(batches, default=0),
        "deadline_misses": sum(r.timings["frame"] > deadline for r in records) if deadline else None,
        "backlog_end": engine.backlog,
        "rejected": sum(r.rejected for r in records),
        "memory_bytes": engine.memory_bytes(),
        "num_heads": 1 + (len(heads) if heads else 0),
    }
