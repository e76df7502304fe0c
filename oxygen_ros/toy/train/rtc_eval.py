"""Real-time chunking measured in closed loop: the toy model drives the tabletop world under inference delay.

    python -m oxygen_ros.toy.train.rtc_eval --episodes 40 --delays 0 1 2 3 4 [--out runs/rtc_closed_loop]
    oxygen-rtc-eval ...

The world keeps executing the current chunk while the next one is computed (:class:`~oxygen_ros.toy.world.delayed.
DelayedExecutor`): a frame observes at world step t, its chunk takes over at t + d from its action d on, and the next
frame observes at t + max(period, d), the node's cadence (the tabletop preset: 10 Hz control, 20 Hz actions, so
``period`` 2). Every frame goes through the node's :class:`~oxygen_ros.policy.runner.FrameRunner` with a simulated
clock: the observation is stamped with its world time, and the clock reads stamp + d * dt when the chunk is ready, so
the committed actions (``ChunkOutput.start``), the remainder real-time chunking continues and the online delay
estimate are the runner's own. Four strategies on the same episodes (seeds) and the same noise per frame:

- ``naive``: the stale prefix skipped, every chunk from fresh noise (the runner without guidance);
- ``rtc_identity`` / ``rtc_vjp``: real-time chunking (the checkpoint's RTC settings, else the paper's, with the
  guidance variant set), the delay estimated online (``auto``; ``--fixed-delay``: fixed to d);
- ``weighted_average``: LeRobot async inference's aggregation of unguided chunks (0.3 old + 0.7 new on the steps both
  cover).

Per (strategy, d): success rate; the jump of the commanded action at each chunk switch (L2 over the action's
dimensions in world units, x, y, z and gripper; and over the position x, y, z alone): mean, p95, max; the jerk of the
commanded positions (third difference / dt^3, L2 over x, y, z, world units / s^3): mean and p95. Writes
``results.json``, ``table.md`` and ``plot.png``. No language requests run: only the actions matter here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.modes import ENGINE_MODES
from oxygen_ros.engine.rtc import GUIDANCES, SCHEDULES, RTCConfig
from oxygen_ros.policy import Policy, RawObservation, load_policy
from oxygen_ros.policy.rtc import PAPER_RTC, RTCSchedule
from oxygen_ros.policy.runner import FrameRunner
from oxygen_ros.policy.shipped_model import TOY_MODEL_DIR
from oxygen_ros.toy.world import CAMERAS, TabletopWorld, WorldConfig, WorldObservation
from oxygen_ros.toy.world.delayed import DelayedExecutor

from .evaluate import EVAL_FIRST_SEED, actions_digest
from .policy import episode_noise

__all__ = ["STRATEGIES", "EpisodeTrace", "RTCClosedLoop", "Strategy", "jerk", "summarize", "sweep",
           "switch_jumps"]

STAMP_BASE_NS = 1_000_000_000  # world step 0's stamp (a stamp of 0 means "unstamped" to the runner)


@dataclass(frozen=True)
class Strategy:
    """How consecutive chunks become motion: ``guidance`` real-time chunking's variant (None: none), ``blend`` how
    the executor switches (:data:`~oxygen_ros.toy.world.delayed.BLENDS`)."""

    name: str
    guidance: str | None = None
    blend: str = "replace"


STRATEGIES: tuple[Strategy, ...] = (
    Strategy("naive"),
    Strategy("rtc_identity", "identity"),
    Strategy("rtc_vjp", "vjp"),
    Strategy("weighted_average", None, "weighted_average"),
)


@dataclass
class EpisodeTrace:
    """One episode under one strategy and delay."""

    seed: int
    success: bool
    steps: int
    frames: int
    guided_frames: int
    delays: list[int]  # the delay each guided frame assumed
    jumps: np.ndarray  # [switches, A] new - old at every chunk switch
    commanded: np.ndarray  # [steps, A] what the robot was commanded each step
    chunks: list[np.ndarray] = field(default_factory=list, repr=False)
    frame_s: list[float] = field(default_factory=list, repr=False)


def switch_jumps(jumps: np.ndarray, dims: slice = slice(None)) -> np.ndarray:
    """L2 norm of each switch's jump over ``dims`` (world units)."""
    jumps = np.asarray(jumps, dtype=np.float64).reshape(len(jumps), -1)
    return np.linalg.norm(jumps[:, dims], axis=1)


def jerk(commanded: np.ndarray, dt_s: float, dims: slice = slice(0, 3)) -> np.ndarray:
    """L2 norm of the third difference of the commanded positions / dt^3, one value per step from the fourth on
    (world units / s^3)."""
    c = np.asarray(commanded, dtype=np.float64)
    if len(c) < 4:
        return np.zeros(0)
    return np.linalg.norm(np.diff(c[:, dims], n=3, axis=0), axis=1) / dt_s ** 3


