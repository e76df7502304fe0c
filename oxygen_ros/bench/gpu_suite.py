"""The GPU benchmark's measurements (``scripts/gpu_bench.sh`` runs this after the CUDA tests); stages default,
headline, stages, node, memory, each under its own time budget, one JSON line per result appended (synced) to
``<out>/results.jsonl``; ``--summarize OUT`` renders ``summary.md`` from whatever lines exist (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

STAGES = ("default", "headline", "stages", "node", "memory")
# seconds a stage needs at least (a stage is skipped with less than this left of the whole budget)
MIN_S = {"default": 15, "headline": 30, "stages": 15, "node": 10, "memory": 10}
HANG_ENV = "OXYGEN_GPU_SUITE_HANG_AT"  # rehearsal only: sleep at this stage's start, so a test can time the run out


class Results:
    """Appends one JSON line per result to ``path``, flushed and fsynced at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, stage: str, kind: str, **values) -> None:
        rec = {"stage": stage, "kind": kind, "time": time.strftime("%H:%M:%S"), **values}
        with open(self.path, "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        print(f"[gpu_suite] {stage}/{kind}: {_short(values)}", flush=True)


def _short(values: dict) -> str:
    keep = ("engine", "N", "k", "frame_ms_median", "action_hz", "tokens_per_s", "eager_s", "fused_s", "graphs_s",
            "memory_bytes", "peak_allocated_bytes", "seconds", "reason", "error")
    return ", ".join(f"{k}={values[k]:.4g}" if isinstance(values[k], float) else f"{k}={values[k]}"
                     for k in keep if k in values)


def _peak(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _slim(rec: dict) -> dict:
    """A point record without its per-frame lists (the summary's numbers only)."""
    return {k: v for k, v in rec.items() if not isinstance(v, list)}


def run(out: Path, config: str, device: str, precision: str, graphs: str, frames: int, budget_s: float,
        stages: list[str], repeats: int) -> None:
    """Build the model, then every stage in order under the budget; results into ``out/results.jsonl``."""
    from oxygen_ros.bench.models import build_model
    from oxygen_ros.bench.runner import machine_info
    from oxygen_ros.engine.backends.precision import apply_precision, cuda_math_state
    from oxygen_ros.engine.config import CAMERA_SLOTS

    t_start = time.perf_counter()
    res = Results(out / "results.jsonl")
    dev = torch.device(device)
    t0 = time.perf_counter()
    # the humanoid preset's shapes (config/humanoid.yaml): three cameras, H=10
    model, _ = build_model(config, None, dev, torch.float32, onednn=False, camera_names=CAMERA_SLOTS,
                           action_horizon=10)
    apply_precision(model, precision)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    res.write("build", "model", config=config, precision=precision, parameters=model.num_parameters(),
              parameter_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
              seconds=time.perf_counter() - t0, allocated_bytes=torch.cuda.memory_allocated(dev)
              if dev.type == "cuda" else None, cuda_math=cuda_math_state(), machine=machine_info(dev),
              torch=torch.__version__, graphs=graphs, frames=frames)
    left = lambda: budget_s - (time.perf_counter() - t_start)  # noqa: E731
    for stage in stages:
        if os.environ.get(HANG_ENV) == stage:  # rehearsal: the outer timeout kills the run here
            print(f"[gpu_suite] {HANG_ENV}={stage}: hanging", flush=True)
            time.sleep(3600)
        if left() < MIN_S[stage]:
            res.write(stage, "skipped", reason=f"{left():.0f} s left of the budget, the stage needs {MIN_S[stage]}")
            continue
        t = time.perf_counter()
        rest = stages[stages.index(stage):]  # this stage and those after it share what is left, by their minimums
        stage_end = t + max(MIN_S[stage], left() * MIN_S[stage] / sum(MIN_S[s] for s in rest))
        try:
            STAGE_FNS[stage](model, res, dev, graphs, frames, repeats, lambda end=stage_end: end - time.perf_counter())
        except Exception as e:  # noqa: BLE001 (the next stages still run; the error is a result)
            res.write(stage, "error", error=f"{type(e).__name__}: {e}")
        res.write(stage, "done", seconds=time.perf_counter() - t)


def _default(model, res: Results, dev: torch.device, graphs: str, frames: int, repeats: int,
             left: Callable[[], float]) -> None:
    from oxygen_ros.bench.runner import pool_size, run_point
    from oxygen_ros.engine.engine import EngineConfig
    from oxygen_ros.study.workload import Workload

    ec = EngineConfig(graphs="auto", eos_id=-1, max_new_tokens=30, max_inflight=pool_size(30, 5))
    _reset_peak(dev)
    rec = run_point(model, ec, Workload(max_new_tokens=30), frames)
    res.write("default", "point", **_slim(rec), graphs_resolved="cuda" if dev.type == "cuda" else "auto",
              peak_allocated_bytes=_peak(dev))


def _plan_group(model, res: Results, dev: torch.device, stage: str, plan, frames: int, label: str) -> list[dict]:
    from oxygen_ros.bench.report import vs_isolated
    from oxygen_ros.bench.runner import measure_plan

    _reset_peak(dev)
    t = time.perf_counter()
    points = measure_plan(model, plan, frames)
    iso = next((p for p in points if p["engine"] == "isolated"), None)
    for p in points:
        extra = {} if iso is None else vs_isolated(p, iso)
        res.write(stage, "point", group=label, **_slim(p), **extra, peak_allocated_bytes=_peak(dev),
                  group_seconds=time.perf_counter() - t)
    return points


def _headline(model, res: Results, dev: torch.device, graphs: str, frames: int, repeats: int,
              left: Callable[[], float]) -> None:
    from oxygen_ros.bench.runner import make_plan
    from oxygen_ros.study.workload import Workload

    steps = model.config.num_steps
    for label, ns, engines, ks in (("N30", [30], ["isolated", "oxygen"], [1, 5]),
                                   ("N5", [5], ["isolated", "shared_kv"], [1])):
        if left() <= 0:
            res.write("headline", "skipped", group=label, reason="stage budget spent")
            continue
        plan = [(dataclasses.replace(ec, graphs=graphs), wl)
                for ec, wl in make_plan(ns, engines, ks, steps, Workload(max_new_tokens=ns[0]))]
        _plan_group(model, res, dev, "headline", plan, frames, label)


def _stages(model, res: Results, dev: torch.device, graphs: str, frames: int, repeats: int,
            left: Callable[[], float]) -> None:
    from oxygen_ros.bench.frame_overhead import stage_overhead
    from oxygen_ros.bench.observation import benchmark_prompt_len

    def done(name: str, r: dict) -> None:
        res.write("stages", "stage", name=name, **{k: v for k, v in r.items() if k != "samples"})

    stage_overhead(model, [1, 6, 30], repeats, prompt_len=benchmark_prompt_len(model), graphs=graphs, floor=False,
                   on_stage=done)


def _node(model, res: Results, dev: torch.device, graphs: str, frames: int, repeats: int,
          left: Callable[[], float]) -> None:
    """Frames as the node runs them with config/humanoid.yaml: a subtask request of N=30 every frame, k=5, RTC
    identity guidance toward the previous chunk's remainder (delay 1), max_inflight 16, graphs auto."""
    import numpy as np

    from oxygen_ros.bench.observation import dummy_observation
    from oxygen_ros.engine.engine import EngineConfig, build_engine
    from oxygen_ros.engine.requests import Frame, LanguageRequest
    from oxygen_ros.engine.rtc import RTCConfig, RTCPrefix

    cfg = model.config
    ec = EngineConfig(graphs="auto", k=5, eos_id=-1, max_new_tokens=30, max_inflight=16,
                      rtc=RTCConfig(enabled=True, guidance="identity", schedule="linear", max_guidance_weight=10.0))
    t = time.perf_counter()
    _reset_peak(dev)
    eng = build_engine(model, ec)
    build_s = time.perf_counter() - t
    obs = dummy_observation(model, 1)
    rng = np.random.default_rng(0)
    times, stages, guided, tokens = [], {}, 0, 0
    warm = 3
    for f in range(warm + frames):
        if f >= warm and left() <= 0:
            break
        dims = min(16, cfg.action_dim)  # humanoid.yaml's 16 joints
        remainder = None if f == 0 else RTCPrefix(rng.normal(size=(cfg.action_horizon - 1, dims)).astype(np.float32),
                                                  1)
        fr = Frame(obs, [LanguageRequest("subtask", 30)], stamp=f, rtc=remainder)
        r = eng.step(fr)
        if f >= warm:
            times.append(r.timings["frame"])
            guided += int(r.guided)
            tokens += r.tokens_generated
            for s, v in r.timings.items():
                stages[s] = stages.get(s, 0.0) + v
    n = len(times)
    srt = sorted(times)
    res.write("node", "frames", frames=n, build_s=build_s, graphs=eng.graphs_backend,
              frame_ms_median=1e3 * srt[n // 2] if n else None, frame_ms_mean=1e3 * sum(times) / n if n else None,
              frame_ms_max=1e3 * srt[-1] if n else None,
              stage_ms_mean={s: 1e3 * v / n for s, v in stages.items()} if n else {},
              guided_frames=guided, tokens_per_s=tokens / sum(times) if n else None,
              chunk_budget_ms=1e3 / 3.0, memory_bytes=eng.memory_bytes(), peak_allocated_bytes=_peak(dev))


def _memory(model, res: Results, dev: torch.device, graphs: str, frames: int, repeats: int,
            left: Callable[[], float]) -> None:
    from oxygen_ros.bench.observation import dummy_observation
    from oxygen_ros.bench.runner import pool_size
    from oxygen_ros.engine.engine import EngineConfig, build_engine
    from oxygen_ros.engine.requests import Frame, LanguageRequest

    obs = dummy_observation(model, 1)
    for mode in ("oxygen", "shared_kv", "isolated", "parallel"):
        if left() <= 0:
            res.write("memory", "skipped", engine=mode, reason="stage budget spent")
            continue
        ec = EngineConfig(mode=mode, graphs=graphs, k=5, eos_id=-1, max_new_tokens=30, max_inflight=pool_size(30, 5))
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        _reset_peak(dev)
        base = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None
        eng = build_engine(model, ec)
        for f in range(2):
            eng.step(Frame(obs, [LanguageRequest("memory", 30)], stamp=f))
        res.write("memory", "engine", engine=mode, memory_bytes=eng.memory_bytes(), peak_allocated_bytes=_peak(dev),
                  allocated_before_bytes=base)
        close = getattr(eng, "close", None)
        if close:
            close()
        del eng


STAGE_FNS = {"default": _default, "headline": _headline, "stages": _stages, "node": _node, "memory": _memory}


# ---------------------------------------------------------------------------------------------------- summary
def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill
            continue
    return out


def summarize(out: Path) -> str:
    """``summary.md`` from ``results.jsonl`` and ``cuda_tests.jsonl`` (whatever exists)."""
    recs, tests = _lines(out / "results.jsonl"), _lines(out / "cuda_tests.jsonl")
    lines = ["# GPU benchmark summary", ""]
    build = next((r for r in recs if r["kind"] == "model"), None)
    if build:
        m = build.get("machine", {})
        lines += [f"Model {build['config']} ({build['parameters'] / 1e9:.2f} B parameters, "
                  f"{build['parameter_bytes'] / 2**30:.2f} GiB), precision {build['precision']}, "
                  f"CUDA math {build['cuda_math']}, torch {build['torch']}, {m.get('device', m)}; "
                  f"build {build['seconds']:.0f} s.", ""]
    if tests:
        lines += ["## CUDA tests (captured vs eager)", "", "| test | details |", "|---|---|"]
        for t in tests:
            lines.append(f"| {t['test']} | " + ", ".join(f"{k}={v}" for k, v in t.items()
                                                          if k not in ("test", "time")) + " |")
        lines.append("")
    points = [r for r in recs if r["kind"] == "point"]
    if points:
        lines += ["## Engine points", "", "| stage | engine | N | k | graphs | frame ms median | action Hz | tokens/s "
                  "| speedup vs isolated | peak GiB |", "|---|---|---|---|---|---|---|---|---|---|"]
        for p in points:
            sp = p.get("speedup_vs_isolated")
            peak = p.get("peak_allocated_bytes")
            lines.append(f"| {p['stage']} | {p['engine']} | {p['N']} | {p['k']} | {p.get('graphs')} | "
                         f"{p['frame_ms_median']:.1f} | {p['action_hz']:.1f} | {p['tokens_per_s']:.0f} | "
                         f"{'-' if sp is None else f'{sp:.2f}x'} | "
                         f"{'-' if peak is None else f'{peak / 2**30:.1f}'} |")
        lines.append("")
    st = [r for r in recs if r["kind"] == "stage"]
    if st:
        lines += ["## Stage latencies (median ms)", "", "| stage | eager | fused | captured | captured speedup |",
                  "|---|---|---|---|---|"]
        for s in st:
            g = s.get("graphs_s")
            captured = "- | -" if g is None else f"{1e3 * g:.2f} | {s['graphs_speedup']:.2f}x"
            lines.append(f"| {s['name']} | {1e3 * s['eager_s']:.2f} | {1e3 * s['fused_s']:.2f} | {captured} |")
        lines.append("")
    for r in recs:
        if r["kind"] == "frames":
            lines += ["## Node frame (humanoid.yaml shapes)", "", "```", json.dumps(r, indent=1), "```", ""]
    mem = [r for r in recs if r["kind"] == "engine"]
    if mem:
        lines += ["## Memory (N=30)", "", "| engine | parameters + KV GiB | device peak GiB |", "|---|---|---|"]
        for r in mem:
            pk = r.get("peak_allocated_bytes")
            lines.append(f"| {r['engine']} | {r['memory_bytes'] / 2**30:.2f} | "
                         f"{'-' if pk is None else f'{pk / 2**30:.2f}'} |")
        lines.append("")
    other = [r for r in recs if r["kind"] in ("skipped", "error")]
    if other:
        lines += ["## Skipped or failed", ""] + [f"- {r['stage']}: {r.get('reason') or r.get('error')}" for r in other]
    done = [r["stage"] for r in recs if r["kind"] == "done"]
    lines += ["", f"Stages finished: {', '.join(done) or 'none'}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--summarize", action="store_true", help="only write summary.md from the results so far")
    ap.add_argument("--config", default="pi05")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="bfloat16_islands")
    ap.add_argument("--graphs", default="cuda", help="the engines' graphs backend (static rehearses it on a CPU)")
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=7, help="interleaved repeats per stage latency")
    ap.add_argument("--budget-s", type=float, default=300.0, help="seconds for the build and all stages")
    ap.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    a = ap.parse_args(argv)
    try:
        if not a.summarize:
            run(a.out, a.config, a.device, a.precision, a.graphs, a.frames, a.budget_s, a.stages, a.repeats)
    finally:
        (a.out / "summary.md").write_text(summarize(a.out))


if __name__ == "__main__":
    main()
