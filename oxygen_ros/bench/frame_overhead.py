"""The overhead-free frame, side by side in one run (``python -m oxygen_ros.bench.frame_overhead``): fused vs
eager vs static-shape stages beside their compute floor, oxygen vs isolated at N = 30, speculative decoding on vs
off (docs/benchmarks.md). Writes ``results.json``, ``summary.md`` and ``frame_overhead.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from oxygen_ros.bench.models import build_model, dtype_name, resolve_dtype
from oxygen_ros.bench.observation import benchmark_prompt_len, dummy_observation
from oxygen_ros.bench.paired import paired, ratio
from oxygen_ros.bench.report import save_figure, subplots, vs_isolated, write_run
from oxygen_ros.bench.runner import machine_info, make_plan, measure_plan
from oxygen_ros.engine import KVCache, Pi05Model
from oxygen_ros.engine.backends.graphs import FrameGraphs, resolve_backend
from oxygen_ros.engine.backends.precision import PRECISIONS, apply_precision
from oxygen_ros.engine.timing import synchronize
from oxygen_ros.study.workload import Workload

TARGETS = {"denoise": 2.5, "decode": 1.3, "prefill": 1.0}

VARIANTS = ("eager", "fused")
# the kernels that do a stage's arithmetic (matrix products, attention); everything else is overhead to remove
COMPUTE_KERNELS = ("mkldnn::_linear_pointwise", "aten::mkldnn_linear", "aten::mm", "aten::addmm", "aten::bmm",
                   "aten::baddbmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
                   "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_flash_attention",
                   "aten::_scaled_dot_product_cudnn_attention")


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> int:
    """ATen operations one call of ``fn`` dispatches (views and in-place writes included): the per-operation
    framework cost a stage pays whatever the host, which CUDA graphs or a compiler remove."""
    with _OpCounter() as counter:
        fn()
    return counter.count


def compute_floor(fn: Callable[[], object], device: torch.device, repeats: int = 3) -> float | None:
    """Seconds per call of ``fn`` spent in :data:`COMPUTE_KERNELS` (self time; device time on CUDA), median over
    ``repeats`` calls. None when the profiler cannot run here (no CUPTI, say): the benchmark goes on without one."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    totals = []
    for _ in range(repeats):
        try:
            with profile(activities=activities) as prof:
                fn()
                synchronize(device)
        except RuntimeError as e:
            warnings.warn(f"no compute floor: the profiler failed ({e})", stacklevel=2)
            return None
        if cuda:  # kernels have their own names on the device: everything the device ran
            totals.append(sum(e.self_device_time_total for e in prof.key_averages()) * 1e-6)
        else:
            totals.append(sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in COMPUTE_KERNELS) * 1e-6)
    return statistics.median(totals)


def side_by_side(model: Pi05Model, fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1,
                 floor: bool = True) -> dict:
    """Interleaved timing of ``fns`` (variant -> call, ``bench/paired.py``, in a fixed order) on ``model``
    (``eager``'s call runs the model's eager stages, :func:`stage_models`). ``speedup``: eager / fused;
    ``graphs_speedup``: eager / graphs, when present; ``floor_s`` / ``bound``: the fused stage's compute floor
    (:func:`compute_floor`, once per round) and the median of the paired ratios eager / floor."""
    floors: list[float | None] = []

    def round_floor() -> None:  # the floor in the same rounds, paired with their eager call
        if floor and None not in floors:  # floor=False or no profiler here: no more profiler sessions
            floors.append(compute_floor(fns["fused"], model.device, repeats=1))

    times = paired(fns, repeats, warmup, model.device, alternate=False, after_round=round_floor)
    out = {f"{v}_s": statistics.median(ts) for v, ts in times.items()}
    for v in VARIANTS:  # a compiled or captured step dispatches no ATen operations one by one
        out[f"{v}_ops"] = count_ops(fns[v])
    if floors and all(floors):
        out["floor_s"] = statistics.median(floors)
        out["bound"] = ratio({**times, "floor": floors}, "eager", "floor")
    out["speedup"] = ratio(times, "eager", "fused")
    out["ratio_of_medians"] = out["eager_s"] / out["fused_s"]
    if "graphs" in times:
        out["graphs_speedup"] = ratio(times, "eager", "graphs")
    out["samples"] = {v: ts for v, ts in times.items()}
    return out


def stage_models(model: Pi05Model) -> dict[str, Pi05Model]:
    """Each variant's model: ``eager`` the eager reference stages over ``model``'s weights, the others ``model``."""
    eager = model.with_stages("eager")
    return {v: eager if v == "eager" else model for v in VARIANTS}