class RTCClosedLoop:
    """The toy model in the delayed tabletop world, one :class:`FrameRunner` per (strategy, delay), built as the node
    builds it (``EngineConfig(rtc=...)`` equal to the runner's ``RTCSchedule.config``)."""

    def __init__(self, model_dir: Path = TOY_MODEL_DIR, mode: str = "oxygen", period: int = 2, dt_s: float = 0.05,
                 rtc: RTCConfig | None = None, fixed_delay: bool = False, max_steps: int = WorldConfig.max_steps,
                 policy: Policy | None = None) -> None:
        self.policy = policy or load_policy(Path(model_dir))
        self.mode, self.period, self.dt_s, self.fixed_delay = mode, period, dt_s, fixed_delay
        self.rtc = rtc or self.policy.spec.rtc or PAPER_RTC
        cfg = self.policy.model.config
        self.world = TabletopWorld(WorldConfig(image_size=cfg.vision.image_size, max_steps=max_steps))
        self._seed, self._frame = 0, 0  # noise fixed by (episode seed, frame in the episode), as evaluate.py

    def runner(self, strategy: Strategy, delay: int, fixed_delay: bool | None = None) -> FrameRunner:
        """The frame runner of ``strategy`` at ``delay``: its delay estimated online, or fixed to ``delay``
        (``fixed_delay``; default: the loop's)."""
        fixed = self.fixed_delay if fixed_delay is None else fixed_delay
        if strategy.guidance is None:
            config = dataclasses.replace(self.rtc, enabled=False)  # committed actions counted, nothing guided
        else:
            config = dataclasses.replace(self.rtc, enabled=True, guidance=strategy.guidance)
        model, tok = self.policy.model, self.policy.tokenizer
        engine_cfg = EngineConfig(mode=self.mode, eos_id=tok.eos_id, num_steps=model.config.num_steps,
                                  rtc=config if config.enabled else None)
        schedule = RTCSchedule(config, self.dt_s, delay if fixed else None)
        return FrameRunner(self.policy, lambda: build_engine(model, engine_cfg, detokenize=tok.decode),
                           noise=lambda _i, h, a: episode_noise(self._seed, self._frame, h, a), rtc=schedule)

    @staticmethod
    def raw(obs: WorldObservation) -> RawObservation:
        return RawObservation({c: obs.images[c] for c in CAMERAS}, obs.state, obs.instruction)

    def run_episode(self, runner: FrameRunner, strategy: Strategy, delay: int, seed: int) -> EpisodeTrace:
        """One episode: observe, step the runner with the simulated clock, execute the chunk under ``delay``."""
        ex = DelayedExecutor(self.world, delay, self.period, strategy.blend)
        obs = ex.reset(seed)
        runner.forget_chunk()  # a new episode continues nothing
        self._seed, self._frame = seed, 0
        dt_ns = round(self.dt_s * 1e9)
        chunks, frame_s, delays, guided = [], [], [], 0
        while not ex.done:
            stamp = STAMP_BASE_NS + ex.observed_at * dt_ns
            t0 = time.perf_counter()
            out = runner.step(self.raw(obs), stamp_ns=stamp, start_language=False,
                              clock_ns=lambda s=stamp: s + delay * dt_ns)
            frame_s.append(time.perf_counter() - t0)
            chunk = out.chunk
            if chunk.start != min(delay, len(chunk.chunk) - 1):
                raise RuntimeError(f"the runner committed {chunk.start} actions at delay {delay}")
            if chunk.guided:
                guided += 1
                delays.append(chunk.delay)
            chunks.append(chunk.chunk)
            obs = ex.execute(chunk.chunk)
            self._frame += 1
        jumps = np.array([s.jump for s in ex.switches]).reshape(len(ex.switches), -1)
        return EpisodeTrace(seed, self.world.success, self.world.steps, len(chunks), guided, delays, jumps,
                            np.array(ex.commanded), chunks, frame_s)


def _stats(values: np.ndarray, prefix: str, maximum: bool = True) -> dict:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {f"{prefix}_mean": float("nan"), f"{prefix}_p95": float("nan")} | (
            {f"{prefix}_max": float("nan")} if maximum else {})
    out = {f"{prefix}_mean": float(v.mean()), f"{prefix}_p95": float(np.percentile(v, 95))}
    if maximum:
        out[f"{prefix}_max"] = float(v.max())
    return out


