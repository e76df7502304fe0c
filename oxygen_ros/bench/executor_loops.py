"""The executor's command loops side by side (rclpy timer, loop thread, loop thread at ``rt.priority``; 100 /
500 Hz; idle / soak), interleaved; the figures: docs/benchmarks.md.

    python -m oxygen_ros.bench.executor_timing --compare-loops --duration 12 --warmup 3 \\
        --out runs/executor_timing/<date>_loop
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray

from oxygen_ros.msg import ExecutedPlan
from oxygen_ros.ros import qos
from oxygen_ros.ros.dds import dds_profile_environment, default_profile_path
from oxygen_ros.ros.stamps import stamp_to_ns
from oxygen_ros.testing.probe import Probe
from oxygen_ros.testing.process import NodeProcess

from .report import save_figure, subplots
from .soak import INSTRUCTION, node_params, start_load, stop_load

__all__ = ["LOOP_RUNS", "LoopSpec", "TickRecorder", "diag_number", "fmt", "loop_table", "percentiles",
           "period_errors", "plot_loops", "run_loop"]

EXECUTOR_DIAG = "oxygen_executor: executor"


@dataclass(frozen=True)
class LoopSpec:
    """One configuration: the loop, its SCHED_FIFO priority (0 = normal), the rate, the load."""

    loop: str
    priority: int
    rate_hz: float
    load: str  # idle | soak

    @property
    def name(self) -> str:
        variant = "timer" if self.loop == "timer" else ("thread_rt" if self.priority else "thread")
        return f"{variant}_{self.rate_hz:g}hz_{self.load}"


LOOP_RUNS = tuple(LoopSpec(loop, prio, rate, load) for load in ("idle", "soak") for rate in (100.0, 500.0)
                  for loop, prio in (("timer", 0), ("thread", 0), ("thread", 50)))


class TickRecorder:
    """The executor's ExecutedPlan ticks (stamp, chunk in force, holding, setpoint, receipt: system clock ns) and
    its /diagnostics (with the status message)."""

    def __init__(self, probe: Probe) -> None:
        self.lock = threading.Lock()
        self.ticks: list[tuple[int, int, bool, tuple[float, ...], int]] = []
        self.diag: dict[str, str] = {}
        probe.node.create_subscription(ExecutedPlan, "/oxygen_executor/executed", self._on_tick, qos.reliable(5000))
        probe.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 10)

    def _on_tick(self, msg: ExecutedPlan) -> None:
        got = time.time_ns()
        tick = (stamp_to_ns(msg.header.stamp), int(msg.frame_index), bool(msg.holding), tuple(msg.setpoint), got)
        with self.lock:
            self.ticks.append(tick)

    def _on_diag(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name == EXECUTOR_DIAG:
                with self.lock:
                    self.diag = {kv.key: kv.value for kv in status.values}
                    self.diag["message"] = status.message

    def window(self, t0_ns: int, t1_ns: int, setpoints_only: bool = True) -> list[tuple]:
        """The ticks stamped in [t0_ns, t1_ns) (``setpoints_only``: those that commanded a setpoint)."""
        with self.lock:
            return [t for t in self.ticks if t0_ns <= t[0] < t1_ns and (t[3] or not setpoints_only)]

    def diagnostics(self) -> dict[str, str]:
        with self.lock:
            return dict(self.diag)


def diag_number(d: dict[str, str], key: str, default: float | None = 0.0) -> float | None:
    """A diagnostics value as a number (``default`` where it is missing or not a number)."""
    try:
        return float(d[key])
    except (KeyError, ValueError):
        return default


def percentiles(values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {"p50": None, "p99": None, "max": None, "mean": None}
    return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99)),
            "max": float(values.max()), "mean": float(values.mean())}


def period_errors(stamps_ns: np.ndarray, rate_hz: float) -> dict[str, Any]:
    """``|t_k - t_{k-1} - 1/rate|`` over tick stamps (ns) commanded at ``rate_hz``: p50 / p99 / max / mean in ms and
    in % of the period; a gap over 1.5 periods (a skipped tick) counts as a late tick."""
    stamps = np.sort(np.asarray(stamps_ns, dtype=np.int64))
    period_ms = 1e3 / rate_hz
    periods = np.diff(stamps) / 1e6
    err = np.abs(periods - period_ms)
    stats = percentiles(err)
    return {"period_ms": period_ms, "ticks": int(stamps.size), "error_ms": stats,
            "error_pct": {k: None if v is None else 100 * v / period_ms for k, v in stats.items()},
            "late_ticks": int(np.sum(periods > 1.5 * period_ms)),
            "mean_period_ms": float(periods.mean()) if periods.size else None}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_loop(spec: LoopSpec, config: Path, duration_s: float, warmup_s: float, domain_id: int,
             cpus: str = "") -> dict[str, Any]:
    """One configuration (see the module docstring); ``cpus``: rt.cpus of the thread loops ('' = any)."""
    params = node_params(config)
    dds, _ = dds_profile_environment(default_profile_path())
    overrides = {"chunk_topic": "/oxygen/action_chunk", "halt_topic": "/oxygen/halt", "output": "joint_state",
                 "command_rate_hz": spec.rate_hz, "loop": spec.loop, "rt.priority": spec.priority}
    if cpus and spec.loop == "thread":
        overrides["rt.cpus"] = cpus
    executor = NodeProcess(config, overrides, domain_id=domain_id, module="oxygen_ros.executor")
    node = NodeProcess(config, {"instruction": INSTRUCTION}, domain_id=domain_id) if spec.load == "soak" else None
    for proc in (executor, node):
        if proc is not None:
            proc.env.update(dds)
    probe = Probe([], [], domain_id=domain_id, name="executor_loops_probe")
    rec = TickRecorder(probe)
    load = None
    try:
        executor.start()
        if node is not None:
            node.start()
            load = start_load(params, domain_id, warmup_s + duration_s + 180, dds)
            ready = lambda: len(probe.chunks()) > 0 and len(rec.ticks) > 0  # noqa: E731
        else:
            ready = lambda: len(rec.ticks) > 0  # noqa: E731
        if not probe.wait_for(ready, 240.0):
            raise RuntimeError(f"{spec.name}: no tick (or no chunk); executor:\n{executor.output()[-2000:]}")
        time.sleep(warmup_s)
        before = rec.diagnostics()
        t0, cpu0 = time.time_ns(), _cpu_s(executor.proc.pid)
        time.sleep(duration_s)
        t1, cpu1 = time.time_ns(), _cpu_s(executor.proc.pid)
        time.sleep(1.5)  # a diagnostics report covers the window's end
        after, ticks = rec.diagnostics(), rec.window(t0, t1, setpoints_only=False)
    finally:
        probe.close()
        stop_load(load)
        code = executor.stop(timeout=10)
        node_code = node.stop(timeout=10) if node is not None else None
    if len(ticks) < 3:
        raise RuntimeError(f"{spec.name}: {len(ticks)} ticks in the window ({len(rec.ticks)} in all); executor "
                           f"diagnostics {after}; executor:\n{executor.output()[-3000:]}")
    stamps = np.array([t[0] for t in ticks], dtype=np.int64)
    wire = (np.array([t[4] for t in ticks], dtype=np.int64) - stamps) / 1e6
    b_under, a_under = diag_number(before, "underruns", None), diag_number(after, "underruns", None)
    return {**asdict(spec), "name": spec.name, "duration_s": duration_s, "executor_exit_code": code,
            "node_exit_code": node_code, "period": period_errors(stamps, spec.rate_hz),
            "wire_ms": {"p50": float(np.percentile(wire, 50)), "p99": float(np.percentile(wire, 99)),
                        "max": float(wire.max())},
            "underruns": None if a_under is None or b_under is None or spec.load == "idle" else int(a_under - b_under),
            "process_cpu_per_tick_ms": 1e3 * (cpu1 - cpu0) / len(ticks),
            "process_cpu_percent_of_core": 100.0 * (cpu1 - cpu0) / ((t1 - t0) / 1e9),
            "loop": {k: after.get(k) for k in ("message", "loop", "rt.policy", "rt.cpus", "loop.lateness_p50_ms",
                                                "loop.lateness_p99_ms", "loop.lateness_max_ms", "loop.late_ticks",
                                                "loop.skipped_deadlines", "loop.cpu_per_tick_ms",
                                                "loop.cpu_percent_of_core", "rt.switch_interval_s", "rt.gc")}}


def fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def loop_table(result: dict[str, Any]) -> str:
    """The side-by-side table (markdown: medians over repeats) and the verdicts."""
    rows = ["| configuration | policy | period error p50 / p99 / max (ms) | p99 % of period | late ticks | wire "
            "latency p50 / p99 (ms) | underruns | process CPU / tick (ms) | loop CPU / tick (ms) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, r in _medians(result["runs"]).items():
        rows.append(f"| {name} | {r['policy']} | {fmt(r['p50'], '.3f')} / {fmt(r['p99'], '.3f')} / "
                    f"{fmt(r['max'], '.1f')} | "
                    f"{fmt(r['p99_pct'], '.1f')}% | {r['late']} | {fmt(r['wire50'])} / {fmt(r['wire99'])} | "
                    f"{'-' if r['underruns'] is None else r['underruns']} | {fmt(r['cpu'], '.3f')} | "
                    f"{r['loop_cpu'] or '-'} |")
    lines = rows + ["", f"Host: {result['host']}; {result['date']}; command: `{result['command']}`; soak: the node "
                    "(preset's model) + 2 cameras 640x480 rgb8 at 30 Hz + joint_states at 50 Hz from another "
                    f"process; {result['repeat']} repeat(s), {result['duration_s']:g} s each (medians).", ""]
    lines += [f"- {v}" for v in loop_verdicts(result["runs"])]
    lines += [f"- {f['name']} (repeat {f['repeat'] + 1}) FAILED: {f['error'][:300]}" for f in result.get("failed", [])]
    return "\n".join(lines)


def _medians(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["name"] for r in runs):
        rs = [r for r in runs if r["name"] == name]

        def med(get, rs=rs):
            vals = [v for v in (get(r) for r in rs) if v is not None]
            return float(np.median(vals)) if vals else None
        under = [r["underruns"] for r in rs if r["underruns"] is not None]
        out[name] = {"policy": rs[0]["loop"].get("rt.policy") or "-",
                     "rate": rs[0]["rate_hz"], "load": rs[0]["load"],
                     "p50": med(lambda r: r["period"]["error_ms"]["p50"]),
                     "p99": med(lambda r: r["period"]["error_ms"]["p99"]),
                     "max": med(lambda r: r["period"]["error_ms"]["max"]),
                     "p99_pct": med(lambda r: r["period"]["error_pct"]["p99"]),
                     "late": int(sum(r["period"]["late_ticks"] for r in rs)),
                     "wire50": med(lambda r: r["wire_ms"]["p50"]), "wire99": med(lambda r: r["wire_ms"]["p99"]),
                     "underruns": int(sum(under)) if under else None,
                     "cpu": med(lambda r: r["process_cpu_per_tick_ms"]),
                     "loop_cpu": rs[0]["loop"].get("loop.cpu_per_tick_ms")}
    return out


def loop_verdicts(runs: list[dict[str, Any]]) -> list[str]:
    """Idle: thread vs timer p99 ratio (target >= 5x); soak at 100 Hz with rt.priority: p99 <= 20% of the period."""
    m = _medians(runs)
    out = []
    for rate in (100, 500):
        timer = m.get(f"timer_{rate}hz_idle")
        for variant in ("thread", "thread_rt"):
            new = m.get(f"{variant}_{rate}hz_idle")
            if timer and new and timer["p99"] is not None and new["p99"]:
                ratio = timer["p99"] / new["p99"]
                out.append(f"idle {rate} Hz: p99 period error timer {timer['p99']:.3f} ms vs {variant} "
                           f"{new['p99']:.3f} ms: {ratio:.1f}x better (target >= 5x: "
                           f"{'met' if ratio >= 5 else 'NOT met'})")
        for load in ("idle", "soak"):
            rt = m.get(f"thread_rt_{rate}hz_{load}")
            if rt and rt["p99_pct"] is not None:
                out.append(f"thread_rt {rate} Hz {load}: p99 {rt['p99']:.3f} ms = {rt['p99_pct']:.1f}% of the period "
                           f"(target <= 20%: {'met' if rt['p99_pct'] <= 20 else 'NOT met'})")
    return out


def plot_loops(result: dict[str, Any], path: Path) -> Path:
    """p99 period error per configuration (log scale), grouped by rate and load."""
    m = _medians(result["runs"])
    groups = [(rate, load) for load in ("idle", "soak") for rate in (100.0, 500.0)]
    variants = ("timer", "thread", "thread_rt")
    fig, ax = subplots(figsize=(9, 4.5))
    width = 0.25
    for i, v in enumerate(variants):
        ys = [m.get(f"{v}_{rate:g}hz_{load}", {}).get("p99") for rate, load in groups]
        xs = [g + (i - 1) * width for g in range(len(groups))]
        ax.bar([x for x, y in zip(xs, ys, strict=True) if y], [y for y in ys if y], width, label=v)
    for g, (rate, _) in enumerate(groups):
        ax.hlines(0.2 * 1e3 / rate, g - 0.45, g + 0.45, colors="k", linestyles="--", linewidth=0.8)
    ax.set_xticks(range(len(groups)), [f"{rate:g} Hz {load}" for rate, load in groups])
    ax.set_yscale("log")
    ax.set_ylabel("p99 period error (ms); dashed: 20% of the period")
    ax.set_title(f"executor command loops side by side ({result['host']})", fontsize=9)
    ax.legend()
    return save_figure(fig, path)