def stage_overhead(model: Pi05Model, batches: list[int], repeats: int = 7, decode_context: int = 30,
                   prompt_len: int | None = None, graphs: str = "off", floor: bool = True,
                   on_stage: Callable[[str, dict], None] | None = None) -> dict:
    """Fused vs eager per stage: ``{"prefill": .., "denoise": .., "decode_B<b>": ..}`` from :func:`side_by_side`.

    ``graphs`` (a ``graphs.py`` backend other than off): every stage also times that backend's static-shape step
    (variant ``graphs``; a decode of B rows runs as the engine would, at the bucket covering B; its first call,
    which compiles or captures, is the warm-up). ``floor``: also each stage's compute floor (profiler sessions);
    ``on_stage(name, result)``: called as each stage's result exists (the GPU script writes it right away)."""
    cfg, dev = model.config, model.device
    done = on_stage or (lambda name, r: None)
    obs = dummy_observation(model, 1, prompt_len)
    max_b = max(batches)
    cache = KVCache.for_model(cfg, max_b, extra_tokens=decode_context + 1, dtype=model.dtype, device=dev)
    static = None
    if resolve_backend(graphs, dev) != "off":
        static = FrameGraphs(model, cache, [model.head_parts()], cfg.num_steps, graphs)
    rows = slice(0, 1)
    models = stage_models(model)
    fns = {v: lambda m=models[v]: m.prefill(obs, cache, rows) for v in VARIANTS}
    if static is not None:
        fns["graphs"] = lambda: static.prefill(obs, 0)
    res = {"prefill": side_by_side(model, fns, repeats, floor=floor)}
    done("prefill", res["prefill"])
    prefix = model.prefill(obs, cache, rows)
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, device=dev)
    fns = {v: lambda m=models[v]: m.denoise(prefix, cache, noise) for v in VARIANTS}
    if static is not None:
        fns["graphs"] = lambda: static.denoise(prefix, [noise])
    res["denoise"] = side_by_side(model, fns, repeats, floor=floor)
    done("denoise", res["denoise"])
    cache.k[:, 1:max_b] = cache.k[:, :1]
    cache.v[:, 1:max_b] = cache.v[:, :1]
    cache.valid[1:max_b] = cache.valid[:1]
    cache.valid[:, prefix.length:prefix.length + decode_context] = True
    for b in batches:
        idx = torch.full((b,), prefix.length + decode_context, device=dev)
        pos = prefix.num_valid.expand(b) + decode_context
        tokens = torch.full((b,), 5, device=dev)

        def step(m: Pi05Model, b: int = b, idx: torch.Tensor = idx, pos: torch.Tensor = pos,
                 tokens: torch.Tensor = tokens):
            return m.decode_step(cache, slice(0, b), tokens, pos, idx, prefix.length + decode_context + 1)

        fns = {v: lambda m=models[v], step=step: step(m) for v in VARIANTS}
        if static is not None:
            n = static.decode_bucket(b)
            wide = torch.stack([torch.cat([x, x[:1].expand(n - b)]) for x in (tokens, pos, idx)]).cpu()
            fns["graphs"] = lambda n=n, wide=wide: static.decode(slice(0, n), wide)  # from the host, as the engine
        res[f"decode_B{b}"] = side_by_side(model, fns, repeats, floor=floor)
        if static is not None:
            res[f"decode_B{b}"]["graphs_bucket"] = n
        done(f"decode_B{b}", res[f"decode_B{b}"])
    return res


def default_graphs(device: torch.device, engine: bool) -> str:
    """CUDA graphs on CUDA; on CPU torch.compile for the stages and plain static shapes for the engine point (each
    engine would compile its own steps again: minutes per point on a small CPU)."""
    return "cuda" if device.type == "cuda" else ("static" if engine else "compile")


