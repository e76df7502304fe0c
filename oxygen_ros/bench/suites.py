"""The sweep's suites: parameter grids per mode and the points each suite measures (the paper's figures/tables).

``build_plan`` turns suites x compile modes into one ordered list of ``Point``s, a stage-profile point per model
first (its costs feed the predictions and the auto suite's relative deadline).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from oxygen_ros.bench.points import Point

SUITES = ("headline", "tradeoff", "speedup", "ablation", "arrivals", "overhead", "memory", "stages", "auto", "heads")


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


def headline(base: Point, g: Grid) -> list[Point]:
    """N=30: isolated, oxygen k=1 and k=5; N=5: isolated and shared_kv (the issue's targets)."""
    p = replace(base, suite="headline", frames=g.frames)
    return [replace(p, engine="isolated"), replace(p, engine="oxygen", k=1), replace(p, engine="oxygen", k=5),
            replace(p, engine="isolated", N=5), replace(p, engine="shared_kv", N=5)]


def tradeoff(base: Point, g: Grid) -> list[Point]:
    """Fig 4: isolated and oxygen at each k across N (action Hz vs tokens/s)."""
    p = replace(base, suite="tradeoff", frames=g.frames)
    return [replace(p, engine="isolated", N=n) for n in g.tradeoff_N] + [
        replace(p, engine="oxygen", N=n, k=k) for k in g.tradeoff_k for n in g.tradeoff_N]


def speedup(base: Point, g: Grid) -> list[Point]:
    """Fig 5: oxygen vs isolated at N=30 across presets x S x k; Fig 10: k=5 across N."""
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
    """Fig 6: isolated / shared_kv / oxygen k=5 across N, plus the no-language oracle."""
    p = replace(base, suite="ablation", frames=g.frames)
    out = [replace(p, engine="oxygen", N=0, workload="none")]  # oracle: frames with no language request
    for n in g.ablation_N:
        out += [replace(p, engine="isolated", N=n), replace(p, engine="shared_kv", N=n),
                replace(p, engine="oxygen", N=n, k=5)]
    return out


def arrivals(base: Point, g: Grid) -> list[Point]:
    """Fig 7: oxygen k=5, N=30 under uniform, Poisson, random-length and bursty arrivals."""
    p = replace(base, suite="arrivals", frames=g.frames, engine="oxygen", k=5)
    out = [replace(p, engine="isolated", k=None)]  # the dashed baseline: one 30-token request per frame
    out += [replace(p, workload="every_n", period=t) if t > 1 else p for t in g.uniform_periods]
    out += [replace(p, workload="poisson", rate=r) for r in g.poisson_rates]
    out += [replace(p, workload="random_length", min_tokens=lo, N=hi) for lo, hi in g.random_lengths]
    out += [replace(p, workload="burst", burst=b, period=b) for b in g.bursts]
    return out


def overhead(base: Point, g: Grid) -> list[Point]:
    """Table 7: oxygen at each k (decode batch ceil(N/k)): the cache manager's share."""
    p = replace(base, suite="overhead", frames=g.frames, engine="oxygen")
    return [replace(p, k=k) for k in g.overhead_k]


def memory(base: Point, g: Grid) -> list[Point]:
    """Table 3: memory per engine (parallel only without torch.compile)."""
    p = replace(base, suite="memory", frames=g.frames)
    # parallel deep-copies the model; a compiled module's copy would still call the original's compiled forward
    engines = ("isolated", "shared_kv", "parallel") if base.compile == "off" else ("isolated", "shared_kv")
    return [replace(p, engine=e) for e in engines] + [
        replace(p, engine="oxygen", k=k) for k in g.memory_k]


def stages(base: Point, g: Grid) -> list[Point]:
    """Table 6: shared_kv and isolated across N (per-stage time)."""
    p = replace(base, suite="stages", frames=g.frames)
    return [replace(p, engine=e, N=n) for n in g.stages_N for e in ("shared_kv", "isolated")]


def auto(base: Point, g: Grid, deadline: str) -> list[Point]:
    """k=auto vs fixed k under bursts, with a frame ``deadline`` ("1.3x" or "120ms")."""
    p = replace(base, suite="auto", frames=g.auto_frames, engine="oxygen", workload="burst", burst=g.auto_burst,
                period=g.auto_burst, deadline=deadline)
    return [replace(p, k=k) for k in g.auto_k]


def heads(base: Point, g: Grid) -> list[Point]:
    """Table 1 / 4: E action experts reading one prefix, isolated vs oxygen."""
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
