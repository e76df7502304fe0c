"""The one-off A/B experiments (``engine_overhead``, ``prefill_layout``, ``rtc_cost``), one function each, on
the paired timer (``bench/paired.py``) and ``report.write_run``; what each measures: docs/benchmarks.md.

    python -m oxygen_ros.bench.experiments <name> [options]     (or: oxygen-bench experiment <name> [options])
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from oxygen_ros.bench.models import build_model, dtype_name, resolve_dtype
from oxygen_ros.bench.observation import benchmark_prompt_len, dummy_observation
from oxygen_ros.bench.paired import medians_ms, paired, ratio
from oxygen_ros.bench.report import save_figure, subplots, write_run
from oxygen_ros.bench.runner import machine_info
from oxygen_ros.engine import KVCache, Observation, Pi05Model
from oxygen_ros.engine.backends.graphs import FrameGraphs
from oxygen_ros.engine.backends.precision import apply_precision
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.requests import Frame
from oxygen_ros.engine.rtc import RTCConfig, RTCGuide, RTCPrefix
from oxygen_ros.engine.timing import synchronize
from oxygen_ros.util.host import cpu_name

ENGINE_FILES = ("engine/engine.py", "engine/model_runner.py", "engine/scheduler.py", "engine/timing.py",
                "engine/requests.py", "engine/observation.py")
# prefill_layout: name -> (masked camera slots, valid prompt tokens; None: the whole max_token_len)
SETUPS = {
    "masked_camera_padded_prompt": ((2,), 20),  # openpi LIBERO / DROID: a zero right-wrist slot, padded prompt
    "all_cameras_padded_prompt": ((), 20),
    "all_cameras_full_prompt": ((), None),  # nothing to compact: the control (ratio ~1)
}
# rtc_cost: the paper's (Kinetix) settings, the policy layer's PAPER_RTC
PAPER_SETTINGS = RTCConfig(enabled=True, guidance="identity", schedule="exp", max_guidance_weight=5.0,
                           execution_horizon=1 << 16)


def _cpu_host() -> dict:
    return {**machine_info(torch.device("cpu")), "cpu": cpu_name()}


def _noise(model: Pi05Model, seed: int) -> torch.Tensor:
    cfg = model.config
    return torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(seed))


# --- engine_overhead ---------------------------------------------------------------------------------------------

def engine_overhead(config: str = "tiny", preset: str = "libero", pairs: int = 400, threads: int = 1,
                    prompt_len: int = 20) -> dict:
    """``Engine.step`` against the bare fused path, paired; the engine's own share of profiled Python time."""
    torch.set_num_threads(threads)
    model, onednn = build_model(config, preset, torch.device("cpu"), torch.float32)
    cfg = model.config
    full = dummy_observation(model, prompt_len=prompt_len)
    obs = Observation(full.images, full.image_masks, full.tokens[:, :prompt_len], full.token_mask[:, :prompt_len])
    noise = _noise(model, 0)
    engine = build_engine(model, EngineConfig(graphs="off", max_inflight=1, max_new_tokens=4, kernels="keep"))
    cache = KVCache.for_model(cfg, 1, dtype=model.dtype)

    def bare() -> None:
        with torch.no_grad():
            model.denoise(model.prefill(obs.to(model.device, model.input_dtype), cache), cache, noise)

    def step() -> None:
        engine.step(Frame(obs, [], [noise]))

    times = paired({"step": step, "bare": bare}, pairs, warmup=10)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        step()
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
    total = sum(v[2] for v in stats.values())
    own = sum(v[2] for k, v in stats.items() if k[0].endswith(ENGINE_FILES))
    ms = medians_ms(times)
    return {"created": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": _cpu_host(),
            "config": {"model": config, "preset": preset, "threads": threads, "pairs": pairs, "onednn": onednn,
                       "prompt_len": prompt_len, "S": cfg.num_steps, "H": cfg.action_horizon},
            "bare_ms": ms["bare"], "step_ms": ms["step"], "step_over_bare": ratio(times, "step", "bare"),
            "profile": {"engine_own_python_share": own / total if total else 0.0, "frames": 50}}