def run(config: str, preset: str, batches: list[int], repeats: int, n: int, ks: list[int], frames: int,
        episodes: int, speculate: int, onednn: bool = True, device: str = "cpu", dtype: str | None = None,
        precision: str | None = None, graphs: str | None = None, engine_graphs: str | None = None) -> dict:
    """All three measurements; the ``results.json`` dict. With ``speculate``, the engine points also include
    ``oxygen`` at the last k with speculation on: random weights reject nearly every draft, so that point measures
    what speculation costs when it cannot help. ``graphs`` / ``engine_graphs``: the backend of the stages' graphs
    variant and of the extra engine point (None: :func:`default_graphs`; 'off': none)."""
    device = torch.device(device)
    graphs = graphs or default_graphs(device, engine=False)
    engine_graphs = engine_graphs or default_graphs(device, engine=True)
    model, onednn = build_model(config, preset, device, resolve_dtype(dtype, device), onednn=onednn)
    if precision:  # e.g. bfloat16_islands (engine/backends/precision.py)
        apply_precision(model, precision)
    res: dict = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_info(device),
                 "config": {"model": config, "preset": preset, "parameters": model.num_parameters(),
                            "onednn_linear": onednn, "dtype": dtype_name(model.dtype),
                            "precision": precision or dtype_name(model.dtype), "S": model.config.num_steps,
                            "H": model.config.action_horizon, "graphs": graphs, "engine_graphs": engine_graphs}}
    res["stages"] = stage_overhead(model, batches, repeats, prompt_len=benchmark_prompt_len(model), graphs=graphs)
    if frames:
        plan = make_plan([n], ["isolated", "oxygen"], ks, model.config.num_steps, Workload(max_new_tokens=n))
        last = plan[-1]
        if speculate:
            plan.append((dataclasses.replace(last[0], speculate=speculate), last[1]))
        if engine_graphs != "off":  # isolated and oxygen at the last k again, with graphs
            plan += [(dataclasses.replace(ec, graphs=engine_graphs), wl) for ec, wl in (plan[0], last)]
        points = measure_plan(model, plan, frames)
        isolated = {p["graphs"]: p for p in points if p["engine"] == "isolated"}
        for p in points:  # against isolated with the same graphs setting
            p |= vs_isolated(p, isolated[p["graphs"]])
        res["points"] = points
    if episodes:
        from oxygen_ros.bench.speculation import toy_memory_stream  # the toy model (not on a bare GPU machine)

        res["speculation"] = toy_memory_stream(episodes=episodes, speculate=speculate)
    return res


def summary(res: dict) -> str:
    """Markdown tables of the three parts."""
    g = res["config"].get("graphs", "off")
    lines = [f"| stage | eager ms (median) | fused ms (median) | graphs ({g}) ms | compute floor ms | fused speedup "
             "| graphs speedup | bound (eager / floor) | target | ATen ops eager / fused |", "|" + "---|" * 10]
    for name, s in res["stages"].items():
        target = TARGETS["decode" if name.startswith("decode") else name]
        gms = f"{1e3 * s['graphs_s']:.1f}" + (f" (B={s['graphs_bucket']})" if "graphs_bucket" in s else "") \
            if "graphs_s" in s else "-"
        gx = f"{s['graphs_speedup']:.2f}x" if "graphs_speedup" in s else "-"
        floor, bound = (f"{1e3 * s['floor_s']:.1f}", f"{s['bound']:.2f}x") if "floor_s" in s else ("-", "-")
        lines.append(f"| {name.replace('_B', ' B=')} | {1e3 * s['eager_s']:.1f} | {1e3 * s['fused_s']:.1f} | {gms} | "
                     f"{floor} | {s['speedup']:.2f}x | {gx} | {bound} | >= {target}x | "
                     f"{s['eager_ops']} / {s['fused_ops']} |")
    if "points" in res:
        lines += ["", "| engine | N | k | d | graphs | action Hz (mean) | action Hz (median) | tokens/s "
                  "| frame ms mean / median | stalls | speedup mean | speedup median |", "|" + "---|" * 12]
        for p in res["points"]:
            k = p["k"] if p["engine"] == "oxygen" else "-"
            lines.append(f"| {p['engine']} | {p['N']} | {k} | {p.get('speculate', 0)} | {p.get('graphs', 'off')} | "
                         f"{p['action_hz']:.2f} | "
                         f"{p['action_hz_median']:.2f} | "
                         f"{p['tokens_per_s']:.1f} | {p['frame_ms_mean']:.0f} / {p['frame_ms_median']:.0f} | "
                         f"{p['host_stalls']} | {p['speedup_vs_isolated']:.2f}x | "
                         f"{p['speedup_vs_isolated_median']:.2f}x |")
    if "speculation" in res:
        sp = res["speculation"]
        lines += ["", f"Toy memory stream ({sp.get('workload', 'every_frame')}), k={sp['k']}, "
                  f"N={sp['max_new_tokens']}, d={sp['speculate']}, "
                  f"{sp['frames']} frames; identical texts: {sp['identical_texts']}, identical chunks: "
                  f"{sp['same_chunks']}", "",
                  "| speculation | tokens/s | tokens/s of decode time | decode forwards | action Hz "
                  "| request latency (frames) | latency ms | acceptance |", "|---|---|---|---|---|---|---|---|"]
        for name in ("off", "on"):
            v = sp[name]
            acc = f"{v['acceptance_rate']:.2f}" if v["acceptance_rate"] is not None else "-"
            lines.append(f"| {name} | {v['tokens_per_s']:.1f} | {v['tokens_per_decode_s']:.0f} | "
                         f"{v['decode_forwards']} | {v['action_hz']:.1f} | "
                         f"{v['latency_frames_mean']:.2f} | {v['latency_ms_mean']:.0f} | {acc} |")
    return "\n".join(lines)


