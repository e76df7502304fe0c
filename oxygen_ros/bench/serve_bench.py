"""``oxygen-serve`` under load: 1, 4 and 16 concurrent openpi clients (``serve_client.py``) against the batched
server and an openpi-style serial server, side by side (docs/benchmarks.md). Writes ``results.json``,
``summary.md`` and ``serve.png`` to ``--out``.

    python -m oxygen_ros.bench.serve_bench --out runs/serve_small
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from oxygen_ros.bench.report import save_figure, subplots, write_run
from oxygen_ros.bench.runner import machine_info
from oxygen_ros.engine.threads import run_in_scratch_thread
from oxygen_ros.policy.synthetic import make_random_checkpoint
from oxygen_ros.serve import ServerThread
from oxygen_ros.serve.options import build_server, parse
from oxygen_ros.util.stats import percentile

MODES = ("serial", "batched")


def run_point(checkpoint: Path, mode: str, clients: int, requests: int, window_ms: float) -> dict:
    """One server (``mode``) and ``clients`` client processes sending ``requests`` requests each."""
    flags = ["--checkpoint", str(checkpoint), "--keys", "libero", "--normalization", "none", "--host", "127.0.0.1",
             "--port", "0", "--request-every-n-frames", "0", "--batch-window-ms", str(window_ms),
             "--max-batch", "16", *(["--serial"] if mode == "serial" else [])]
    server = build_server(parse(flags))
    with ServerThread(server) as port:
        procs = [subprocess.Popen([sys.executable, "-m", "oxygen_ros.bench.serve_client", "--port", str(port),
                                   "--client", str(i), "--requests", str(requests)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True) for i in range(clients)]
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a client failed to start (exit {p.wait()})")
        for p in procs:  # all connected and warmed up: go
            p.stdin.write("go\n")
            p.stdin.flush()
        per_client = [json.loads(p.stdout.readline()) for p in procs]
        for p in procs:
            p.wait(60)
    records = [r for c in per_client for r in c]
    span = max(r["received"] for r in records) - min(r["sent"] for r in records)
    rtt = np.array([(r["received"] - r["sent"]) * 1e3 for r in records])
    overhead = np.array([r["server_ms"] - r["policy_ms"] for r in records])
    horizon = len(records[0]["actions"])
    return {"mode": mode, "clients": clients, "requests_per_client": requests, "seconds": span,
            "chunks_per_s": len(records) / span, "actions_per_s": len(records) * horizon / span,
            "rtt_p50_ms": percentile(rtt, 50), "rtt_p99_ms": percentile(rtt, 99),
            "server_overhead_p50_ms": percentile(overhead, 50), "server_overhead_p99_ms": percentile(overhead, 99),
            "policy_ms_p50": float(np.median([r["policy_ms"] for r in records])),
            "mean_batch": float(np.mean([r["batch"] for r in records])),
            "actions": [[r["actions"] for r in c] for c in per_client]}


def table(res: dict) -> str:
    rows = ["| clients | server | actions/s | chunks/s | RTT p50 (ms) | RTT p99 (ms) | server overhead p50 / p99 (ms) "
            "| mean batch | batched / serial |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for n in res["clients"]:
        pts = {p["mode"]: p for p in res["points"] if p["clients"] == n}
        for mode in MODES:
            p = pts[mode]
            ratio = f"**{p['actions_per_s'] / pts['serial']['actions_per_s']:.2f}x**" if mode == "batched" else ""
            rows.append(f"| {n} | {mode} | {p['actions_per_s']:.1f} | {p['chunks_per_s']:.2f} | {p['rtt_p50_ms']:.0f} "
                        f"| {p['rtt_p99_ms']:.0f} | {p['server_overhead_p50_ms']:.1f} / "
                        f"{p['server_overhead_p99_ms']:.1f} | {p['mean_batch']:.1f} | {ratio} |")
    rows.append(f"\nmax |actions batched - serial| over every client and request: {res['max_action_diff']:.2e}")
    return "\n".join(rows)


def plot(res: dict, path: Path) -> Path:
    fig, (a, b) = subplots(1, 2, figsize=(10, 4))
    ns = res["clients"]
    x = np.arange(len(ns))
    for j, (mode, color) in enumerate((("serial", "tab:gray"), ("batched", "tab:green"))):
        pts = [next(p for p in res["points"] if p["clients"] == n and p["mode"] == mode) for n in ns]
        a.bar(x + (j - 0.5) * 0.38, [p["actions_per_s"] for p in pts], 0.38, label=mode, color=color)
        b.plot(ns, [p["rtt_p50_ms"] for p in pts], "o-", color=color, label=f"{mode} p50")
        b.plot(ns, [p["rtt_p99_ms"] for p in pts], "o--", color=color, label=f"{mode} p99")
    a.set_xticks(x, [str(n) for n in ns])
    a.set_xlabel("concurrent clients")
    a.set_ylabel("actions / s (all clients)")
    a.legend()
    b.set_xscale("log", base=2)
    b.set_xlabel("concurrent clients")
    b.set_ylabel("round trip (ms)")
    b.legend(fontsize=8)
    fig.suptitle(f"oxygen-serve on {res['config']} ({res['machine']['device']}, {res['torch_threads']} torch threads): "
                 "openpi clients, batched vs serial")
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/serve_small"))
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests", type=int, nargs="+", default=[6, 4, 3], help="per client, per client count")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    ap.add_argument("--window-ms", type=float, default=5.0)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    res: dict = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_info(torch.device("cpu")),
                 "config": "small/libero", "torch_threads": args.threads, "clients": args.clients,
                 "window_ms": args.window_ms, "points": []}
    with tempfile.TemporaryDirectory() as tmp:
        # torch work off the servers' threads runs on a thread that ends (engine/threads.py: one OpenMP team)
        ckpt = run_in_scratch_thread(make_random_checkpoint, Path(tmp), "small", "libero", tokenizer=True,
                                     vocab_size=1024)
        for i, (n, r) in enumerate(zip(args.clients, args.requests, strict=True)):
            order = MODES if i % 2 == 0 else MODES[::-1]  # alternate which server runs first
            for mode in order:
                point = run_point(ckpt, mode, n, r, args.window_ms)
                print(f"{n} clients, {mode}: {point['actions_per_s']:.1f} actions/s, RTT p50 "
                      f"{point['rtt_p50_ms']:.0f} ms, mean batch {point['mean_batch']:.1f}", flush=True)
                res["points"].append(point)
    diffs = []
    for n in args.clients:
        pts = {p["mode"]: p for p in res["points"] if p["clients"] == n}
        diffs.append(float(np.max(np.abs(np.array(pts["serial"]["actions"]) - np.array(pts["batched"]["actions"])))))
    res["max_action_diff"] = max(diffs)
    for p in res["points"]:
        p.pop("actions")
    write_run(args.out, res, table(res), plot, "serve.png")


if __name__ == "__main__":
    main()