def engine_overhead_summary(res: dict) -> str:
    c = res["config"]
    return "\n".join([
        f"{c['model']}/{c['preset']}, {c['threads']} thread(s), {c['pairs']} interleaved pairs ({res['created']}, "
        f"{res['machine']['cpu']})", "",
        "| bare fused path ms (median) | Engine.step ms (median) | step / bare (paired median) | engine's own Python "
        "(share of profiled time) |", "|---:|---:|---:|---:|",
        f"| {res['bare_ms']:.2f} | {res['step_ms']:.2f} | {res['step_over_bare']:.3f} | "
        f"{100 * res['profile']['engine_own_python_share']:.1f} % |"])


def engine_overhead_plot(res: dict, path: Path) -> Path:
    fig, ax = subplots(figsize=(4, 3))
    ax.bar(["bare fused", "Engine.step"], [res["bare_ms"], res["step_ms"]])
    ax.set_ylabel("ms per frame (median)")
    ax.set_title(f"{res['config']['model']}: step / bare {res['step_over_bare']:.3f}")
    return save_figure(fig, path)


# --- prefill_layout ----------------------------------------------------------------------------------------------

def layout_observation(model: Pi05Model, masked: tuple[int, ...], valid: int | None) -> Observation:
    """One observation in the model's input dtype: every slot, ``masked`` slots zero and masked out, the prompt
    padded to ``max_token_len`` with ``valid`` real tokens."""
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    s, n = cfg.vision.image_size, cfg.max_token_len
    images = torch.rand(1, cfg.num_cameras, 3, s, s, generator=g) * 2 - 1
    masks = torch.ones(1, cfg.num_cameras, dtype=torch.bool)
    for c in masked:
        images[:, c] = -1.0  # openpi's zero image, in [-1, 1]
        masks[:, c] = False
    token_mask = torch.zeros(1, n, dtype=torch.bool)
    token_mask[:, : valid or n] = True
    tokens = torch.randint(3, cfg.vocab_size, (1, n), generator=g).masked_fill(~token_mask, 0)
    return Observation(images, masks, tokens, token_mask).to(model.device, model.input_dtype)


def layout_frame(model: Pi05Model, obs: Observation, noise: torch.Tensor, layout: str) -> torch.Tensor:
    """The action path of one frame: prefill (``layout``) + denoise; the chunk [1, H, A]."""
    cache = KVCache.for_model(model.config, 1, dtype=model.dtype, device=model.device)
    return model.denoise(model.prefill(obs, cache, layout=layout), cache, noise)


def prefill_layout(config: str = "small", precision: str = "bfloat16_islands", pairs: int = 15,
                   threads: int = 2) -> dict:
    """Padded against compact prefill per setup, paired; exactness of both against the eager reference."""
    torch.set_num_threads(threads)
    model, _ = build_model(config, None, torch.device("cpu"), torch.float32, onednn=False)
    apply_precision(model, precision)
    cfg, noise = model.config, _noise(model, 1)
    res: dict = {"created": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": _cpu_host(),
                 "config": {"model": config, "precision": precision, "threads": threads, "pairs": pairs,
                            "cameras": cfg.num_cameras, "tokens_per_image": cfg.vision.tokens_per_image,
                            "max_token_len": cfg.max_token_len, "S": cfg.num_steps, "H": cfg.action_horizon},
                 "setups": {}}
    with torch.no_grad():
        for name, (masked, valid) in SETUPS.items():
            obs = layout_observation(model, masked, valid)
            padded, compact = (layout_frame(model, obs, noise, lay) for lay in ("padded", "compact"))
            eager = layout_frame(model.with_stages("eager"), obs, noise, "padded")
            times = paired({lay: lambda obs=obs, lay=lay: layout_frame(model, obs, noise, lay)
                            for lay in ("compact", "padded")}, pairs)
            ms = medians_ms(times)
            point = {"padded_ms": ms["padded"], "compact_ms": ms["compact"],
                     "compact_over_padded": ratio(times, "compact", "padded"), "pairs": pairs,
                     "masked_cameras": list(masked), "valid_prompt_tokens": valid or cfg.max_token_len,
                     "compact_vs_padded_max_abs": float((compact - padded).abs().max()),
                     "padded_equals_eager": bool(torch.equal(padded, eager)),
                     "compact_equals_eager": bool(torch.equal(compact, eager))}
            res["setups"][name] = point
            print(name, point, flush=True)
    return res


