"""The paper's evaluation (Figures 4-7 and 9-12, Tables 1/3/4/6/7) as one resumable, plotted benchmark sweep.

    python -m oxygen_ros.bench.sweep --suite all --mode quick --config small --out runs/sweep
    python -m oxygen_ros.bench.sweep --suite headline memory --config pi05 --device cuda --compile off default

Suites (``--suite``, several allowed; ``all`` = every suite). N = tokens per request, k = decode budget per frame,
S = denoise steps, E = action experts; libero preset and S = 10 unless a suite varies them:

  headline  N=30: isolated, oxygen k=1, k=5; N=5: isolated, shared_kv (the headline targets; scripts/gpu_bench.sh)
  tradeoff  action Hz vs tokens/s, isolated and oxygen k in {1,5,10} across N (Fig 4)
  speedup   oxygen vs isolated at N=30 across presets x S x k (Fig 5); full mode adds k=5 across N (Fig 10)
  ablation  isolated / shared_kv / oxygen k=5 across N, plus the no-language oracle: frames with no requests (Fig 6)
  arrivals  oxygen k=5, N=30 under uniform rates, Poisson rates, random lengths, bursts: Hz and batch (Fig 7)
  overhead  cache-manager share of the frame by batch size (N=30, k -> batch ceil(N/k)) (Table 7)
  memory    engine.memory_bytes() per engine incl. parallel; on CUDA also max_memory_allocated per point (Table 3);
            parallel only without torch.compile (its deep copy would still call the original's compiled forward)
  stages    stage profile (prefill, denoise, decode step per batch) + shared_kv vs isolated across N (Table 6)
  auto      k=auto vs fixed k, bursts of 8 every 8 frames, deadline = 1.3 x (prefill + denoise): misses and
            backlog, with a per-frame trace of frame time and backlog (warm-up included)
  heads     E = 1..4 action experts reading one prefix, isolated vs oxygen, N=30 (Table 1 / 4)

Modes. ``quick`` (the README table; a few minutes on 2 CPU cores with ``small``): 4 measured frames per point
(12 for auto), tradeoff N in {5,15,30} x k in {1,5,10}; speedup S=10 only, k in {1,5}, no Fig 10 grid; ablation
N in {5,15,30}; arrivals: every frame / 2nd / 4th frame, Poisson 1.0, lengths 5-30, bursts of 4; overhead
k in {1,5,10}; stages N in {1,5,15,30}; auto k in {auto,1,5}; heads E in {1,2,4} with oxygen k=5: 71 points, 40
measured (the rest shared), about 5 minutes on 2 cores with ``small`` (estimated from its stage costs: prefill
212 ms, denoise 122 ms, decode step 25 / 35 / 67 ms at batch 1 / 6 / 30). ``full``: the paper's grids (see
``suites.GRIDS``), 20 measured frames per point (60 for auto): 228 points, 182 measured, about an hour with ``small``.
``--frames`` overrides the measured frames of every point. Every point also runs its warm-up frames
(runner.warmup_frames: ceil(N/k) + 2 for oxygen, 2 otherwise); ``--list`` prints the plan without running it.
One model instance serves every point of a (preset, compile mode): S, k, N and the workload are engine parameters.

Records. One JSON line per point in ``<out>/points.jsonl``, keyed by a stable id: the suite plus every
parameter (engine, preset, S, N, k, workload, frames, config, device, dtype, compile, ...). A re-run skips
finished ids. Points measuring the same thing in several suites (e.g. isolated N=30 in tradeoff, speedup,
ablation) are measured once; later suites copy the record (``shared_with`` names the measured id). Every record
carries the machine (runner.machine_info) and the model config. At the end ``summary.json`` (the points of this
invocation + derived numbers: speedup, token-rate and memory ratios vs isolated at the same N / preset / S / E,
predicted frame times from the stage profile, per-suite tables), ``summary.md`` and PNG plots per suite are written.
A hidden ``profile`` point per preset (profile_stages) feeds the predictions and the auto suite's deadline.

GPU (CUDA, bf16, ``--config pi05``, random weights). The model is built on the GPU, cast to bf16, then given
init_random_weights. ``--compile off default`` measures each point without and with torch.compile (mode
"default" or "max-autotune-no-cudagraphs"); compiled are the pieces with static or few shapes: the SigLIP tower,
every RMSNorm / adaRMSNorm and GeGLU MLP (backbone, expert, extra heads); attention, the KV-cache writes and the
engine's host-side scheduling stay eager. CUDA graphs are not used: decode changes its attention length every
step and its batch every frame, and the engine's per-frame scheduling runs on the host, so a graph path needs
static-shape decode (padded attention length, batch buckets) inside the model; "reduce-overhead" is therefore
not offered. Where tqdm or matplotlib is missing (a bare GPU machine) the sweep runs without a progress bar and
without plots; the JSON is still written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from oxygen_ros.bench.measure import units
from oxygen_ros.bench.models import DTYPES, dtype_name, onednn_applies, resolve_dtype
from oxygen_ros.bench.points import COMPILE_MODES, Point, PointStore
from oxygen_ros.bench.suites import GRIDS, SUITES, build_plan
from oxygen_ros.bench.sweep_report import write_summary
from oxygen_ros.bench.sweep_run import run_sweep


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
        from oxygen_ros.bench.sweep_plots import plot_all

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
