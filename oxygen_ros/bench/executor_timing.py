"""Chunk executor timing under robot-like load (the soak load of :mod:`.soak`), measured from the executor's
``~/executed``; ``--compare-loops`` runs the command loops side by side (:mod:`.executor_loops`). The runs and
figures: docs/benchmarks.md.

    python -m oxygen_ros.bench.executor_timing --duration 30 --out runs/executor_timing
"""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from oxygen_ros.ros.dds import dds_profile_environment, default_profile_path
from oxygen_ros.ros.stamps import stamp_to_ns
from oxygen_ros.testing.probe import Probe, header_ns
from oxygen_ros.testing.process import NodeProcess

from .executor_loops import TickRecorder, diag_number, fmt, percentiles, period_errors
from .report import save_figure, write_run
from .soak import INSTRUCTION, load_parser, node_params, start_load, stop_load

__all__ = ["RUNS", "RunSpec", "main", "plot_setpoints", "run_one", "switch_jumps", "table", "verdicts"]


@dataclass(frozen=True)
class RunSpec:
    """One configuration: command rate, switch mode, the node's RTC remainder source."""

    name: str
    rate_hz: float
    switch: str
    remainder_source: str
    aggregate: str = "weighted_average"


RUNS = (RunSpec("100hz_replace_timing_rule", 100.0, "replace", "timing_rule"),
        RunSpec("100hz_replace_executor", 100.0, "replace", "executor"),
        RunSpec("100hz_aggregate_timing_rule", 100.0, "aggregate", "timing_rule"),
        RunSpec("100hz_aggregate_executor", 100.0, "aggregate", "executor"),
        RunSpec("500hz_replace_executor", 500.0, "replace", "executor"))


def run_one(spec: RunSpec, config: Path, duration_s: float, warmup_s: float, domain_id: int,
            camera_size: str = "640x480", camera_rate: float = 30.0, joint_rate: float = 50.0,
            executor_fifo: int = 0) -> dict[str, Any]:
    """One run of ``spec`` (see the module docstring); its figures and a few seconds of series for the plot.
    ``executor_fifo``: run the executor process under ``chrt -f`` at that SCHED_FIFO priority (0: normal)."""
    params = node_params(config)
    dds, _ = dds_profile_environment(default_profile_path())
    node = NodeProcess(config, {"instruction": INSTRUCTION, "rtc.remainder_source": spec.remainder_source},
                       domain_id=domain_id)
    executor = NodeProcess(config, {"chunk_topic": "/oxygen/action_chunk", "halt_topic": "/oxygen/halt",
                                    "command_rate_hz": spec.rate_hz, "switch": spec.switch,
                                    "aggregate": spec.aggregate, "output": "joint_state"},
                           domain_id=domain_id, module="oxygen_ros.executor")
    for proc in (node, executor):
        proc.env.update(dds)
    if executor_fifo:
        executor.cmd = ["chrt", "-f", str(executor_fifo), *executor.cmd]  # as a controller loop runs
    probe = Probe([], [], domain_id=domain_id, name="executor_timing_probe")
    recorder = TickRecorder(probe)
    load = None
    try:
        node.start()
        executor.start()
        load = start_load(params, domain_id, warmup_s + duration_s + 120, dds, camera_size, camera_rate, joint_rate)
        if not probe.wait_for(lambda: len(probe.chunks()) > 0 and len(recorder.window(0, 1 << 62)) > 0, 240.0):
            raise RuntimeError(f"no chunk or no executor tick; node:\n{node.output()[-2000:]}\nexecutor:\n"
                               f"{executor.output()[-2000:]}")
        time.sleep(warmup_s)
        now = probe.node.get_clock().now().nanoseconds
        before, node_before = recorder.diagnostics(), probe.diagnostics()
        time.sleep(duration_s)
        t1 = probe.node.get_clock().now().nanoseconds
        time.sleep(1.5)  # a diagnostics report covers the window's end
        after, node_after = recorder.diagnostics(), probe.diagnostics()
        ticks = recorder.window(now, t1)
        chunks = [c for c in probe.chunks() if now - 2 * 10**9 <= header_ns(c) < t1]
    finally:
        probe.close()
        stop_load(load)
        executor_code = executor.stop(timeout=10)
        node_code = node.stop(timeout=10)
    if not ticks:
        raise RuntimeError(f"{spec.name}: no executor tick in the window; executor:\n{executor.output()[-2000:]}")
    stamps = np.array([t[0] for t in ticks], dtype=np.int64)
    frames = np.array([t[1] for t in ticks])
    holding = np.array([t[2] for t in ticks])
    setpoints = np.array([t[3] for t in ticks], dtype=np.float64)
    joints = list(params["joint_names"])
    arm = [i for i, n in enumerate(joints) if "gripper" not in n.lower()] or list(range(len(joints)))
    return {
        **asdict(spec), "duration_s": duration_s, "executor_fifo": executor_fifo, "camera_size": camera_size,
        "node_exit_code": node_code,
        "executor_exit_code": executor_code,
        "period": period_errors(stamps, spec.rate_hz),
        "jumps": switch_jumps(stamps, frames, setpoints, holding, arm),
        "jump_joints": [joints[i] for i in arm],
        "underruns": int(diag_number(after, "underruns") - diag_number(before, "underruns")),
        "underrun_ticks": int(diag_number(after, "underrun_ticks") - diag_number(before, "underrun_ticks")),
        "holding_ticks": int(holding.sum()),
        "chunks_used": int(diag_number(after, "chunks.used") - diag_number(before, "chunks.used")),
        "node_frames": int(diag_number(node_after, "frames") - diag_number(node_before, "frames")),
        "node_coverage_short_chunks": node_after.get("coverage_short_chunks", ""),
        "node_rtc_remainders": {k: node_after.get(k) for k in ("rtc_remainders_executor", "rtc_remainder_fallbacks",
                                                              "rtc_remainders_timing_rule") if k in node_after},
        "series": _series(stamps, frames, setpoints, chunks, params),
    }


