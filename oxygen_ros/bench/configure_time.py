"""How long the node takes to configure with compiled steps (``graphs: aot``): cold and warm, each a real node
process started with ``autostart`` (docs/benchmarks.md).

    python -m oxygen_ros.bench.configure_time --out runs/compile_cache/node_configure.json --warm 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

CONFIGURED = re.compile(r"configured in ([0-9.]+) s")


def configure_once(args: argparse.Namespace, checkpoint: Path, cache_dir: Path, log: Path) -> dict:
    """Start the node, wait for its configure line, stop it; the seconds it reported and its process wall time."""
    cmd = [sys.executable, "-m", "oxygen_ros.ros", "--ros-args", "--params-file", str(args.params_file),
           "-p", f"checkpoint_path:={checkpoint}", "-p", "graphs:=aot", "-p", f"compile_cache_dir:={cache_dir}",
           "-p", f"torch_threads:={args.threads}", "-p", "normalization:=none",
           "-p", "camera_names:=[base_0_rgb, left_wrist_0_rgb]"]
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())
        seconds = None
        try:
            while time.perf_counter() - t0 < args.timeout:
                text = log.read_text()
                if (m := CONFIGURED.search(text)) or "configure failed" in text or proc.poll() is not None:
                    seconds = float(m.group(1)) if m else None
                    break
                time.sleep(0.5)
        finally:
            wall = time.perf_counter() - t0
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    if seconds is None:
        raise SystemExit(f"the node did not configure; see {log}:\n{log.read_text()[-2000:]}")
    return {"configure_s": seconds, "process_wall_s": round(wall, 2)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", default="", help="a checkpoint (default: a random small LIBERO one)")
    ap.add_argument("--params-file", default=str(Path(__file__).resolve().parents[2] / "config" / "libero.yaml"))
    ap.add_argument("--cache-dir", default="", help="compile_cache_dir (default: a fresh, empty one)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warm", type=int, default=3, help="warm configures after the cold one")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="configure_time_"))
    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    if checkpoint is None:
        from oxygen_ros.policy.synthetic import make_random_checkpoint

        checkpoint = make_random_checkpoint(work / "ckpt", "small", "libero", tokenizer=True, vocab_size=1024)
    cache_dir = Path(args.cache_dir) if args.cache_dir else work / "compiled"
    runs = []
    for i in range(1 + args.warm):
        kind = "cold" if i == 0 and not args.cache_dir else "warm"
        r = {"run": i, "cache": kind, **configure_once(args, checkpoint, cache_dir, work / f"node{i}.log")}
        print(json.dumps(r), flush=True)
        runs.append(r)
    warm = [r["configure_s"] for r in runs if r["cache"] == "warm"]
    record = {
        "what": "node configure with graphs: aot (the node's own 'configured in' line), cold = empty cache",
        "params_file": Path(args.params_file).name, "checkpoint": "random small/libero" if not args.checkpoint
        else str(args.checkpoint), "threads": args.threads, "torch": torch.__version__,
        "host": {"processor": platform.processor(), "cpus": os.cpu_count()},
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "runs": runs, "warm_max_s": max(warm) if warm else None,
        "cache_entries": sorted(p.name for p in cache_dir.glob("*.pt2")),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
