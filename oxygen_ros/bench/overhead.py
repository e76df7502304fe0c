"""Fused vs eager stages side by side: prefill, the S-step denoise loop and decode steps per batch size, and the
static-shape steps of ``engine/backends/graphs.py`` (captured CUDA graphs, torch.compile or plain static shapes)
beside them.

Every repeat runs each variant once, alternating (A B A B ...), so a noisy host slows both alike; the speedup is
the median of the per-repeat ratios (and the ratio of the medians is kept beside it).

Beside them, each stage's **compute floor**: the time its matrix products and attention kernels take inside the
fused stage (profiler self time, one profiled call per round; on CUDA every kernel's device time, the busy time that no
removal of launch overhead goes below). Removing every other cost cannot make the stage faster than that on this
host, so ``eager / floor`` bounds what fusing, compiling or capturing can reach here.
"""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from oxygen_ros.bench.observation import dummy_observation
from oxygen_ros.bench.paired import paired, ratio
from oxygen_ros.engine import KVCache, Pi05Model
from oxygen_ros.engine.backends.graphs import FrameGraphs, resolve_backend
from oxygen_ros.engine.timing import synchronize

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