def _series(stamps: np.ndarray, frames: np.ndarray, setpoints: np.ndarray, chunks: list,
            params: dict[str, Any], seconds: float = 2.0) -> dict[str, Any]:
    """About ``seconds`` from the middle of the window: joint 0's setpoints and the chunks' actions for it."""
    mid = stamps[len(stamps) // 2]
    keep = (stamps >= mid - seconds / 2 * 1e9) & (stamps < mid + seconds / 2 * 1e9)
    t0 = int(stamps[keep][0]) if keep.any() else int(mid)
    out_chunks = []
    for c in chunks:
        dt = stamp_to_ns(c.dt)
        actions = np.asarray(c.actions, dtype=np.float64).reshape(c.horizon, c.action_dim)
        times = header_ns(c) + (c.first_step + np.arange(c.horizon) + 1) * dt
        if times[-1] < t0 or times[0] > t0 + seconds * 1e9:
            continue
        out_chunks.append({"frame_index": int(c.frame_index), "t_s": ((times - t0) / 1e9).round(4).tolist(),
                           "joint0": actions[:, 0].round(5).tolist()})
    return {"joint": str(params["joint_names"][0]), "t_s": ((stamps[keep] - t0) / 1e9).round(5).tolist(),
            "setpoint": setpoints[keep, 0].round(5).tolist(), "frame_index": frames[keep].tolist(),
            "chunks": out_chunks}


def switch_jumps(stamps_ns: np.ndarray, frame_index: np.ndarray, setpoints: np.ndarray,
                 holding: np.ndarray | None = None, columns: list[int] | None = None) -> dict[str, Any]:
    """Setpoint speed (max over joints of |delta| / dt, units/s) at chunk switches (the chunk in force,
    ``frame_index``, changes) and within chunks (the motion's own speed). ``setpoints`` [N, D]; ``holding`` [N]: ticks
    that held (excluded); ``columns``: the joints (the benchmark leaves out grippers, a step by design)."""
    t = np.asarray(stamps_ns, dtype=np.int64)
    fi = np.asarray(frame_index)
    sp = np.asarray(setpoints, dtype=np.float64)
    if columns is not None:
        sp = sp[:, columns]
    hold = np.zeros(t.size, bool) if holding is None else np.asarray(holding, bool)
    if t.size < 2:
        none = percentiles(np.zeros(0))
        return {"switches": 0, "switch": none, "within": none, "switch_over_within": None}
    dt = np.diff(t) / 1e9
    speed = np.abs(np.diff(sp, axis=0)).max(axis=1) / np.where(dt > 0, dt, np.nan)
    valid = np.isfinite(speed) & ~hold[1:] & ~hold[:-1]
    switch = (fi[1:] != fi[:-1]) & valid
    within = (fi[1:] == fi[:-1]) & valid
    s, w = percentiles(speed[switch]), percentiles(speed[within])
    return {"switches": int(switch.sum()), "switch": s, "within": w,
            "switch_over_within": (s["mean"] / w["mean"]) if s["mean"] is not None and w["mean"] else None}


PANELS = ("100hz_replace_executor", "100hz_aggregate_executor", "100hz_replace_timing_rule",
          "100hz_aggregate_timing_rule", "500hz_replace_executor")


def plot_setpoints(result: dict[str, Any], path: Path, panels: int = 2) -> Path:
    """Draw up to ``panels`` runs (the executor-remainder ones first) into ``path``."""
    import matplotlib.pyplot as plt

    by = {}
    for r in result["runs"]:
        by.setdefault(r["name"], r)  # the first repeat
    chosen = [by[n] for n in PANELS if n in by][:panels] or result["runs"][:1]
    fig, axes = plt.subplots(len(chosen), 1, figsize=(11, 3.4 * len(chosen)), squeeze=False)
    for ax, run in zip(axes[:, 0], chosen, strict=True):
        s = run["series"]
        colors = plt.get_cmap("tab10")
        for i, c in enumerate(s["chunks"]):
            ax.plot(c["t_s"], c["joint0"], "o--", ms=3, lw=0.8, color=colors(i % 10), alpha=0.7,
                    label="chunks (actions at their due times)" if i == 0 else None)
        ax.plot(s["t_s"], s["setpoint"], "-", color="k", lw=1.6, label=f"setpoints ({run['rate_hz']:g} Hz)")
        switches = [t for t, a, b in zip(s["t_s"][1:], s["frame_index"][:-1], s["frame_index"][1:], strict=True)
                    if a != b]
        for k, t in enumerate(switches):
            ax.axvline(t, color="tab:red", lw=0.6, alpha=0.6, label="chunk switch" if k == 0 else None)
        if s["t_s"]:
            ax.set_xlim(s["t_s"][0], s["t_s"][-1])
        j = run["jumps"]["switch"]
        ax.set(xlabel="time (s)", ylabel=s["joint"],
               title=f"{run['name']}: switch {run['switch']}, remainder {run['remainder_source']}; mean jump "
                     f"{(j['mean'] or 0):.3f} units/s")
        ax.legend(loc="best", fontsize=8)
    return save_figure(fig, path)


def table(result: dict[str, Any]) -> str:
    """The summary table (markdown) and the verdicts."""
    rows = ["| run | rate | switch | remainder | period error p50 / p99 / max (ms) | p99 % of period | late ticks "
            "| switches | jump at switch mean / max (units/s) | within chunk mean | switch / within | underruns "
            "(ticks) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        e, j = r["period"]["error_ms"], r["jumps"]
        name = r["name"] + (f" #{r['repeat'] + 1}" if result.get("repeat", 1) > 1 else "")
        rows.append(f"| {name} | {r['rate_hz']:g} Hz | {r['switch']} | {r['remainder_source']} | "
                    f"{fmt(e['p50'], '.3f')} / {fmt(e['p99'], '.3f')} / {fmt(e['max'], '.1f')} | "
                    f"{fmt(r['period']['error_pct']['p99'], '.1f')}% | {r['period']['late_ticks']} | "
                    f"{j['switches']} | {fmt(j['switch']['mean'], '.3f')} / {fmt(j['switch']['max'], '.3f')} | "
                    f"{fmt(j['within']['mean'], '.3f')} | {fmt(j['switch_over_within'], '.2f')} | "
                    f"{r['underruns']} ({r['underrun_ticks']}) |")
    fifo = result.get("executor_fifo", 0)
    lines = rows + ["", f"Host: {result['host']}; {result['date']}; command: `{result['command']}`; load: 2 "
                    f"cameras {result.get('camera_size', '640x480')} rgb8 at 30 Hz + joint_states at 50 Hz; executor "
                    + (f"under SCHED_FIFO {fifo} (chrt)" if fifo else "at normal priority") + ".", ""]
    lines += [f"- {v}" for v in result["verdicts"]]
    return "\n".join(lines)


def verdicts(runs: list[dict[str, Any]]) -> list[str]:
    """The target (100 Hz: p99 period error <= 20% of the period) and remainder-source comparisons, in words."""
    out = []
    for r in runs:
        if r["rate_hz"] == 100.0:
            p99 = r["period"]["error_pct"]["p99"]
            ok = p99 is not None and p99 <= 20.0
            out.append(f"{r['name']}: p99 period error {fmt(p99, '.1f')}% of the period: "
                       + ("target (<= 20%) met" if ok else "target (<= 20%) NOT met"))
    for switch in ("replace", "aggregate"):
        ea = _mean_jump(runs, f"100hz_{switch}_executor")
        eb = _mean_jump(runs, f"100hz_{switch}_timing_rule")
        if ea is not None and eb is not None:
            out.append(f"switch {switch}: mean switch jump with remainder_source executor {ea:.3f} vs timing_rule "
                       f"{eb:.3f} units/s ({'no worse' if ea <= eb * 1.05 else 'WORSE'} within 5%; ratio "
                       f"{ea / eb:.2f}; over every switch of the repeats)")
    return out


def _mean_jump(runs: list[dict[str, Any]], name: str) -> float | None:
    """The mean switch jump over every switch of the runs named ``name`` (repeats pooled, weighted by switches)."""
    pairs = [(r["jumps"]["switch"]["mean"], r["jumps"]["switches"]) for r in runs
             if r["name"] == name and r["jumps"]["switch"]["mean"] is not None]
    n = sum(k for _, k in pairs)
    return sum(m * k for m, k in pairs) / n if n else None


def main(argv: list[str] | None = None) -> None:
    ap = load_parser(__doc__, duration=30.0, warmup=5.0, out="runs/executor_timing")
    ap.add_argument("--runs", nargs="*", default=[r.name for r in RUNS], choices=[r.name for r in RUNS])
    ap.add_argument("--repeat", type=int, default=1, help="run the list this many times, interleaved")
    ap.add_argument("--executor-fifo", type=int, default=0, metavar="PRIORITY",
                    help="run the executor under chrt -f PRIORITY (SCHED_FIFO, as a controller loop); 0: normal")
    ap.add_argument("--compare-loops", action="store_true",
                    help="the command loops side by side (timer | thread | thread at rt.priority 50; 100 / 500 Hz; "
                         "idle / soak), see oxygen_ros/bench/executor_loops.py")
    ap.add_argument("--loop-runs", nargs="*", default=None,
                    help="--compare-loops: only these configurations (e.g. timer_100hz_idle thread_rt_100hz_soak)")
    ap.add_argument("--loop-cpus", default="", help="--compare-loops: rt.cpus of the thread loops ('' = any)")
    args = ap.parse_args(argv)
    command = "python -m oxygen_ros.bench.executor_timing " + " ".join(argv if argv is not None else sys.argv[1:])
    host = f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs (shared)"
    if args.compare_loops:
        from .executor_loops import LOOP_RUNS, loop_table, plot_loops, run_loop

        names = {spec.name for spec in LOOP_RUNS}
        unknown = set(args.loop_runs or ()) - names
        if unknown:
            ap.error(f"--loop-runs: unknown {sorted(unknown)}; choose from {sorted(names)}")
        specs = [spec for spec in LOOP_RUNS if args.loop_runs is None or spec.name in args.loop_runs]
    else:
        specs = [spec for spec in RUNS if spec.name in args.runs]
    plan = [(k, spec) for k in range(args.repeat) for spec in specs]
    runs, failed = [], []
    for i, (k, spec) in enumerate(plan):
        print(f"[{i + 1}/{len(plan)}] {spec.name} ({args.duration:g} s)", flush=True)
        domain = args.domain_id + i % 50
        if not args.compare_loops:
            runs.append({**run_one(spec, args.config, args.duration, args.warmup, domain,
                                   camera_size=args.camera_size, executor_fifo=args.executor_fifo), "repeat": k})
            continue
        try:
            runs.append({**run_loop(spec, args.config, args.duration, args.warmup, domain, args.loop_cpus),
                         "repeat": k})
        except RuntimeError as e:  # a run that measured nothing is reported, not dropped with the others
            print(f"  {spec.name} failed: {str(e)[:2000]}", flush=True)
            failed.append({"name": spec.name, "repeat": k, "error": str(e)[:4000]})
    result = {"runs": runs, "command": command.strip(), "host": host, "repeat": args.repeat,
              "config": str(args.config), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    if args.compare_loops:
        result |= {"failed": failed, "duration_s": args.duration}
        write_run(args.out, result, loop_table(result), plot_loops, "loops.png")
    else:
        result |= {"verdicts": verdicts(runs), "executor_fifo": args.executor_fifo, "camera_size": args.camera_size}
        write_run(args.out, result, table(result), plot_setpoints, "setpoints.png")


if __name__ == "__main__":
    main()