def prefill_layout_summary(res: dict) -> str:
    c = res["config"]
    lines = [f"{c['model']} in {c['precision']}, {c['threads']} threads, {c['pairs']} interleaved pairs "
             f"({res['created']}, {res['machine'].get('cpu', res['machine'].get('device'))})", "",
             "| setup | padded ms (median) | compact ms (median) | compact / padded (paired median) | cost of "
             "exactness | compact moves actions by | padded == eager | compact == eager |", "|" + "---|" * 8]
    for name, p in res["setups"].items():
        lines.append(f"| {name} | {p['padded_ms']:.1f} | {p['compact_ms']:.1f} | {p['compact_over_padded']:.3f} | "
                     f"{1 / p['compact_over_padded']:.2f}x | {p['compact_vs_padded_max_abs']:.2g} | "
                     f"{p['padded_equals_eager']} | {p['compact_equals_eager']} |")
    return "\n".join(lines)


def prefill_layout_plot(res: dict, path: Path) -> Path:
    names = list(res["setups"])
    fig, ax = subplots(figsize=(7, 3.5))
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [res["setups"][n]["padded_ms"] for n in names], 0.4, label="padded (openpi's)")
    ax.bar([i + 0.2 for i in x], [res["setups"][n]["compact_ms"] for n in names], 0.4, label="compact")
    ax.set_xticks(list(x), [n.replace("_", "\n") for n in names], fontsize=7)
    ax.set_ylabel("frame ms (prefill + denoise, median)")
    ax.set_title(f"{res['config']['model']} {res['config']['precision']}: prefill layout")
    ax.legend()
    return save_figure(fig, path)


# --- rtc_cost ------------------------------------------------------------------------------------------------------

def rtc_cost(config: str = "small", preset: str = "libero", repeats: int = 15, delay: int = 3, executed: int = 2,
             device: str = "cpu", dtype: str | None = None, static: bool = True, progress: bool = True) -> dict:
    """The unguided, ``identity`` and ``vjp`` denoises on every path, paired; identity's own ops timed alone."""
    dev = torch.device(device)
    model, onednn = build_model(config, preset, dev, resolve_dtype(dtype, dev))
    cfg = model.config
    h, a, steps = cfg.action_horizon, cfg.action_dim, cfg.num_steps
    cache = KVCache.for_model(cfg, 1, extra_tokens=1, dtype=model.dtype, device=dev)
    prefix = model.prefill(dummy_observation(model, 1, benchmark_prompt_len(model)), cache, slice(0, 1))
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
    times = paired(fns, repeats, device=dev, desc="rtc cost rounds" if progress else None)
    res = {"median_ms": medians_ms(times), "ratio": {n: ratio(times, v, b) for n, (v, b) in pairs.items()},
           "baseline": pairs, "samples_ms": {v: [1e3 * t for t in ts] for v, ts in times.items()}}
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


def rtc_cost_summary(res: dict) -> str:
    """Markdown: each variant's median denoise time and its cost over the unguided denoise on the same path."""
    ms, r = res["median_ms"], res["ratio"]
    rows = ["| path | unguided ms | identity ms (cost) | vjp ms (cost) |", "|---|---|---|---|"]
    vjp = {"fused": "vjp", "eager": "vjp_vs_eager"}
    for path in (p for p in ("eager", "fused", "static") if p in ms):
        ident = f"{ms[path + '_identity']:.1f} ({100 * (r[path + '_identity'] - 1):+.1f}%)"
        guided = f"{ms['vjp']:.1f} ({100 * (r[vjp[path]] - 1):+.0f}%)" if path in vjp else "-"
        rows.append(f"| {path} | {ms[path]:.1f} | {ident} | {guided} |")
    rows.append(f"\nidentity guidance's own ops (S velocity corrections, timed alone): "
                f"{res['identity_apply_ms']:.3f} ms per denoise = {100 * res['identity_apply_share']:.2f}% of the "
                "unguided fused denoise")
    return "\n".join(rows)