def summarize(traces: Sequence[EpisodeTrace], dt_s: float) -> dict:
    """Success, switch jumps (whole action and position) and jerk over ``traces``."""
    jumps = np.concatenate([t.jumps for t in traces if len(t.jumps)] or [np.zeros((0, 4))])
    jerks = np.concatenate([jerk(t.commanded, dt_s) for t in traces])
    frame_s = [s for t in traces for s in t.frame_s]
    return {
        "episodes": len(traces),
        "success_rate": float(np.mean([t.success for t in traces])),
        "successes": int(sum(t.success for t in traces)),
        "mean_steps": float(np.mean([t.steps for t in traces])),
        "frames": int(sum(t.frames for t in traces)),
        "guided_frames": int(sum(t.guided_frames for t in traces)),
        "guided_delays": sorted({d for t in traces for d in t.delays}),
        "switches": int(len(jumps)),
        **_stats(switch_jumps(jumps), "jump"),
        **_stats(switch_jumps(jumps, slice(0, 3)), "position_jump"),
        **_stats(jerks, "jerk", maximum=False),
        "frame_ms_median": 1e3 * float(np.median(frame_s)) if frame_s else float("nan"),
        "actions_sha1": [actions_digest(t.chunks) for t in traces],
    }


def _run(loop: RTCClosedLoop, strategy: Strategy, delay: int, seeds: Sequence[int], bar,
         fixed_delay: bool | None = None) -> list[EpisodeTrace]:
    runner = loop.runner(strategy, delay, fixed_delay)
    traces = []
    for seed in seeds:
        traces.append(loop.run_episode(runner, strategy, delay, seed))
        bar.update()
        bar.set_postfix_str(f"d={delay} {strategy.name}{'' if fixed_delay is None else ' (other delay mode)'}")
    runner.close()
    return traces


def sweep(loop: RTCClosedLoop, delays: Sequence[int], seeds: Sequence[int],
          strategies: Sequence[Strategy] = STRATEGIES, progress: bool = True,
          check_delay_mode: Sequence[str] = ()) -> list[dict]:
    """Every (delay, strategy) on the same ``seeds``: one summary row each. The strategies named in
    ``check_delay_mode`` run a second time with the other delay mode (fixed <-> auto); the row's
    ``other_delay_mode_identical`` counts the episodes whose executed chunks were bit-identical."""
    from tqdm import tqdm

    checked = [s for s in strategies if s.name in check_delay_mode and s.guidance is not None]
    rows = []
    bar = tqdm(total=len(delays) * (len(strategies) + len(checked)) * len(seeds), desc="rtc closed loop",
               disable=not progress)
    for d in delays:
        for strategy in strategies:
            row = {"strategy": strategy.name, "delay": d, **summarize(_run(loop, strategy, d, seeds, bar), loop.dt_s)}
            if strategy in checked:
                other = summarize(_run(loop, strategy, d, seeds, bar, not loop.fixed_delay), loop.dt_s)
                row["other_delay_mode_identical"] = sum(
                    a == b for a, b in zip(row["actions_sha1"], other["actions_sha1"], strict=True))
            rows.append(row)
    bar.close()
    return rows


def markdown_table(rows: Sequence[dict], horizon: int) -> str:
    """One row per (delay, strategy): success, switch jump (action and position), jerk."""
    lines = ["| d (of H) | strategy | success | jump mean | jump p95 | jump max | position jump mean | jerk mean | "
             "jerk p95 | switches |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['delay']} ({r['delay'] / horizon:.0%}) | {r['strategy']} | {r['successes']}/{r['episodes']} | "
            f"{r['jump_mean']:.4f} | {r['jump_p95']:.4f} | {r['jump_max']:.3f} | {r['position_jump_mean']:.4f} | "
            f"{r['jerk_mean']:.0f} | {r['jerk_p95']:.0f} | {r['switches']} |")
    return "\n".join(lines)


def plot(rows: Sequence[dict], path: Path, horizon: int) -> Path:
    """Mean switch jump (p95 dashed), success rate and mean jerk against the delay, one line per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["strategy"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for i, name in enumerate(names):
        pts = [r for r in rows if r["strategy"] == name]
        d = [r["delay"] for r in pts]
        color = f"C{i}"
        axes[0].plot(d, [r["jump_mean"] for r in pts], "o-", color=color, label=f"{name} (mean)")
        axes[0].plot(d, [r["jump_p95"] for r in pts], "--", color=color, alpha=0.6, label=f"{name} (p95)")
        axes[1].plot(d, [100 * r["success_rate"] for r in pts], "o-", color=color, label=name)
        axes[2].plot(d, [r["jerk_mean"] for r in pts], "o-", color=color, label=name)
    delays = sorted({r["delay"] for r in rows})
    for ax, title in zip(axes, ("commanded-action jump at a chunk switch (world units)", "success rate (%)",
                                "mean jerk of the commanded position (units / s^3)"), strict=True):
        ax.set_xticks(delays, [f"{d} ({d / horizon:.0%})" for d in delays])
        ax.set_xlabel(f"inference delay d (actions of H = {horizon})")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(result: dict, out: Path) -> None:
    """``table.md`` and ``plot.png`` of a run's ``results.json`` dict (the table is printed)."""
    table = markdown_table(result["rows"], result["horizon"])
    (out / "table.md").write_text(table + "\n")
    plot(result["rows"], out / "plot.png", result["horizon"])
    print(table)