def plot(res: dict, path: Path) -> Path:
    """Stage speedups against their targets, engine frame times, speculation on/off."""
    parts = [k for k in ("stages", "points", "speculation") if k in res]
    fig, axes = subplots(1, len(parts), figsize=(5 * len(parts), 4))
    axes = [axes] if len(parts) == 1 else list(axes)
    ax = axes[0]
    names = list(res["stages"])
    st = res["stages"]
    graphs = res["config"].get("graphs", "off")
    ax.bar([i - 0.2 for i in range(len(names))], [st[n]["speedup"] for n in names], 0.4, color="tab:green",
           label="fused")
    ax.bar([i + 0.2 for i in range(len(names))], [st[n].get("graphs_speedup", 0.0) for n in names], 0.4,
           color="tab:purple", label=f"graphs ({graphs})")
    for i, n in enumerate(names):
        ax.hlines(TARGETS["decode" if n.startswith("decode") else n], i - 0.4, i + 0.4, colors="k", linestyles="--")
    bounded = [i for i, n in enumerate(names) if "bound" in st[n]]
    ax.scatter(bounded, [st[names[i]]["bound"] for i in bounded], marker="v", color="tab:red", zorder=3,
               label="bound: eager / compute floor")
    ax.set_xticks(range(len(names)), [n.replace("_B", "\nB=") for n in names])
    ax.set_ylabel("speedup over eager")
    ax.set_title("stages vs eager (dashed: target)")
    tops = [v for n in names for v in (st[n]["speedup"], st[n].get("graphs_speedup", 0.0), st[n].get("bound", 0.0),
                                       TARGETS["decode" if n.startswith("decode") else n])]
    ax.set_ylim(0, 1.45 * max(tops))  # room for the legend above the bars
    ax.legend(loc="upper left", fontsize="small")
    if "points" in res:
        ax = axes[parts.index("points")]
        pts = res["points"]
        labels = [(f"{p['engine']}\nk={p['k']}" + (f" d={p['speculate']}" if p.get("speculate") else "")
                   if p["engine"] == "oxygen" else p["engine"])
                  + (f"\n{p['graphs']}" if p.get("graphs", "off") != "off" else "") for p in pts]
        x = range(len(pts))
        ax.bar([i - 0.2 for i in x], [p["frame_ms_mean"] for p in pts], 0.4, label="mean")
        ax.bar([i + 0.2 for i in x], [p["frame_ms_median"] for p in pts], 0.4, label="median")
        ax.set_xticks(list(x), labels)
        ax.set_ylabel("frame ms")
        ax.set_title(f"N={pts[0]['N']}: frame time")
        ax.legend()
    if "speculation" in res:
        ax = axes[parts.index("speculation")]
        sp = res["speculation"]
        vals = [(sp["off"]["tokens_per_s"], sp["on"]["tokens_per_s"]),
                (sp["off"]["latency_frames_mean"], sp["on"]["latency_frames_mean"])]
        ax.bar([0 - 0.2, 1 - 0.2], [v[0] / v[0] for v in vals], 0.4, label="off")
        ax.bar([0 + 0.2, 1 + 0.2], [v[1] / v[0] for v in vals], 0.4, label="on")
        ax.set_xticks([0, 1], ["tokens/s", "latency (frames)"])
        ax.set_ylabel("relative to off")
        ax.set_title(f"toy memory stream, d={sp['speculate']}")
        ax.legend()
    fig.suptitle(f"{res['config']['model']}/{res['config']['preset']}, {res['machine']['threads']} thread(s)")
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="small")
    ap.add_argument("--preset", default="libero")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 6, 30])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--N", type=int, default=30)
    ap.add_argument("--k", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--frames", type=int, default=12, help="measured frames per engine point (0: skip)")
    ap.add_argument("--episodes", type=int, default=4, help="toy episodes for speculation (0: skip)")
    ap.add_argument("--speculate", type=int, default=8)
    ap.add_argument("--graphs", default=None, choices=["off", "static", "cuda", "compile"],
                    help="backend of the stages' graphs variant (default: cuda on CUDA, compile on CPU)")
    ap.add_argument("--engine-graphs", default=None, choices=["off", "static", "cuda", "compile"],
                    help="backend of the extra graphs engine point (default: cuda on CUDA, static on CPU)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--no-onednn", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="float32 | bfloat16 (default: bfloat16 on CUDA, else float32)")
    ap.add_argument("--precision", default=None, choices=sorted(PRECISIONS),
                    help="precision policy applied after building (bfloat16_islands: openpi's float32 islands)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    res = run(a.config, a.preset, a.batches, a.repeats, a.N, a.k, a.frames, a.episodes, a.speculate,
              onednn=not a.no_onednn, device=a.device, dtype=a.dtype, precision=a.precision, graphs=a.graphs,
              engine_graphs=a.engine_graphs)
    write_run(a.out, res, summary(res), plot, "frame_overhead.png")


if __name__ == "__main__":
    main()
