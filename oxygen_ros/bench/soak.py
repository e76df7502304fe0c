"""Frame timing under robot-like input load: a preset's node as a process, two cameras at 30 Hz and joint states at
50 Hz from another process, for minutes; deadline misses, late ticks, repeated observations (docs/benchmarks.md).

    python -m oxygen_ros.bench.soak --config config/tabletop.yaml --duration 180 --out runs/soak_tabletop
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from oxygen_ros.ros.dds import dds_profile_environment, default_profile_path
from oxygen_ros.testing.probe import Probe, header_ns
from oxygen_ros.testing.process import NodeProcess, ros_env, source_checkout
from oxygen_ros.util.stats import percentile

from .report import save_figure, subplots, write_run

__all__ = ["main", "run_soak"]

INSTRUCTION = "put the red block on the blue plate"


def node_params(config: Path) -> dict[str, Any]:
    """The ``ros__parameters`` of the node in a parameter file."""
    import yaml

    return next(iter(yaml.safe_load(config.read_text()).values()))["ros__parameters"]


def start_load(params: dict[str, Any], domain_id: int, seconds: float, dds: dict[str, str],
               camera_size: str = "640x480", camera_rate: float = 30.0, joint_rate: float = 50.0) -> subprocess.Popen:
    """The soak load every system benchmark uses: the node's cameras (``camera_size`` rgb8 at ``camera_rate``) and
    joint states (at ``joint_rate``) from a process of their own, for ``seconds``; stop it with :func:`stop_load`."""
    cmd = [sys.executable, "-m", "oxygen_ros.testing.camera_streams",
           *[f"{topic}:{camera_size}:rgb8" for topic in params["camera_topics"]], "--rate", str(camera_rate),
           "--duration", str(seconds), "--joints", ",".join(params["joint_names"]), "--joint-rate", str(joint_rate)]
    return subprocess.Popen(cmd, env={**ros_env(domain_id), **dds}, cwd=source_checkout(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)


def stop_load(load: subprocess.Popen | None) -> None:
    """Stop a load from :func:`start_load` (None: none was started)."""
    if load is not None:
        load.terminate()
        load.wait(timeout=10)


def load_parser(doc: str, duration: float, warmup: float, out: str) -> argparse.ArgumentParser:
    """The command line of the benchmarks on this load: the preset, the measured window, the load's cameras, the
    DDS domain and ``--out`` (``doc``: the module docstring, its first paragraph the description)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=(source_checkout() or Path.cwd()) / "config" / "tabletop.yaml")
    ap.add_argument("--duration", type=float, default=duration, help="measured seconds (per run)")
    ap.add_argument("--warmup", type=float, default=warmup, help="seconds after the first chunk or tick before "
                    "measuring")
    ap.add_argument("--camera-size", default="640x480", help="the load's camera images")
    ap.add_argument("--domain-id", type=int, default=150 + os.getpid() % 60)
    ap.add_argument("--out", type=Path, default=Path(out))
    return ap


def _counts(diag: dict[str, str]) -> dict[str, float]:
    out = {}
    for key, value in diag.items():
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