def rtc_cost_plot(res: dict, path: Path) -> Path:
    """Per-round denoise times of every variant (dots) and their medians (bars)."""
    samples, c = res["samples_ms"], res["config"]
    names = list(samples)
    fig, ax = subplots(figsize=(9, 4))
    ax.bar(range(len(names)), [res["median_ms"][n] for n in names], color="#c9d6ea")
    for i, n in enumerate(names):
        ax.plot([i] * len(samples[n]), samples[n], ".", color="#1f4e8c", alpha=0.6)
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set_ylabel("denoise ms (median bar, rounds as dots)")
    ax.set_title(f"RTC guidance cost: {c['model']} ({c['preset']}, H={c['H']}, S={c['S']}, {c['threads']} thread(s))",
                 fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


# --- the command line ----------------------------------------------------------------------------------------------

def _options(ap: argparse.ArgumentParser, config: str, threads: int, preset: bool = True, **counts: int) -> None:
    """The options every experiment has (``--config``, ``--threads``, ``--preset``) and its integer counts."""
    ap.add_argument("--config", default=config)
    ap.add_argument("--threads", type=int, default=threads)
    if preset:
        ap.add_argument("--preset", default="libero")
    for name, default in counts.items():
        ap.add_argument(f"--{name}", type=int, default=default)


def _engine_overhead_cli(ap: argparse.ArgumentParser) -> Callable[[argparse.Namespace], dict]:
    _options(ap, "tiny", 1, pairs=400)
    ap.set_defaults(out=Path("runs/engine_overhead"))
    return lambda a: engine_overhead(a.config, a.preset, a.pairs, a.threads)


def _prefill_layout_cli(ap: argparse.ArgumentParser) -> Callable[[argparse.Namespace], dict]:
    _options(ap, "small", 2, preset=False, pairs=15)
    ap.add_argument("--precision", default="bfloat16_islands")
    ap.set_defaults(out=Path("runs/prefill_layout"))
    return lambda a: prefill_layout(a.config, a.precision, a.pairs, a.threads)


def _rtc_cost_cli(ap: argparse.ArgumentParser) -> Callable[[argparse.Namespace], dict]:
    # --delay: the inference delay d (actions); --executed: actions of the last chunk executed before the new
    # observation (the remainder is H - executed long)
    _options(ap, "small", 1, repeats=15, delay=3, executed=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--no-static", action="store_true", help="skip the static-shape path")

    def go(a: argparse.Namespace) -> dict:
        torch.set_num_threads(a.threads)
        return rtc_cost(a.config, a.preset, a.repeats, a.delay, a.executed, a.device, a.dtype, not a.no_static)
    return go


# name -> (options and run, summary, plot, png)
EXPERIMENTS = {
    "engine_overhead": (_engine_overhead_cli, engine_overhead_summary, engine_overhead_plot, "engine_overhead.png"),
    "prefill_layout": (_prefill_layout_cli, prefill_layout_summary, prefill_layout_plot, "prefill_layout.png"),
    "rtc_cost": (_rtc_cost_cli, rtc_cost_summary, rtc_cost_plot, "rtc_cost.png"),
}


def main(argv: list[str] | None = None) -> None:
    """``python -m oxygen_ros.bench.experiments <name> [options]``: run one experiment, write its files."""
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="name", required=True)
    runs = {}
    for name, (options, *_) in EXPERIMENTS.items():
        p = sub.add_parser(name)
        runs[name] = options(p)
        p.add_argument("--out", type=Path, required=p.get_default("out") is None, default=p.get_default("out"))
    a = ap.parse_args(argv)
    _, summary, plot, png = EXPERIMENTS[a.name]
    res = runs[a.name](a)
    write_run(a.out, res, summary(res), plot, png)


if __name__ == "__main__":
    main()