def compare_table(runs: Sequence[Path], delays: Sequence[int] | None = None) -> str:
    """One markdown row per (run, strategy, delay) of several runs' ``results.json``: their RTC settings side by
    side (guided strategies show schedule and beta; unguided ones do not depend on them)."""
    lines = ["| strategy | schedule | beta | d | episodes | success | jump mean | jump p95 | position jump mean | "
             "jerk mean | mean steps |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        res = json.loads((Path(run) / "results.json").read_text())
        rtc = res["rtc"]
        for r in res["rows"]:
            if delays and r["delay"] not in delays:
                continue
            guided = r["strategy"].startswith("rtc_")
            schedule, beta = (rtc["schedule"], f"{rtc['max_guidance_weight']:g}") if guided else ("-", "-")
            lines.append(f"| {r['strategy']} | {schedule} | {beta} | {r['delay']} | {r['episodes']} | "
                         f"{r['successes']}/{r['episodes']} | {r['jump_mean']:.4f} | {r['jump_p95']:.4f} | "
                         f"{r['position_jump_mean']:.4f} | {r['jerk_mean']:.0f} | {r['mean_steps']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """CLI entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=TOY_MODEL_DIR, help="model directory")
    ap.add_argument("--episodes", type=int, default=40)
    ap.add_argument("--first-seed", type=int, default=EVAL_FIRST_SEED)
    ap.add_argument("--delays", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="inference delays (actions)")
    ap.add_argument("--strategies", nargs="+", default=[s.name for s in STRATEGIES],
                    choices=[s.name for s in STRATEGIES])
    ap.add_argument("--period", type=int, default=2, help="actions between control ticks (tabletop: 20 Hz / 10 Hz)")
    ap.add_argument("--dt", type=float, default=0.05, help="seconds per action (tabletop: 20 Hz)")
    ap.add_argument("--mode", default="oxygen", choices=ENGINE_MODES)
    ap.add_argument("--fixed-delay", action="store_true", help="RTC's delay fixed to d instead of estimated online")
    ap.add_argument("--check-delay-mode", nargs="*", default=["rtc_identity"],
                    help="strategies run again with the other delay mode (fixed <-> auto), compared bit for bit")
    ap.add_argument("--schedule", choices=SCHEDULES, help="prefix-weight schedule (default: the checkpoint's / "
                    "the paper's)")
    ap.add_argument("--max-guidance-weight", type=float)
    ap.add_argument("--execution-horizon", type=int)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("runs/rtc_closed_loop"))
    ap.add_argument("--replot", action="store_true", help="only redraw table.md and plot.png from results.json")
    ap.add_argument("--compare", type=Path, nargs="+", help="only print one table of these runs' results.json "
                    "(the rows of --delays)")
    a = ap.parse_args(argv)
    if a.compare:
        print(compare_table(a.compare, a.delays))
        return
    if a.replot:
        result = json.loads((a.out / "results.json").read_text())
        write_outputs(result, a.out)
        return
    torch.set_num_threads(a.threads)
    policy = load_policy(a.model)
    rtc = policy.spec.rtc or PAPER_RTC
    overrides = {"schedule": a.schedule, "max_guidance_weight": a.max_guidance_weight,
                 "execution_horizon": a.execution_horizon}
    rtc = dataclasses.replace(rtc, **{k: v for k, v in overrides.items() if v is not None})
    loop = RTCClosedLoop(a.model, a.mode, a.period, a.dt, rtc, a.fixed_delay, policy=policy)
    strategies = [s for s in STRATEGIES if s.name in a.strategies]
    seeds = list(range(a.first_seed, a.first_seed + a.episodes))
    t0 = time.perf_counter()
    rows = sweep(loop, a.delays, seeds, strategies, check_delay_mode=a.check_delay_mode)
    horizon = policy.spec.chunk_size
    result = {
        "model": str(a.model.resolve().relative_to(Path.cwd())) if a.model.resolve().is_relative_to(Path.cwd())
        else str(a.model),
        "horizon": horizon, "period": a.period, "dt_s": a.dt, "mode": a.mode, "threads": a.threads,
        "delay_estimate": "fixed" if a.fixed_delay else "auto",
        "rtc": dataclasses.asdict(rtc), "guidances": list(GUIDANCES), "first_seed": a.first_seed,
        "episodes": a.episodes, "wall_s": time.perf_counter() - t0, "rows": rows,
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps(result, indent=2))
    write_outputs(result, a.out)
    print(f"[{result['wall_s']:.0f} s] -> {a.out}")


if __name__ == "__main__":
    main()
