"""What real-time chunking costs the denoise: without guidance, ``identity`` and ``vjp`` side by side.

    python -m oxygen_ros.bench.rtc_cost --out runs/rtc_cost_small [--config small --preset libero --repeats 15]

One prefilled observation of the benchmark model (random weights, ``bench/models.py``), one previous chunk's
remainder (the node's cadence: the last chunk started ``--executed`` actions before the new observation, the delay
``--delay`` actions, the paper's settings: exp schedule, beta 5, the whole remainder guided). The denoise loop runs on
each path the engine has, unguided and with ``identity`` guidance: ``eager`` (the reference modules), ``fused``
(fast_path) and ``static`` (the static-shape step of ``engine/backends/graphs.py``, the persistent guided step); ``vjp``
guidance has one path (eager modules under autograd, a backward pass per step). Every round times each variant once,
in turn (interleaved, the order reversed every other round), so a noisy host slows all alike; a variant's cost is
the median over rounds of its time over the same round's unguided time on the same path (``vjp`` against ``fused``,
the engine's CPU path, and ``eager``).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from oxygen_ros.bench.models import build_model, dtype_name, resolve_dtype
from oxygen_ros.bench.observation import benchmark_prompt_len, dummy_observation
from oxygen_ros.bench.progress import progress_bar
from oxygen_ros.bench.report import save_figure, write_run
from oxygen_ros.bench.runner import machine_info
from oxygen_ros.engine import KVCache
from oxygen_ros.engine.backends.graphs import FrameGraphs
from oxygen_ros.engine.rtc import RTCConfig, RTCGuide, RTCPrefix
from oxygen_ros.engine.timing import synchronize

__all__ = ["PAPER_SETTINGS", "measure", "run"]

# the paper's (Kinetix) settings, the policy layer's PAPER_RTC: exp schedule, beta 5, the whole remainder guided
PAPER_SETTINGS = RTCConfig(enabled=True, guidance="identity", schedule="exp", max_guidance_weight=5.0,
                           execution_horizon=1 << 16)


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


def measure(fns: dict[str, Callable[[], object]], pairs: dict[str, tuple[str, str]], repeats: int,
            device: torch.device, warmup: int = 1, progress: bool = True) -> dict:
    """Interleaved rounds of ``fns`` (in turn, the order reversed every other round: a variant that runs right after
    another one's different memory and kernel footprint pays for it, so each gets both places); per variant its
    median time, and for each ``pairs`` entry (name -> (variant, baseline)) the median of the per-round ratios
    variant / baseline."""
    times: dict[str, list[float]] = {v: [] for v in fns}
    with progress_bar(total=warmup + repeats, desc="rtc cost rounds", disable=not progress) as bar:
        for rep in range(warmup + repeats):
            for v in list(fns)[::-1] if rep % 2 else list(fns):
                t = _timed(fns[v], device)
                if rep >= warmup:
                    times[v].append(t)
            bar.update()
    ratios = {name: statistics.median(a / b for a, b in zip(times[v], times[base], strict=True))
              for name, (v, base) in pairs.items()}
    return {"median_ms": {v: 1e3 * statistics.median(ts) for v, ts in times.items()},
            "ratio": ratios, "baseline": pairs, "samples_ms": {v: [1e3 * t for t in ts] for v, ts in times.items()}}


def run(config: str = "small", preset: str = "libero", repeats: int = 15, delay: int = 3, executed: int = 2,
        device: str = "cpu", dtype: str | None = None, static: bool = True, progress: bool = True) -> dict:
    """The measurement; the ``results.json`` dict."""
    dev = torch.device(device)
    model, onednn = build_model(config, preset, dev, resolve_dtype(dtype, dev))
    cfg = model.config
    h, a, steps = cfg.action_horizon, cfg.action_dim, cfg.num_steps
    obs = dummy_observation(model, 1, benchmark_prompt_len(model))
    cache = KVCache.for_model(cfg, 1, extra_tokens=1, dtype=model.dtype, device=dev)
    prefix = model.prefill(obs, cache, slice(0, 1))
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(1, h, a, generator=gen).to(dev)
    remainder = RTCPrefix(torch.randn(h - executed, a, generator=gen), delay)
    identity = RTCGuide.build(remainder, PAPER_SETTINGS, h, a, steps, dev)
    vjp = RTCGuide.build(remainder, dataclasses.replace(PAPER_SETTINGS, guidance="vjp"), h, a, steps, dev)

    eager_model = model.with_stages("eager")

    def denoise(fused: bool, guide: RTCGuide | None) -> Callable[[], object]:
        m = model if fused else eager_model
        return lambda: m.denoise(prefix, cache, noise, guide=guide)

    fns = {"eager": denoise(False, None), "eager_identity": denoise(False, identity),
           "fused": denoise(True, None), "fused_identity": denoise(True, identity), "vjp": denoise(True, vjp)}
    pairs = {"eager_identity": ("eager_identity", "eager"), "fused_identity": ("fused_identity", "fused"),
             "vjp": ("vjp", "fused"), "vjp_vs_eager": ("vjp", "eager")}
    if static:  # the engine's static-shape step (plain static shapes: no compile, no capture on a CPU)
        graphs = FrameGraphs(model, cache, [model.head_parts()], steps, "cuda" if dev.type == "cuda" else "static",
                             PAPER_SETTINGS)
        fns["static"] = lambda: graphs.denoise(prefix, [noise])
        fns["static_identity"] = lambda: graphs.denoise(prefix, [noise], identity)
        pairs["static_identity"] = ("static_identity", "static")
    res = measure(fns, pairs, repeats, dev, progress=progress)
    # identity guidance's own work, alone: its S velocity corrections (a bound free of the host's noise)
    x, v = torch.randn(1, h, a, generator=gen).to(dev), torch.randn(1, h, a, generator=gen).to(dev)
    apply_s = []
    for _ in range(101):
        t0 = time.perf_counter()
        for step in range(steps):
            identity.apply(step, x, v)
        synchronize(dev)
        apply_s.append(time.perf_counter() - t0)
    res["identity_apply_ms"] = 1e3 * statistics.median(apply_s)
    res["identity_apply_share"] = res["identity_apply_ms"] / res["median_ms"]["fused"]
    with torch.no_grad():  # the guided chunks really differ from the unguided one (the guidance ran)
        plain = model.denoise(prefix, cache, noise)
        moved = {name: float((model.denoise(prefix, cache, noise, guide=g) - plain).abs().max())
                 for name, g in (("identity", identity), ("vjp", vjp))}
    return {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_info(dev),
            "config": {"model": config, "preset": preset, "parameters": model.num_parameters(), "H": h, "S": steps,
                       "dtype": dtype_name(model.dtype), "onednn_linear": onednn, "threads": torch.get_num_threads(),
                       "delay": delay, "remainder": h - executed, "rtc": dataclasses.asdict(PAPER_SETTINGS)},
            "repeats": repeats, "guided_max_change": moved, **res}


def summary(res: dict) -> str:
    """Markdown: each variant's median denoise time and its cost over the unguided denoise on the same path."""
    ms, ratio = res["median_ms"], res["ratio"]
    rows = ["| path | unguided ms | identity ms (cost) | vjp ms (cost) |", "|---|---|---|---|"]
    for path in ("eager", "fused", "static"):
        if path not in ms:
            continue
        ident = f"{ms[path + '_identity']:.1f} ({100 * (ratio[path + '_identity'] - 1):+.1f}%)"
        vjp = "-"
        if path == "fused":
            vjp = f"{ms['vjp']:.1f} ({100 * (ratio['vjp'] - 1):+.0f}%)"
        elif path == "eager":
            vjp = f"{ms['vjp']:.1f} ({100 * (ratio['vjp_vs_eager'] - 1):+.0f}%)"
        rows.append(f"| {path} | {ms[path]:.1f} | {ident} | {vjp} |")
    rows.append(f"\nidentity guidance's own ops (S velocity corrections, timed alone): "
                f"{res['identity_apply_ms']:.3f} ms per denoise = {100 * res['identity_apply_share']:.2f}% of the "
                "unguided fused denoise")
    return "\n".join(rows)


def plot(res: dict, path: Path) -> Path:
    """Per-round denoise times of every variant (dots) and their medians (bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = res["samples_ms"]
    names = list(samples)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar(range(len(names)), [res["median_ms"][n] for n in names], color="#c9d6ea")
    for i, n in enumerate(names):
        ax.plot([i] * len(samples[n]), samples[n], ".", color="#1f4e8c", alpha=0.6)
    ax.set_xticks(range(len(names)), names, rotation=20)
    c = res["config"]
    ax.set_ylabel("denoise ms (median bar, rounds as dots)")
    ax.set_title(f"RTC guidance cost: {c['model']} ({c['preset']}, H={c['H']}, S={c['S']}, {c['threads']} thread(s))",
                 fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    """CLI entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="small")
    ap.add_argument("--preset", default="libero")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--delay", type=int, default=3, help="inference delay d (actions)")
    ap.add_argument("--executed", type=int, default=2, help="actions of the last chunk executed before the new "
                    "observation (the remainder is H - executed long)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--no-static", action="store_true", help="skip the static-shape path")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    res = run(a.config, a.preset, a.repeats, a.delay, a.executed, a.device, a.dtype, not a.no_static)
    write_run(a.out, res, summary(res), plot, "rtc_cost.png")


if __name__ == "__main__":
    main()
