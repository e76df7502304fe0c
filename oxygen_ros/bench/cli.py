"""oxygen-bench: engines side by side on one workload; JSON, a markdown table and plots.

    oxygen-bench --config small --engines isolated shared_kv oxygen --N 30 --k 1 5 --frames 20 --out runs/bench

Every point of one invocation runs in the same process on the same model, and the measured frames of all points are
interleaved round-robin (after each point's warm-up), so ratios are measured side by side under the same conditions
(the ``parallel`` baseline runs on its own afterwards: its worker thread's OpenMP team keeps spinning after a frame).
Stage costs (prefill, denoise, decode step per batch size) are profiled in the same run and used to predict
each engine's frame time from the work it must do.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from oxygen_ros.bench.progress import progress_bar
from oxygen_ros.bench.runner import PROMPT_LEN, machine_info, run_interleaved, run_point, warmup_frames
from oxygen_ros.engine import Pi05Model, get_config
from oxygen_ros.engine.checkpoint import init_random_weights
from oxygen_ros.engine.cpu_kernels import use_onednn
from oxygen_ros.engine.engine import MODES, EngineConfig
from oxygen_ros.engine.heads import make_extra_heads
from oxygen_ros.engine.workload import KINDS, Workload
from oxygen_ros.tools.profile import DTYPES, profile_stages


def decode_cost(profile: dict, batch: float) -> float:
    """Profiled seconds of one decode step at ``batch`` rows (linear interpolation between measured sizes)."""
    table = sorted(profile["decode_step_s"].items())
    b = max(batch, table[0][0])
    for (b0, t0), (b1, t1) in zip(table, table[1:], strict=False):
        if b0 <= b <= b1:
            return t0 + (t1 - t0) * (b - b0) / (b1 - b0)
    (b0, t0), (b1, t1) = table[-2], table[-1]
    return t1 + (t1 - t0) * (b - b1) / (b1 - b0)


def predict_frame_s(point: dict, profile: dict) -> float:
    """Frame time the measured stage costs predict for the work this engine must do per frame."""
    p, d, n = profile["prefill_s"], profile["denoise_s"], point["N"]
    if point["engine"] in ("isolated", "parallel"):
        language = p + (n - 1) * decode_cost(profile, 1)
        return max(p + d, language) if point["engine"] == "parallel" else p + d + language
    if point["engine"] == "shared_kv":
        return p + d + (n - 1) * decode_cost(profile, 1)
    steps = point["decode_steps_per_frame"]
    return p + d + steps * decode_cost(profile, point["batch_mean"])


def pool_size(n: int, k: int | str, burst: int = 1) -> int:
    """In-flight bound sized to the workload: ceil(N/k) requests in steady state, plus slack for arrivals."""
    steady = math.ceil(n / k) if isinstance(k, int) else n
    return steady + max(burst, 2)


def parse_k(values: list[str]) -> list[int | str]:
    return [v if v == "auto" else int(v) for v in values]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="small")
    ap.add_argument("--preset", default="libero")
    ap.add_argument("--engines", nargs="+", default=["isolated", "shared_kv", "oxygen"], choices=MODES)
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
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES))
    ap.add_argument("--no-onednn", action="store_true", help="keep plain F.linear on CPU")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runs/bench"))
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype or ("bfloat16" if device.type == "cuda" else "float32")]
    cfg = get_config(args.config, args.preset, num_steps=args.S)
    model = init_random_weights(Pi05Model(cfg), seed=args.seed).to(device=device, dtype=dtype).eval()
    heads = None
    if args.heads > 1:
        heads = init_random_weights(make_extra_heads(cfg, args.heads - 1), seed=args.seed + 1)
        heads = heads.to(device=device, dtype=dtype)
    onednn = device.type == "cpu" and dtype == torch.float32 and not args.no_onednn and use_onednn(model) > 0
    if onednn and heads is not None:
        use_onednn(heads)
    print(f"model {cfg.name}/{args.preset}: {model.num_parameters() / 1e6:.1f}M parameters on {device} "
          f"{str(dtype).replace('torch.', '')}, oneDNN linear: {onednn}")

    ks = parse_k(args.k)
    max_batch = max(max(math.ceil(n / k) if isinstance(k, int) else n for n in args.N for k in ks), 2)
    prompt_len = min(cfg.max_token_len, PROMPT_LEN)  # the prompt run_point's observation has
    profile = profile_stages(model, sorted({1, 2, 4, 8, 16, 32, max_batch}), repeats=5, prompt_len=prompt_len)

    plan = []
    for n in args.N:
        for mode in args.engines:
            for k in ks if mode == "oxygen" else [ks[0]]:
                deadline = args.deadline_ms / 1e3 if args.deadline_ms else None
                ec = EngineConfig(mode=mode, num_steps=args.S, k=k, deadline_s=deadline, eos_id=-1,
                                  max_new_tokens=max(args.N), max_inflight=pool_size(n, k, args.burst_size))
                wl = Workload(kind=args.workload, max_new_tokens=n, period=args.period,
                              burst_size=args.burst_size, rate=args.rate, seed=args.seed)
                plan.append((ec, wl))
    total_frames = sum(warmup_frames(ec, wl) + args.frames for ec, wl in plan)
    with progress_bar(total=total_frames, desc="benchmark frames (interleaved)") as bar:
        tick = lambda _: bar.update(1)  # noqa: E731
        # the parallel baseline's worker thread leaves its own OpenMP team spinning after each frame, which would
        # slow whichever engine runs next: it is measured on its own, after the interleaved points
        shared = [(ec, wl) for ec, wl in plan if ec.mode != "parallel"]
        alone = [(ec, wl) for ec, wl in plan if ec.mode == "parallel"]
        records = run_interleaved(model, shared, args.frames, args.seed, heads=heads, on_frame=tick)
        records += [run_point(model, ec, wl, args.frames, args.seed, heads=heads, on_frame=tick) for ec, wl in alone]
        order = [id(ec) for ec, _ in shared + alone]
        points = [records[order.index(id(ec))] for ec, _ in plan]
    for point in points:
        point["predicted_frame_ms"] = 1e3 * predict_frame_s(point, profile)
        point["measured_over_predicted"] = point["frame_ms_mean"] / point["predicted_frame_ms"]

    for p in points:  # speedups against isolated at the same N
        base = next((q for q in points if q["engine"] == "isolated" and q["N"] == p["N"]), None)
        if base:
            p["speedup_vs_isolated"] = base["frame_ms_mean"] / p["frame_ms_mean"]
            p["token_rate_vs_isolated"] = p["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else None
            p["predicted_speedup"] = base["predicted_frame_ms"] / p["predicted_frame_ms"]
            p["memory_vs_isolated"] = p["memory_bytes"] / base["memory_bytes"]

    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine_info(device),
        "config": {"model": cfg.name, "preset": args.preset, "parameters": model.num_parameters(),
                   "dtype": str(dtype).replace("torch.", ""), "onednn_linear": onednn, "S": args.S,
                   "H": cfg.action_horizon, "workload": args.workload, "frames": args.frames},
        "profile": profile,
        "points": points,
    }
    (args.out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    table = markdown_table(points)
    (args.out / "summary.md").write_text(table + "\n")
    try:
        from oxygen_ros.bench.plots import plot_bench
    except ImportError:  # matplotlib missing (a bare GPU machine): JSON and table only
        print("matplotlib is not installed: no plots")
    else:
        plot_bench(result, args.out)
    print(f"\nstage costs: prefill {profile['prefill_s'] * 1e3:.1f} ms, denoise (S={args.S}) "
          f"{profile['denoise_s'] * 1e3:.1f} ms, decode step B=1 {profile['decode_step_s'][1] * 1e3:.1f} ms")
    print(table)
    print(f"\nwrote {args.out / 'results.json'}, summary.md and plots")


def markdown_table(points: list[dict]) -> str:
    rows = ["| engine | N | k | action Hz | tokens/s | frame ms (p99) | speedup | predicted | tokens/s x "
            "| manager % | other % | mean batch | memory x |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    nan = float("nan")
    for p in points:
        k = p["k"] if p["engine"] == "oxygen" else "-"
        rows.append(
            f"| {p['engine']} | {p['N']} | {k} | {p['action_hz']:.1f} | {p['tokens_per_s']:.1f} | "
            f"{p['frame_ms_mean']:.0f} ({p['frame_ms_p99']:.0f}) | {p.get('speedup_vs_isolated', nan):.2f}x | "
            f"{p.get('predicted_speedup', nan):.2f}x | {p.get('token_rate_vs_isolated') or nan:.2f}x | "
            f"{100 * p['manager_share']:.2f} | {100 * p.get('unaccounted_share', nan):.2f} | {p['batch_mean']:.1f} | "
            f"{p.get('memory_vs_isolated', nan):.3f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
