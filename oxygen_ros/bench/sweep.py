"""The paper's evaluation (Figures 4-7 and 9-12, Tables 1/3/4/6/7) as one resumable, plotted benchmark sweep.

    python -m oxygen_ros.bench.sweep --suite all --mode quick --config small --out runs/sweep
    python -m oxygen_ros.bench.sweep --suite headline memory --config pi05 --device cuda --compile off default

Suites: headline tradeoff speedup ablation arrivals overhead memory stages auto heads (``all``: every one); what
each measures, the modes and the files written: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from oxygen_ros.bench.cost_model import normalized_profile
from oxygen_ros.bench.measure import measure, units
from oxygen_ros.bench.model_pool import ModelPool
from oxygen_ros.bench.models import DTYPES, dtype_name, onednn_applies, resolve_dtype
from oxygen_ros.bench.points import COMPILE_MODES, Point, PointStore, shared_record
from oxygen_ros.bench.progress import progress_bar
from oxygen_ros.bench.runner import machine_info
from oxygen_ros.bench.suites import GRIDS, SUITES, build_plan
from oxygen_ros.bench.sweep_report import summarize, write_summary


def sweep_machine(device: torch.device) -> dict:
    """runner.machine_info plus the Python version and the CPU count."""
    return {**machine_info(device), "python": sys.version.split()[0], "cpu_count": os.cpu_count()}


def profile_for(p: Point, plan: list[Point], store: PointStore) -> dict | None:
    """The measured stage profile of ``p``'s model (preset, compile mode), if the plan has run it."""
    for q in plan:
        if q.engine == "profile" and (q.preset, q.compile) == (p.preset, p.compile) and q.id in store:
            return normalized_profile(store.records[q.id]["profile"])
    return None


def run_plan(plan: list[Point], store: PointStore, pool: ModelPool, machine: dict) -> None:
    """Measure every unfinished point, grouped so each model is built once; records are appended as they finish."""
    pending = sorted((p for p in plan if p.id not in store), key=lambda p: p.model_key)
    print(f"{len(plan)} points: {len(plan) - len(pending)} done, {len(pending)} to run")
    with progress_bar(total=sum(units(p) for p in pending), desc="sweep", unit="frame") as bar:
        for p in pending:
            bar.set_postfix_str(p.label)
            measured = store.measured(p.key)
            if measured is not None:
                store.append(shared_record(p, measured))
                bar.update(units(p))
                continue
            profile = profile_for(p, plan, store)
            t0 = time.perf_counter()
            rec = measure(p, pool, profile, lambda: bar.update(1))
            store.append({"id": p.id, "suite": p.suite, "key": p.key, "params": p.params(), **rec,
                          "machine": machine, "model": pool.info, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
                          "elapsed_s": round(time.perf_counter() - t0, 3)})
    pool.release()


def run_sweep(plan: list[Point], store: PointStore, device: torch.device, dtype: torch.dtype, *, mode: str,
              config: str, compile_modes: list[str], command: list[str], compile_backend: str = "inductor") -> dict:
    """Run ``plan`` into ``store``; returns the summary of its records, headed by what was run where."""
    machine = sweep_machine(device)
    run_plan(plan, store, ModelPool(device, dtype, compile_backend), machine)
    meta = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command, "mode": mode, "machine": machine,
            "context": {"config": config, "device": device.type, "dtype": dtype_name(dtype),
                        "compile": compile_modes, "suites": list(dict.fromkeys(p.suite for p in plan))}}
    return summarize([store.records[p.id] for p in plan], meta)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The sweep's command line."""
    ap = argparse.ArgumentParser(prog="python -m oxygen_ros.bench.sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", nargs="+", default=["all"], choices=("all", *SUITES))
    ap.add_argument("--mode", default="quick", choices=sorted(GRIDS))
    ap.add_argument("--config", default="small", help="model config: tiny, small, pi05")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: float32 on CPU, bfloat16 on GPU")
    ap.add_argument("--frames", type=int, default=None, help="measured frames of every point (default: the mode's)")
    ap.add_argument("--out", type=Path, default=Path("runs/sweep"))
    ap.add_argument("--compile", nargs="+", default=["off"], choices=COMPILE_MODES,
                    help="torch.compile modes to measure each point with (e.g. off default)")
    ap.add_argument("--compile-backend", default="inductor", help="torch.compile backend ('eager' checks tracing)")
    ap.add_argument("--deadline-factor", type=float, default=1.3, help="auto suite: deadline = f x (prefill+denoise)")
    ap.add_argument("--deadline-ms", type=float, default=None, help="auto suite: a fixed frame deadline instead")
    ap.add_argument("--no-onednn", action="store_true", help="keep plain F.linear on CPU")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--list", action="store_true", help="print the plan (id, frames incl. warm-up, done) and exit")
    ap.add_argument("--no-plots", action="store_true")
    return ap.parse_args(argv)


def plan_from_args(args: argparse.Namespace) -> tuple[list[Point], torch.device, torch.dtype]:
    """The points the command line asks for, and the device and dtype they run on."""
    device = torch.device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    base = Point(suite="", engine="", config=args.config, device=device.type, dtype=dtype_name(dtype),
                 onednn=onednn_applies(device, dtype) and not args.no_onednn, seed=args.seed)
    suites = SUITES if "all" in args.suite else tuple(dict.fromkeys(args.suite))
    deadline = f"{args.deadline_ms:g}ms" if args.deadline_ms else f"{args.deadline_factor:g}x"
    plan = build_plan(suites, GRIDS[args.mode], base, args.frames, dict.fromkeys(args.compile), deadline)
    return plan, device, dtype


def print_plan(plan: list[Point], store: PointStore) -> None:
    """``--list``: one line per point (done or not, frames incl. warm-up, id) and the frames left to run."""
    for p in plan:
        print(f"{'done' if p.id in store else '    '} {units(p):4d}  {p.id}")
    print(f"{len(plan)} points, {sum(units(p) for p in plan if p.id not in store)} frames to run")


def plot_sweep(summary: dict, out: Path) -> list[Path]:
    """PNG plots per suite; none (with a note) where matplotlib is not installed."""
    try:
        from oxygen_ros.bench.plots import plot_all

        return plot_all(summary, out)
    except ImportError as e:
        print(f"no plots ({e})")
        return []


def main(argv: list[str] | None = None) -> dict | None:
    """Run the sweep the command line asks for (resuming ``<out>/points.jsonl``); returns the summary."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    plan, device, dtype = plan_from_args(args)
    store = PointStore(args.out / "points.jsonl")
    if args.list:
        print_plan(plan, store)
        return None
    summary = run_sweep(plan, store, device, dtype, mode=args.mode, config=args.config, compile_modes=args.compile,
                        command=sys.argv[:1] + (argv or sys.argv[1:]), compile_backend=args.compile_backend)
    table = write_summary(summary, args.out)
    plots = [] if args.no_plots else plot_sweep(summary, args.out)
    print(table)
    print(f"wrote {args.out / 'points.jsonl'}, summary.json, summary.md and {len(plots)} plots")
    return summary


if __name__ == "__main__":
    main()
