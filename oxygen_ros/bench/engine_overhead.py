"""The engine's per-frame overhead (``python -m oxygen_ros.bench.engine_overhead``): ``Engine.step`` on an action-only
frame against the bare fused path it wraps (``Pi05Model.prefill`` + ``denoise`` on a cache of its own), interleaved
in pairs with alternating order; the paired median ratio step / bare is the overhead (scheduler, slot, timings,
validation, result bookkeeping). A cProfile of the steps splits the engine's own Python time from the model's.

Writes ``results.json``, ``summary.md`` and ``engine_overhead.png`` into ``--out`` (default runs/engine_overhead).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from pathlib import Path

import torch

from oxygen_ros.bench.models import build_model
from oxygen_ros.bench.observation import dummy_observation
from oxygen_ros.bench.report import save_figure, write_run
from oxygen_ros.bench.runner import machine_info
from oxygen_ros.engine import Observation
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.kv_cache import KVCache
from oxygen_ros.engine.requests import Frame
from oxygen_ros.util.host import cpu_name

ENGINE_FILES = ("engine/engine.py", "engine/model_runner.py", "engine/scheduler.py", "engine/timing.py",
                "engine/requests.py", "engine/observation.py")


def run(config: str, preset: str, pairs: int, threads: int, prompt_len: int = 20) -> dict:
    torch.set_num_threads(threads)
    model, onednn = build_model(config, preset, torch.device("cpu"), torch.float32)
    cfg = model.config
    full = dummy_observation(model, prompt_len=prompt_len)
    obs = Observation(full.images, full.image_masks, full.tokens[:, :prompt_len], full.token_mask[:, :prompt_len])
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(0))
    engine = build_engine(model, EngineConfig(graphs="off", max_inflight=1, max_new_tokens=4, kernels="keep"))
    cache = KVCache.for_model(cfg, 1, dtype=model.dtype)

    def bare() -> None:
        with torch.no_grad():
            o = obs.to(model.device, model.input_dtype)
            model.denoise(model.prefill(o, cache), cache, noise)

    def step() -> None:
        engine.step(Frame(obs, [], [noise]))

    for _ in range(10):
        bare()
        step()
    tb, ts, ratios = [], [], []
    for i in range(pairs):
        t = {}
        for name, fn in ((("bare", bare), ("step", step)) if i % 2 else (("step", step), ("bare", bare))):
            t0 = time.perf_counter()
            fn()
            t[name] = time.perf_counter() - t0
        tb.append(t["bare"])
        ts.append(t["step"])
        ratios.append(t["step"] / t["bare"])
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        step()
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
    total = sum(v[2] for v in stats.values())
    own = sum(v[2] for k, v in stats.items() if k[0].endswith(ENGINE_FILES))
    return {"created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "machine": {**machine_info(torch.device("cpu")), "cpu": cpu_name()},
            "config": {"model": config, "preset": preset, "threads": threads, "pairs": pairs, "onednn": onednn,
                       "prompt_len": prompt_len, "S": cfg.num_steps, "H": cfg.action_horizon},
            "bare_ms": 1e3 * statistics.median(tb), "step_ms": 1e3 * statistics.median(ts),
            "step_over_bare": statistics.median(ratios),
            "profile": {"engine_own_python_share": own / total if total else 0.0, "frames": 50}}


def summary(res: dict) -> str:
    c = res["config"]
    return "\n".join([
        f"{c['model']}/{c['preset']}, {c['threads']} thread(s), {c['pairs']} interleaved pairs ({res['created']}, "
        f"{res['machine']['cpu']})", "",
        "| bare fused path ms (median) | Engine.step ms (median) | step / bare (paired median) | engine's own Python "
        "(share of profiled time) |", "|---:|---:|---:|---:|",
        f"| {res['bare_ms']:.2f} | {res['step_ms']:.2f} | {res['step_over_bare']:.3f} | "
        f"{100 * res['profile']['engine_own_python_share']:.1f} % |"])


def plot(res: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.bar(["bare fused", "Engine.step"], [res["bare_ms"], res["step_ms"]])
    ax.set_ylabel("ms per frame (median)")
    ax.set_title(f"{res['config']['model']}: step / bare {res['step_over_bare']:.3f}")
    return save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--preset", default="libero")
    ap.add_argument("--pairs", type=int, default=400)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("runs/engine_overhead"))
    a = ap.parse_args()
    res = run(a.config, a.preset, a.pairs, a.threads)
    write_run(a.out, res, summary(res), plot, "engine_overhead.png")


if __name__ == "__main__":
    main()
