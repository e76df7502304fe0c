"""The paper's evaluation (Figures 4-7 and 9-12, Tables 1/3/4/6/7) as one resumable, plotted benchmark sweep.

    python -m oxygen_ros.bench.sweep --suite all --mode quick --config small --out runs/sweep
    python -m oxygen_ros.bench.sweep --suite headline memory --config pi05 --device cuda --compile off default

Suites (``--suite``, several allowed; ``all`` = every suite). N = tokens per request, k = decode budget per frame,
S = denoise steps, E = action experts; libero preset and S = 10 unless a suite varies them:

  headline  N=30: isolated, oxygen k=1, k=5; N=5: isolated, shared_kv (issue targets; scripts/gpu_bench.sh)
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
``GRIDS``), 20 measured frames per point (60 for auto): 228 points, 182 measured, about an hour with ``small``.
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
import gc
import importlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import nn

from oxygen_ros.bench import cli  # noqa: E402
from oxygen_ros.bench.progress import progress_bar  # noqa: E402
from oxygen_ros.bench.runner import machine_info, run_point, warmup_frames  # noqa: E402
from oxygen_ros.engine import Pi05Model, get_config  # noqa: E402
from oxygen_ros.engine.checkpoint import init_random_weights  # noqa: E402
from oxygen_ros.engine.cpu_kernels import use_onednn  # noqa: E402
from oxygen_ros.engine.engine import EngineConfig  # noqa: E402
from oxygen_ros.engine.heads import make_extra_heads  # noqa: E402
from oxygen_ros.engine.workload import Workload  # noqa: E402
from oxygen_ros.tools.profile import DTYPES, profile_stages  # noqa: E402

SUITES = ("headline", "tradeoff", "speedup", "ablation", "arrivals", "overhead", "memory", "stages", "auto", "heads")
COMPILE_MODES = ("off", "default", "max-autotune-no-cudagraphs")
PROFILE_BATCHES = (1, 2, 4, 6, 8, 16, 32)


# ---------------------------------------------------------------------------------------------- grids
@dataclass(frozen=True)
class Grid:
    """Parameter grids of one mode (defaults: the paper's full grids)."""

    frames: int = 20
    auto_frames: int = 60
    profile_repeats: int = 5
    tradeoff_N: tuple[int, ...] = (5, 10, 15, 20, 30)
    tradeoff_k: tuple[int, ...] = (1, 5, 10)
    presets: tuple[str, ...] = ("libero", "droid", "aloha")
    speedup_S: tuple[int, ...] = (5, 10, 15, 20)
    speedup_k: tuple[int, ...] = (1, 5)
    speedup_N: tuple[int, ...] = (5, 10, 15, 20, 30)  # Fig 10 (k=5); empty: skip
    ablation_N: tuple[int, ...] = (5, 10, 15, 20, 30)
    uniform_periods: tuple[int, ...] = (1, 2, 3, 4)  # one request every p frames (1: every frame)
    poisson_rates: tuple[float, ...] = (0.5, 1.0, 2.0)
    random_lengths: tuple[tuple[int, int], ...] = ((5, 30), (1, 60))
    bursts: tuple[int, ...] = (2, 4, 8)  # b requests every b frames (mean rate 1)
    overhead_k: tuple[int, ...] = (1, 2, 3, 5, 10, 15, 30)
    memory_k: tuple[int, ...] = (1, 5)
    stages_N: tuple[int, ...] = (1, 5, 10, 20, 30)
    auto_k: tuple[int | str, ...] = ("auto", 1, 2, 5, 10)
    auto_burst: int = 8
    heads: tuple[int, ...] = (1, 2, 3, 4)
    heads_k: tuple[int, ...] = (1, 5)


GRIDS = {
    "full": Grid(),
    "quick": Grid(frames=4, auto_frames=12, profile_repeats=3, tradeoff_N=(5, 15, 30), speedup_S=(10,),
                  speedup_N=(), ablation_N=(5, 15, 30), uniform_periods=(1, 2, 4), poisson_rates=(1.0,),
                  random_lengths=((5, 30),), bursts=(4,), overhead_k=(1, 5, 10), stages_N=(1, 5, 15, 30),
                  auto_k=("auto", 1, 5), heads=(1, 2, 4), heads_k=(5,)),
}


# ---------------------------------------------------------------------------------------------- points
@dataclass(frozen=True)
class Point:
    """One measurement. Every field but ``suite`` is a parameter of what is measured."""

    suite: str
    engine: str  # isolated | shared_kv | oxygen | parallel | profile
    preset: str = "libero"
    S: int = 10
    N: int = 30  # tokens per request (0: no language at all, the oracle)
    k: int | str | None = None  # oxygen only
    workload: str = "every_frame"  # runner kinds, or "none" (no requests)
    period: int = 1
    burst: int = 0
    rate: float = 1.0
    min_tokens: int = 0  # random_length: N is the maximum
    heads: int = 1  # action experts (the paper's E counts the language expert too: E = heads + 1)
    deadline: str | None = None  # "1.3x" (of prefill + denoise) or "120ms"
    frames: int = 4
    config: str = "small"
    device: str = "cpu"
    dtype: str = "float32"
    compile: str = "off"
    onednn: bool = True
    seed: int = 0

    def params(self) -> dict:
        d = asdict(self)
        d.pop("suite")
        return d

    @property
    def key(self) -> str:
        """What is measured, independent of the suite (points with the same key are measured once)."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.params().items()))

    @property
    def id(self) -> str:
        """Stable id: the suite and every parameter."""
        return f"{self.suite}:{self.key}"

    @property
    def model_key(self) -> tuple[str, int]:
        """Points sharing a model instance (S, k, N and the workload are engine parameters)."""
        return self.preset, COMPILE_MODES.index(self.compile)


def headline(base: Point, g: Grid) -> list[Point]:
    p = replace(base, suite="headline", frames=g.frames)
    return [replace(p, engine="isolated"), replace(p, engine="oxygen", k=1), replace(p, engine="oxygen", k=5),
            replace(p, engine="isolated", N=5), replace(p, engine="shared_kv", N=5)]


def tradeoff(base: Point, g: Grid) -> list[Point]:
    p = replace(base, suite="tradeoff", frames=g.frames)
    return [replace(p, engine="isolated", N=n) for n in g.tradeoff_N] + [
        replace(p, engine="oxygen", N=n, k=k) for k in g.tradeoff_k for n in g.tradeoff_N]


def speedup(base: Point, g: Grid) -> list[Point]:
    p = replace(base, suite="speedup", frames=g.frames)
    out = []
    for preset in g.presets:
        for s in g.speedup_S:
            q = replace(p, preset=preset, S=s)
            out += [replace(q, engine="isolated")] + [replace(q, engine="oxygen", k=k) for k in g.speedup_k]
            for n in g.speedup_N:  # Fig 10: k = 5 across N
                out += [replace(q, engine="isolated", N=n), replace(q, engine="oxygen", N=n, k=5)]
    return list(dict.fromkeys(out))


def ablation(base: Point, g: Grid) -> list[Point]:
    p = replace(base, suite="ablation", frames=g.frames)
    out = [replace(p, engine="oxygen", N=0, workload="none")]  # oracle: frames with no language request
    for n in g.ablation_N:
        out += [replace(p, engine="isolated", N=n), replace(p, engine="shared_kv", N=n),
                replace(p, engine="oxygen", N=n, k=5)]
    return out


def arrivals(base: Point, g: Grid) -> list[Point]:
    p = replace(base, suite="arrivals", frames=g.frames, engine="oxygen", k=5)
    out = [replace(p, engine="isolated", k=None)]  # the dashed baseline: one 30-token request per frame
    out += [replace(p, workload="every_n", period=t) if t > 1 else p for t in g.uniform_periods]
    out += [replace(p, workload="poisson", rate=r) for r in g.poisson_rates]
    out += [replace(p, workload="random_length", min_tokens=lo, N=hi) for lo, hi in g.random_lengths]
    out += [replace(p, workload="burst", burst=b, period=b) for b in g.bursts]
    return out


def overhead(base: Point, g: Grid) -> list[Point]:
    p = replace(base, suite="overhead", frames=g.frames, engine="oxygen")
    return [replace(p, k=k) for k in g.overhead_k]


def memory(base: Point, g: Grid) -> list[Point]:
    p = replace(base, suite="memory", frames=g.frames)
    # parallel deep-copies the model; a compiled module's copy would still call the original's compiled forward
    engines = ("isolated", "shared_kv", "parallel") if base.compile == "off" else ("isolated", "shared_kv")
    return [replace(p, engine=e) for e in engines] + [
        replace(p, engine="oxygen", k=k) for k in g.memory_k]


def stages(base: Point, g: Grid) -> list[Point]:
    p = replace(base, suite="stages", frames=g.frames)
    return [replace(p, engine=e, N=n) for n in g.stages_N for e in ("shared_kv", "isolated")]


def auto(base: Point, g: Grid, deadline: str) -> list[Point]:
    p = replace(base, suite="auto", frames=g.auto_frames, engine="oxygen", workload="burst", burst=g.auto_burst,
                period=g.auto_burst, deadline=deadline)
    return [replace(p, k=k) for k in g.auto_k]


def heads(base: Point, g: Grid) -> list[Point]:
    p = replace(base, suite="heads", frames=g.frames)
    out = []
    for e in g.heads:
        out += [replace(p, engine="isolated", heads=e)] + [replace(p, engine="oxygen", k=k, heads=e)
                                                           for k in g.heads_k]
    return out


def profile_point(base: Point, preset: str, g: Grid) -> Point:
    """Stage costs of one model (prefill, denoise, decode per batch): predictions and the auto deadline."""
    return replace(base, suite="profile", engine="profile", preset=preset, N=0, frames=g.profile_repeats)


def build_plan(suites: Iterable[str], g: Grid, base: Point, frames: int | None = None,
               compile_modes: Iterable[str] = ("off",), deadline: str = "1.3x") -> list[Point]:
    """The points of ``suites`` for every compile mode (one profile point per model first), in a stable order."""
    makers: dict[str, Callable[[Point, Grid], list[Point]]] = {
        "headline": headline, "tradeoff": tradeoff, "speedup": speedup, "ablation": ablation,
        "arrivals": arrivals, "overhead": overhead, "memory": memory, "stages": stages,
        "auto": lambda b, gr: auto(b, gr, deadline), "heads": heads}
    points: list[Point] = []
    for mode in compile_modes:
        for suite in suites:
            points += makers[suite](replace(base, compile=mode), g)
    if frames:
        points = [replace(p, frames=frames) for p in points]
    models = dict.fromkeys((p.preset, p.compile) for p in points)
    profiles = [profile_point(replace(base, compile=c), preset, g) for preset, c in models]
    return list(dict.fromkeys(profiles + points))


# ---------------------------------------------------------------------------------------------- engine inputs
def make_workload(p: Point) -> Workload:
    """The runner's workload for a point ("none": no language request at all)."""
    if p.workload == "none":
        return Workload(kind="burst", burst_size=0, max_new_tokens=p.N, seed=p.seed)
    if p.workload == "random_length":
        return Workload(kind="random_length", max_new_tokens=p.N, min_tokens=p.min_tokens, max_tokens=p.N,
                        seed=p.seed)
    return Workload(kind=p.workload, max_new_tokens=p.N, period=p.period, burst_size=p.burst, rate=p.rate,
                    seed=p.seed)


def inflight_bound(p: Point) -> int:
    """Pool size for oxygen: cli.pool_size for one request per frame, widened for faster or bursty arrivals."""
    if p.engine != "oxygen" or p.N == 0:
        return 1
    k = p.k if p.k is not None else 1
    steady = math.ceil(p.N / k) if isinstance(k, int) else p.N
    rate = {"every_n": 1 / p.period, "poisson": p.rate, "burst": p.burst / max(p.period, 1)}.get(p.workload, 1.0)
    extra = p.burst + math.ceil(max(rate - 1, 0) * steady)
    if p.workload == "poisson":
        extra += math.ceil(3 * math.sqrt(rate * steady))  # three standard deviations of the in-flight count
    return cli.pool_size(p.N, k, extra)


def engine_config(p: Point, deadline_s: float | None = None) -> EngineConfig:
    return EngineConfig(mode=p.engine, num_steps=p.S, k=p.k if p.k is not None else 1, deadline_s=deadline_s,
                        eos_id=-1, max_new_tokens=max(p.N, 1), max_inflight=inflight_bound(p))


def units(p: Point) -> int:
    """Progress-bar units of a point: its frames including warm-up (profile: its repeats)."""
    if p.engine == "profile":
        return p.frames
    return warmup_frames(engine_config(p), make_workload(p)) + p.frames


def label(p: Point) -> str:
    k = f" k={p.k}" if p.k is not None else ""
    return f"{p.suite} {p.engine}{k} N={p.N} {p.preset} S={p.S}" + (f" E={p.heads}" if p.heads > 1 else "")


# ---------------------------------------------------------------------------------------------- records
class PointStore:
    """``points.jsonl``: one JSON record per finished point, appended as soon as it is measured."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: dict[str, dict] = {}
        self._measured: dict[str, str] = {}  # measurement key -> id of the record that measured it
        if path.exists():
            text = path.read_text()
            if text and not text.endswith("\n"):  # a run killed mid-write: keep the next record on its own line
                with path.open("a") as f:
                    f.write("\n")
            for line in text.splitlines():
                try:
                    self._index(json.loads(line))
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn line: that point simply runs again

    def _index(self, rec: dict) -> None:
        self.records[rec["id"]] = rec
        if not rec.get("shared_with"):
            self._measured.setdefault(rec["key"], rec["id"])

    def __contains__(self, point_id: str) -> bool:
        return point_id in self.records

    def measured(self, key: str) -> dict | None:
        """A finished record measuring ``key`` (from any suite), if any."""
        rid = self._measured.get(key)
        return self.records[rid] if rid else None

    def append(self, rec: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
        self._index(rec)


def shared_record(p: Point, measured: dict) -> dict:
    """The record of ``p`` reusing a measurement taken for another suite."""
    return {**measured, "id": p.id, "suite": p.suite, "shared_with": measured["id"]}


# ---------------------------------------------------------------------------------------------- models
def build_model(config: str, preset: str, device: torch.device, dtype: torch.dtype, seed: int) -> Pi05Model:
    """Random-weight pi0.5 built directly on ``device`` and cast before the (CPU-generated) init is copied in."""
    cfg = get_config(config, preset)
    with torch.device(device):
        model = Pi05Model(cfg)
    return init_random_weights(model.to(dtype=dtype), seed=seed).eval()


def compile_modules(roots: Iterable[nn.Module], mode: str, backend: str = "inductor") -> int:
    """torch.compile, in place, the pieces with static or few shapes; returns how many were compiled."""
    from oxygen_ros.engine.layers import AdaRMSNorm, GemmaMLP, RMSNorm, SiglipVisionTower

    cfg = torch._dynamo.config
    limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, limit, max(getattr(cfg, limit), 64))  # one entry per distinct (module class, width, shape kind)
    kwargs = {"backend": backend} | ({"mode": mode} if backend == "inductor" else {})
    n = 0
    for root in roots:
        for m in root.modules():
            if isinstance(m, SiglipVisionTower | GemmaMLP | RMSNorm | AdaRMSNorm):
                m.compile(**kwargs)
                n += 1
    return n


class ModelPool:
    """The model of the current (preset, compile) group and its extra action heads, built once per group."""

    def __init__(self, device: torch.device, dtype: torch.dtype, compile_backend: str = "inductor") -> None:
        self.device, self.dtype, self.backend = device, dtype, compile_backend
        self.model: Pi05Model | None = None
        self.extra: nn.ModuleList | None = None
        self.point: Point | None = None  # the point the model was built for
        self.info: dict = {}

    def get(self, p: Point) -> tuple[Pi05Model, nn.ModuleList | None]:
        """The model for ``p`` and its ``p.heads - 1`` extra action heads (None for one head)."""
        cur = self.point
        if cur is None or (cur.preset, cur.config, cur.seed) != (p.preset, p.config, p.seed) or (
                cur.compile != p.compile and (cur.compile != "off" or self.info["onednn_linear"])):
            self._build(p)
        elif cur.compile != p.compile:  # off -> compiled: compile the same weights in place
            self._compile(p.compile)
        self.point = p
        if p.heads > 1 and (self.extra is None or len(self.extra) < p.heads - 1):
            self._build_heads(p.heads - 1)
        return self.model, (self.extra[:p.heads - 1] if p.heads > 1 else None)

    def _build(self, p: Point) -> None:
        self.release()
        t0 = time.perf_counter()
        self.model = build_model(p.config, p.preset, self.device, self.dtype, p.seed)
        onednn = p.onednn and p.compile == "off" and self.device.type == "cpu" and self.dtype == torch.float32
        onednn = onednn and use_onednn(self.model) > 0
        cfg = self.model.config
        self.info = {"name": cfg.name, "preset": p.preset, "parameters": self.model.num_parameters(),
                     "dtype": str(self.dtype).replace("torch.", ""), "onednn_linear": onednn, "compile": "off",
                     "compiled_modules": 0, "build_s": round(time.perf_counter() - t0, 2), "config": cfg.to_dict()}
        self.point = p
        if p.compile != "off":
            self._compile(p.compile)

    def _compile(self, mode: str) -> None:
        roots = [self.model] + ([self.extra] if self.extra is not None else [])
        self.info = {**self.info, "compile": mode, "compiled_modules": compile_modules(roots, mode, self.backend)}

    def _build_heads(self, count: int) -> None:
        cfg, seed = self.model.config, self.point.seed
        extra = init_random_weights(make_extra_heads(cfg, count), seed=seed + 1)
        self.extra = extra.to(device=self.device, dtype=self.dtype).eval()
        if self.info["onednn_linear"]:
            use_onednn(self.extra)
        if self.info["compile"] != "off":
            compile_modules([self.extra], self.info["compile"], self.backend)

    def release(self) -> None:
        self.model = self.extra = self.point = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- measuring
@contextmanager
def cuda_peak(device: torch.device, into: dict) -> Iterator[None]:
    """On CUDA, ``into["cuda_peak_bytes"]``: torch.cuda.max_memory_allocated over the block (model included)."""
    cuda = device.type == "cuda"
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        into["cuda_resident_bytes"] = torch.cuda.memory_allocated(device)
    yield
    if cuda:
        into["cuda_peak_bytes"] = torch.cuda.max_memory_allocated(device)


def deadline_seconds(p: Point, profile: dict | None) -> float | None:
    """``"120ms"`` as is; ``"1.3x"``: that factor of the profiled prefill + denoise (at the point's S)."""
    if not p.deadline:
        return None
    if p.deadline.endswith("ms"):
        return float(p.deadline[:-2]) / 1e3
    if profile is None:
        raise RuntimeError(f"{p.id}: a relative deadline needs the model's profile point")
    denoise = profile["denoise_s"] / profile["num_steps"] * p.S
    return float(p.deadline[:-1]) * (profile["prefill_s"] + denoise)


def measure(p: Point, pool: ModelPool, profile: dict | None, tick: Callable[[], None]) -> dict:
    """Run one point; returns its measurements (run_point's record, or the stage profile)."""
    model, extra = pool.get(p)
    if p.engine == "profile":
        prompt = min(model.config.max_token_len, 48)  # the prompt run_point's observation has
        prof = profile_stages(model, list(PROFILE_BATCHES), repeats=p.frames, prompt_len=prompt)
        for _ in range(p.frames):
            tick()
        return {"profile": {**prof, "num_steps": model.config.num_steps}}
    deadline = deadline_seconds(p, profile)
    extras: dict = {"deadline_ms": 1e3 * deadline if deadline else None}
    trace: dict[str, list] | None = {} if p.suite == "auto" else None

    def on_frame(res) -> None:
        tick()
        if trace is not None:  # per-frame record (warm-up included) for the k=auto plot
            for name, value in (("frame_ms", round(1e3 * res.timings["frame"], 3)), ("backlog", res.inflight),
                                ("decode_steps", res.decode_steps)):
                trace.setdefault(name, []).append(value)

    with cuda_peak(pool.device, extras):
        rec = run_point(model, engine_config(p, deadline), make_workload(p), p.frames, p.seed, heads=extra,
                        on_frame=on_frame)
    if trace is not None:
        extras["trace"] = {**trace, "warmup": len(trace["frame_ms"]) - p.frames}
    return {**rec, **extras, "k": p.k}


# ---------------------------------------------------------------------------------------------- derived numbers
BASELINE = {"engine": "isolated", "k": None, "workload": "every_frame", "period": 1, "burst": 0, "rate": 1.0,
            "min_tokens": 0, "deadline": None}
ORACLE = {**BASELINE, "engine": "oxygen", "N": 0, "workload": "none"}
TARGETS = {  # issue 4 (CPU figures; the paper's GPU figure at k=5 is 3.7x)
    "N30_k1": 2.5, "N30_k5": 2.0, "N5_shared_kv": 1.3, "manager_share_max": 0.01, "oxygen_memory_x": 1.1}


def point_of(rec: dict) -> Point:
    return Point(suite=rec["suite"], **rec["params"])


def normalized_profile(prof: dict) -> dict:
    """A profile read back from JSON: integer batch sizes again."""
    return {**prof, "decode_step_s": {int(b): t for b, t in prof["decode_step_s"].items()}}


def predicted_ms(rec: dict, p: Point, prof: dict | None) -> float | None:
    """cli.predict_frame_s at the point's S, where the stage model applies (one request per frame, one head)."""
    if prof is None or p.workload != "every_frame" or p.heads != 1 or p.N == 0:
        return None
    at_s = {**prof, "denoise_s": prof["denoise_s"] / prof["num_steps"] * p.S}
    return 1e3 * cli.predict_frame_s(rec, at_s)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def add_derived(records: list[dict]) -> None:
    """In place: predictions, and ratios against isolated (same N / preset / S / E), the oracle and compile off."""
    by_key: dict[str, dict] = {}
    for r in records:
        by_key.setdefault(r["key"], r)
    profiles = {(r["params"]["preset"], r["params"]["compile"]): normalized_profile(r["profile"])
                for r in records if "profile" in r}
    runs = [r for r in records if "profile" not in r]
    for r in runs:
        p = point_of(r)
        r["predicted_frame_ms"] = predicted_ms(r, p, profiles.get((p.preset, p.compile)))
        r["measured_over_predicted"] = _ratio(r["frame_ms_mean"], r["predicted_frame_ms"])
    for r in runs:
        p = point_of(r)
        base = by_key.get(replace(p, **BASELINE).key)
        oracle = by_key.get(replace(p, **ORACLE).key)
        off = by_key.get(replace(p, compile="off").key) if p.compile != "off" else None
        r["speedup_vs_isolated"] = _ratio(base and base["frame_ms_mean"], r["frame_ms_mean"])
        r["token_rate_vs_isolated"] = _ratio(r["tokens_per_s"], base and base["tokens_per_s"])
        r["memory_vs_isolated"] = _ratio(r["memory_bytes"], base and base["memory_bytes"])
        r["cuda_peak_vs_isolated"] = _ratio(r.get("cuda_peak_bytes"), base and base.get("cuda_peak_bytes"))
        r["predicted_speedup"] = _ratio(base and base["predicted_frame_ms"], r["predicted_frame_ms"])
        r["action_hz_vs_oracle"] = _ratio(r["action_hz"], oracle and oracle["action_hz"]) if p.N else None
        r["speedup_vs_compile_off"] = _ratio(off and off["frame_ms_mean"], r["frame_ms_mean"])


def workload_label(p: dict) -> str:
    kind = p["workload"]
    return {"every_frame": "every frame", "none": "no language", "every_n": f"every {p['period']} frames",
            "poisson": f"Poisson {p['rate']:g}/frame", "random_length": f"N~U[{p['min_tokens']},{p['N']}]",
            "burst": f"{p['burst']} every {p['period']} frames"}[kind]


def row(r: dict) -> dict:
    """The flat view of a record the tables and plots use."""
    p, st = r["params"], r.get("stage_ms", {})
    gib = 1 / 2**30
    out = {"suite": r["suite"], "engine": p["engine"], "k": p["k"], "N": p["N"], "S": p["S"], "preset": p["preset"],
           "E": p["heads"], "workload": workload_label(p), "compile": p["compile"], "frames": r.get("frames"),
           "action_hz": r.get("action_hz"), "tokens_per_s": r.get("tokens_per_s"),
           "frame_ms": r.get("frame_ms_mean"), "p99_ms": r.get("frame_ms_p99"),
           "prefill_ms": st.get("prefill"), "language_prefill_ms": st.get("language_prefill"),
           "denoise_ms": st.get("denoise"), "decode_ms": st.get("decode"), "manager_ms": st.get("manager"),
           "manager_pct": 100 * r["manager_share"] if "manager_share" in r else None,
           "batch_mean": r.get("batch_mean"), "batch_max": r.get("batch_max"),
           "speedup": r.get("speedup_vs_isolated"), "token_x": r.get("token_rate_vs_isolated"),
           "predicted_x": r.get("predicted_speedup"), "meas_over_pred": r.get("measured_over_predicted"),
           "vs_oracle": r.get("action_hz_vs_oracle"), "vs_compile_off": r.get("speedup_vs_compile_off"),
           "memory_gib": r["memory_bytes"] * gib if "memory_bytes" in r else None,
           "memory_x": r.get("memory_vs_isolated"),
           "cuda_peak_gib": r["cuda_peak_bytes"] * gib if r.get("cuda_peak_bytes") else None,
           "cuda_peak_x": r.get("cuda_peak_vs_isolated"), "deadline_ms": r.get("deadline_ms"),
           "misses": r.get("deadline_misses"), "rejected": r.get("rejected"), "backlog_end": r.get("backlog_end")}
    if out["speedup"] and p["engine"] == "shared_kv":
        out["e2e_reduction_pct"] = 100 * (1 - 1 / out["speedup"])
    trace = r.get("trace")
    if trace:
        measured = trace["backlog"][trace["warmup"]:]
        out["backlog_mean"] = sum(measured) / max(len(measured), 1)
        out["backlog_max"] = max(trace["backlog"])
        out["misses_all_frames"] = sum(t > (r["deadline_ms"] or math.inf) for t in trace["frame_ms"])
        out["trace_frames"] = len(trace["frame_ms"])
    return out


COMMON = ["engine", "k", "N", "action_hz", "tokens_per_s", "frame_ms", "speedup", "token_x"]
COLUMNS = {
    "headline": COMMON + ["p99_ms", "predicted_x", "meas_over_pred", "manager_pct", "batch_mean", "memory_x",
                          "cuda_peak_x", "compile", "vs_compile_off"],
    "tradeoff": COMMON + ["p99_ms", "predicted_x", "meas_over_pred", "batch_mean", "compile"],
    "speedup": ["preset", "S", *COMMON, "predicted_x", "compile"],
    "ablation": COMMON + ["vs_oracle", "prefill_ms", "language_prefill_ms", "denoise_ms", "decode_ms", "compile"],
    "arrivals": ["workload", *COMMON, "batch_mean", "batch_max", "rejected", "compile"],
    "overhead": ["engine", "k", "N", "batch_mean", "batch_max", "manager_ms", "frame_ms", "manager_pct", "compile"],
    "memory": ["engine", "k", "N", "memory_gib", "memory_x", "cuda_peak_gib", "cuda_peak_x", "frame_ms", "compile"],
    "stages": ["engine", "N", "prefill_ms", "language_prefill_ms", "denoise_ms", "decode_ms", "frame_ms",
               "e2e_reduction_pct", "compile"],
    "auto": ["k", "deadline_ms", "frame_ms", "p99_ms", "misses", "frames", "misses_all_frames", "trace_frames",
             "backlog_mean", "backlog_max", "rejected", "action_hz", "tokens_per_s", "compile"],
    "heads": ["E", *COMMON, "compile"],
}


def heatmaps(rows: list[dict]) -> dict:
    """Speedup grids per compile mode and preset: S x k at N=30 (Fig 5) and S x N at k=5 (Fig 10)."""
    maps: dict = {}
    for axis, fixed in (("k", {"N": 30}), ("N", {"k": 5})):
        for r in rows:
            if r["engine"] != "oxygen" or r["speedup"] is None or any(r[f] != v for f, v in fixed.items()):
                continue
            cell = maps.setdefault(axis, {}).setdefault(r["compile"], {}).setdefault(r["preset"], {})
            cell.setdefault(str(r["S"]), {})[str(r[axis])] = r["speedup"]
    return maps


def headline_numbers(rows: list[dict]) -> dict:
    """The issue's target numbers per compile mode (libero, S=10, one head, one request per frame)."""
    out = {}
    for mode in dict.fromkeys(r["compile"] for r in rows):
        rs = [r for r in rows if r["compile"] == mode and r["preset"] == "libero" and r["S"] == 10 and r["E"] == 1
              and r["workload"] == "every frame"]
        pick = {(r["engine"], r["k"], r["N"]): r for r in rs}
        h: dict = {}
        for name, key in (("N30_k1", ("oxygen", 1, 30)), ("N30_k5", ("oxygen", 5, 30))):
            if key in pick:
                r = pick[key]
                h[name] = {"speedup": r["speedup"], "token_x": r["token_x"], "predicted_x": r["predicted_x"],
                           "pass": bool(r["speedup"] and r["token_x"] and min(r["speedup"], r["token_x"])
                                        >= TARGETS[name])}
        if ("shared_kv", None, 5) in pick:
            s = pick["shared_kv", None, 5]["speedup"]
            h["N5_shared_kv"] = {"speedup": s, "pass": bool(s and s >= TARGETS["N5_shared_kv"])}
        shares = [r["manager_pct"] / 100 for r in rs if r["engine"] == "oxygen" and r["manager_pct"] is not None]
        if shares:
            h["manager_share_max"] = {"value": max(shares), "pass": max(shares) < TARGETS["manager_share_max"]}
        for engine in ("oxygen", "parallel"):
            mem = [r["memory_x"] for r in rs if r["engine"] == engine and r["memory_x"]]
            peak = [r["cuda_peak_x"] for r in rs if r["engine"] == engine and r["cuda_peak_x"]]
            if mem:
                h[f"{engine}_memory_x"] = {"engine_bytes": max(mem), "cuda_peak": max(peak) if peak else None}
        if "oxygen_memory_x" in h:
            m = h["oxygen_memory_x"]
            m["pass"] = (m["cuda_peak"] or m["engine_bytes"]) <= TARGETS["oxygen_memory_x"]
        out[mode] = h
    return out


def summarize(records: list[dict], meta: dict) -> dict:
    """summary.json: the records of this invocation with derived numbers, per-suite tables, heatmaps, targets."""
    add_derived(records)
    runs = [r for r in records if "profile" not in r]
    rows = [row(r) for r in runs]
    tables = {}
    for suite in dict.fromkeys(r["suite"] for r in runs):
        tables[suite] = [{c: rw.get(c) for c in COLUMNS[suite]} for rw in rows if rw["suite"] == suite]
    profiles = {f"{r['params']['preset']}/{r['params']['compile']}": r["profile"] for r in records if "profile" in r}
    return {**meta, "targets": TARGETS, "headline": headline_numbers(rows), "profiles": profiles, "tables": tables,
            "heatmaps": heatmaps([rw for rw in rows if rw["suite"] == "speedup"]), "points": records}


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def target_line(name: str, d: dict) -> str:
    """One line of the target check, e.g. ``N30_k1: 2.9x frame rate, 2.9x tokens/s (target >= 2.5x): PASS``."""
    verdict = "" if "pass" not in d else (": PASS" if d["pass"] else ": MISS")
    goal = TARGETS.get(name)
    if "speedup" in d:
        tokens = f", {_fmt(d['token_x'])}x tokens/s" if "token_x" in d else ""
        return f"{name}: {_fmt(d['speedup'])}x action frequency{tokens} (target >= {goal}x){verdict}"
    if "value" in d:
        return f"{name}: {100 * d['value']:.2f}% of the frame (target < {100 * goal:g}%){verdict}"
    goal = f" (target <= {goal}x)" if goal else ""
    return f"{name}: {_fmt(d['engine_bytes'])}x weights + KV, CUDA peak {_fmt(d['cuda_peak'])}x{goal}{verdict}"


def markdown(summary: dict) -> str:
    """summary.md: machine, config, the target checks and one table per suite."""
    m, c = summary["machine"], summary["context"]
    lines = [f"# Sweep ({summary['mode']}): {c['config']} {c['dtype']} on {m['device']} "
             f"({m.get('gpu') or m['processor']}, {m['threads']} threads, torch {m['torch']})", ""]
    for mode, h in summary["headline"].items():
        lines.append(f"Issue targets (libero, S=10), compile={mode}:")
        lines += [f"- {target_line(name, d)}" for name, d in h.items()]
    for suite, rows in summary["tables"].items():
        if not rows:
            continue
        cols = list(rows[0])
        lines += ["", f"## {suite}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(_fmt(rw[c]) for c in cols) + " |" for rw in rows]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
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
    device = torch.device(args.device)
    dtype_name = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    onednn = device.type == "cpu" and dtype_name == "float32" and not args.no_onednn
    base = Point(suite="", engine="", config=args.config, device=device.type, dtype=dtype_name, onednn=onednn,
                 seed=args.seed)
    suites = SUITES if "all" in args.suite else tuple(dict.fromkeys(args.suite))
    deadline = f"{args.deadline_ms:g}ms" if args.deadline_ms else f"{args.deadline_factor:g}x"
    plan = build_plan(suites, GRIDS[args.mode], base, args.frames, dict.fromkeys(args.compile), deadline)
    return plan, device, DTYPES[dtype_name]


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
            bar.set_postfix_str(label(p))
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


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    plan, device, dtype = plan_from_args(args)
    store = PointStore(args.out / "points.jsonl")
    if args.list:
        for p in plan:
            print(f"{'done' if p.id in store else '    '} {units(p):4d}  {p.id}")
        print(f"{len(plan)} points, {sum(units(p) for p in plan if p.id not in store)} frames to run")
        return None
    machine = {**machine_info(device), "python": sys.version.split()[0], "cpu_count": os.cpu_count()}
    run_plan(plan, store, ModelPool(device, dtype, args.compile_backend), machine)
    meta = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "command": sys.argv[:1] + (argv or sys.argv[1:]),
            "mode": args.mode, "machine": machine,
            "context": {"config": args.config, "device": device.type, "dtype": str(dtype).replace("torch.", ""),
                        "compile": args.compile, "suites": list(dict.fromkeys(p.suite for p in plan))}}
    summary = summarize([store.records[p.id] for p in plan], meta)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    table = markdown(summary)
    (args.out / "summary.md").write_text(table)
    plots = [] if args.no_plots else plot_sweep(summary, args.out)
    print(table)
    print(f"wrote {args.out / 'points.jsonl'}, summary.json, summary.md and {len(plots)} plots")
    return summary


def plot_sweep(summary: dict, out: Path) -> list[Path]:
    """PNG plots per suite; none (with a note) where matplotlib is not installed."""
    try:
        sweep_plots = importlib.import_module("oxygen_ros.bench.sweep_plots")
        return sweep_plots.plot_all(summary, out)
    except ImportError as e:
        print(f"no plots ({e})")
        return []


if __name__ == "__main__":
    main()