def run_soak(config: Path, duration_s: float, warmup_s: float, camera_size: str, camera_rate: float,
             joint_rate: float, domain_id: int) -> dict[str, Any]:
    """Run the node of ``config`` under the load for ``warmup_s + duration_s`` seconds; the measured window's
    figures (see the module docstring)."""
    params = node_params(config)
    node = NodeProcess(config, {"instruction": INSTRUCTION}, domain_id=domain_id)
    dds, _ = dds_profile_environment(default_profile_path())  # raw images over shared memory, as the launch file
    node.env.update(dds)
    probe = Probe([], [], domain_id=domain_id, name="soak_probe")
    load = None
    try:
        node.start()
        load = start_load(params, domain_id, warmup_s + duration_s + 60, dds, camera_size, camera_rate, joint_rate)
        if not probe.wait_for(lambda: len(probe.chunks()) > 0, 240.0):
            raise RuntimeError(f"the node published no chunk; its log:\n{node.output()[-3000:]}")
        time.sleep(warmup_s)
        t0, before = time.monotonic(), _counts(probe.diagnostics())
        with tqdm(total=int(duration_s), desc="soak", unit="s") as bar:
            while (elapsed := time.monotonic() - t0) < duration_s:
                time.sleep(min(1.0, duration_s - elapsed))
                bar.update(int(time.monotonic() - t0) - bar.n)
        time.sleep(1.5)  # one more diagnostics report covers the window's end
        after = _counts(probe.diagnostics())
        chunks = probe.chunks(since=t0)
    finally:
        probe.close()
        stop_load(load)
        code = node.stop()
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after
             if k == "frames" or k == "deadline_misses" or k.startswith("skipped.")}
    frames = int(delta.get("frames", 0))
    stamps = [header_ns(c) for c in chunks]
    repeated = sum(1 for a, b in zip(stamps, stamps[1:], strict=False) if b <= a)
    latency = [c.inference_latency.sec + c.inference_latency.nanosec / 1e9 for c in chunks]
    gaps = np.diff(np.array(stamps, dtype=np.float64)) / 1e9 if len(stamps) > 1 else np.zeros(0)
    ticks = duration_s * float(params["control_rate_hz"])
    late = int(delta.get("skipped.late_tick", 0))
    return {
        "config": str(config), "duration_s": duration_s, "warmup_s": warmup_s, "camera": camera_size,
        "camera_rate_hz": camera_rate, "joint_rate_hz": joint_rate, "control_rate_hz": params["control_rate_hz"],
        "node_exit_code": code, "frames": frames, "frame_rate_hz": frames / duration_s, "ticks": ticks,
        "deadline_misses": int(delta.get("deadline_misses", 0)),
        "deadline_miss_pct": 100.0 * delta.get("deadline_misses", 0) / max(frames, 1),
        "late_ticks": late, "late_tick_pct": 100.0 * late / ticks,
        "skipped": {k.removeprefix("skipped."): int(v) for k, v in delta.items() if k.startswith("skipped.") and v},
        "chunks": len(chunks), "repeated_observations": repeated,
        "latency_ms": {"p50": percentile(latency, 50, 1e3), "p99": percentile(latency, 99, 1e3)},
        "chunk_gap_ms": {"p50": percentile(list(gaps), 50, 1e3), "p99": percentile(list(gaps), 99, 1e3),
                         "max": float(gaps.max() * 1e3) if gaps.size else None},
        "series": {"t_s": [round(float(s - stamps[0]) / 1e9, 3) for s in stamps] if stamps else [],
                   "latency_ms": [round(v * 1e3, 2) for v in latency]},
    }


def _table(r: dict[str, Any]) -> str:
    skipped = ", ".join(f"{k} {v}" for k, v in sorted(r["skipped"].items())) or "none"
    return "\n".join([
        "| config | window | frames (rate) | deadline misses | late ticks | repeated observations | latency p50 / p99 "
        "| chunk gap p50 / p99 / max |",
        "|---|---|---|---|---|---|---|---|",
        f"| `{Path(r['config']).name}` | {r['duration_s']:.0f} s | {r['frames']} ({r['frame_rate_hz']:.2f} Hz) | "
        f"{r['deadline_misses']} ({r['deadline_miss_pct']:.2f}%) | {r['late_ticks']} ({r['late_tick_pct']:.2f}%) "
        f"| {r['repeated_observations']} | {r['latency_ms']['p50']:.1f} / {r['latency_ms']['p99']:.1f} ms | "
        f"{r['chunk_gap_ms']['p50']:.0f} / {r['chunk_gap_ms']['p99']:.0f} / {r['chunk_gap_ms']['max']:.0f} ms |",
        "",
        f"Load: 2 cameras {r['camera']} rgb8 at {r['camera_rate_hz']:g} Hz and joint_states at "
        f"{r['joint_rate_hz']:g} Hz from another process. Skipped ticks by reason: {skipped}.",
    ])


def _plot(r: dict[str, Any], path: Path) -> None:
    fig, (a, b) = subplots(1, 2, figsize=(11, 3.6))
    t, lat = r["series"]["t_s"], r["series"]["latency_ms"]
    a.plot(t, lat, ".", ms=2)
    a.set(xlabel="observation time (s)", ylabel="chunk latency (ms)", title="inference latency per chunk")
    gaps = np.diff(np.array(t)) * 1e3 if len(t) > 1 else []
    b.hist(gaps, bins=60)
    period = 1e3 / float(r["control_rate_hz"])
    b.axvline(period, color="k", ls="--", lw=1, label=f"control period {period:.0f} ms")
    b.set(xlabel="gap between consecutive chunks' observations (ms)", ylabel="chunks", yscale="log",
          title=f"{r['deadline_miss_pct']:.2f}% misses, {r['repeated_observations']} repeated observations")
    b.legend()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    ap = load_parser(__doc__, duration=180.0, warmup=10.0, out="runs/soak_tabletop")
    ap.add_argument("--camera-rate", type=float, default=30.0)
    ap.add_argument("--joint-rate", type=float, default=50.0)
    args = ap.parse_args(argv)
    result = run_soak(args.config, args.duration, args.warmup, args.camera_size, args.camera_rate, args.joint_rate,
                      args.domain_id)
    if not result["chunks"]:
        raise SystemExit(f"no chunk in the measured window: {result}")
    write_run(args.out, result, _table(result), _plot, "soak.png")


if __name__ == "__main__":
    main()
