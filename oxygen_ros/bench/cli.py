"""oxygen-bench: engines side by side on one workload; JSON, a markdown table and plots (docs/benchmarks.md).

    oxygen-bench --config small --engines isolated shared_kv oxygen --N 30 --k 1 5 --frames 20 --out runs/bench
    oxygen-bench streams [options]            the multi-stream language workload (bench/streams.py)
    oxygen-bench experiment <name> [options]  an A/B experiment (bench/experiments.py)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from oxygen_ros.bench.models import add_model_args, build_heads, model_from_args
from oxygen_ros.bench.report import markdown_table, write_run
from oxygen_ros.bench.runner import make_plan, profile_batches, run_bench
from oxygen_ros.engine.modes import ENGINE_MODES
from oxygen_ros.study.workload import KINDS, Workload


def parse_k(values: list[str]) -> list[int | str]:
    """``--k`` values: integers, or ``auto``."""
    return [v if v == "auto" else int(v) for v in values]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of ``oxygen-bench``."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="small")
    ap.add_argument("--preset", default="libero")
    ap.add_argument("--engines", nargs="+", default=["isolated", "shared_kv", "oxygen"], choices=ENGINE_MODES)
    ap.add_argument("--N", type=int, nargs="+", default=[30], help="tokens per language request")
    ap.add_argument("--k", nargs="+", default=["1", "5"], help="decode budget per frame (oxygen), int or auto")
    ap.add_argument("--S", type=int, default=10, help="denoise steps")
    ap.add_argument("--frames", type=int, default=20, help="measured frames per point (after warm-up)")
    ap.add_argument("--workload", default="every_frame", choices=KINDS)
    ap.add_argument("--period", type=int, default=1)
    ap.add_argument("--burst-size", type=int, default=4)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--deadline-ms", type=float, default=None, help="frame deadline (k=auto, deadline misses)")
    ap.add_argument("--heads", type=int, default=1, help="action experts reading the prefix (E)")
    add_model_args(ap)
    ap.add_argument("--out", type=Path, default=Path("runs/bench"))
    return ap.parse_args(argv)


def plot_results(result: dict, out: Path) -> list[Path]:
    """oxygen-bench's figures (``plots.plot_bench``; matplotlib)."""
    from oxygen_ros.bench.plots import plot_bench

    return plot_bench(result, out)


def main(argv: list[str] | None = None) -> None:
    """``oxygen-bench``: build the benchmark model, measure the engines side by side, write JSON, table, plots.
    ``oxygen-bench streams ...``: the multi-stream workload (``bench/streams.py``); ``oxygen-bench experiment
    <name> ...``: an A/B experiment (``bench/experiments.py``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["experiment"]:
        from oxygen_ros.bench.experiments import main as experiment_main

        experiment_main(argv[1:])
        return
    if argv[:1] == ["streams"]:
        from oxygen_ros.bench.streams import main as streams_main

        streams_main(argv[1:])
        return
    args = parse_args(argv)
    model, onednn = model_from_args(args, num_steps=args.S)
    heads = build_heads(model, args.heads - 1, args.seed, onednn) if args.heads > 1 else None

    ks = parse_k(args.k)
    template = Workload(kind=args.workload, max_new_tokens=max(args.N), period=args.period,
                        burst_size=args.burst_size, rate=args.rate, seed=args.seed)
    deadline_s = args.deadline_ms / 1e3 if args.deadline_ms else None
    plan = make_plan(args.N, args.engines, ks, args.S, template, deadline_s)
    result = run_bench(model, plan, args.frames, device=torch.device(args.device), preset=args.preset, onednn=onednn,
                       batches=profile_batches(args.N, ks), seed=args.seed, heads=heads)
    table = write_run(args.out, result, markdown_table(result["points"]), plot_results, echo=False)
    profile = result["profile"]
    print(f"\nstage costs: prefill {profile['prefill_s'] * 1e3:.1f} ms, denoise (S={args.S}) "
          f"{profile['denoise_s'] * 1e3:.1f} ms, decode step B=1 {profile['decode_step_s'][1] * 1e3:.1f} ms")
    print(table)
    print(f"\nwrote {args.out / 'results.json'}, summary.md and plots")


if __name__ == "__main__":
    main()
