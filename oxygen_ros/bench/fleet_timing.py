"""Time per bag of a fleet evaluation: sequentially in-process against local Ray with 1 and 2 workers, on the same demo
bags in one run (``python -m oxygen_ros.bench.fleet_timing --bags 20 --out runs/fleet_timing``; docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from oxygen_ros.bench.runner import machine_info
from oxygen_ros.evaluation.cli import read_params_file
from oxygen_ros.evaluation.fleet import evaluate_fleet
from oxygen_ros.evaluation.reference import ScoringOptions
from oxygen_ros.toy.demo_fleet import COMMAND_TOPIC, NARRATION_TOPIC, SUBTASK_TOPIC, make_demo_fleet

__all__ = ["main", "run"]

CONFIG = Path(__file__).resolve().parents[2] / "config" / "tabletop.yaml"


def _outcome(row: dict[str, Any]) -> tuple:
    return row["status"], row.get("outputs_sha256"), row.get("actions"), row.get("language")


def run(count: int, out: Path, configs: Sequence[tuple[str, bool, int]]) -> dict[str, Any]:
    """Evaluate ``count`` demo bags under each (label, use_ray, workers) of ``configs``; write and return results."""
    params = {**read_params_file(CONFIG), "k_auto": False, "actions_per_chunk": 2}
    scoring = ScoringOptions(COMMAND_TOPIC, (), {"subtask": SUBTASK_TOPIC, "narration": NARRATION_TOPIC})
    points: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="oxygen_fleet_timing_") as tmp:
        bags = make_demo_fleet(Path(tmp) / "bags", count, progress=False)
        reference = None
        for label, use_ray, workers in configs:
            t0 = time.perf_counter()
            fleet = evaluate_fleet(bags, Path(tmp) / label, params, scoring=scoring, use_ray=use_ray,
                                   workers=workers, rerun=True, plots=False, progress=False)
            wall = time.perf_counter() - t0
            outcomes = [_outcome(r) for r in fleet["rows"]]
            reference = reference or outcomes
            points.append({"label": label, "engine": fleet["timing"]["engine"], "workers": fleet["timing"]["workers"],
                           "bags": count, "evaluated": fleet["bags"]["evaluated"], "wall_s": wall,
                           "wall_per_bag_s": wall / count, "bag_s_mean": fleet["timing"].get("bag_s_mean"),
                           "ray_init_s": fleet["timing"].get("ray_init_s"), "identical": outcomes == reference,
                           "frames": fleet["aggregate"]["frames"], "mae": fleet["aggregate"]["mae"]})
    base = points[0]["wall_per_bag_s"]
    for p in points:
        p["wall_per_bag_vs_sequential"] = p["wall_per_bag_s"] / base
    results = {"machine": {**machine_info(torch.device("cpu")), "cpus": os.cpu_count(),
                           "loadavg_after": os.getloadavg()},  # other jobs on the same cores slow every run
               "params": {"config": str(CONFIG.name), "k_auto": False, "actions_per_chunk": 2}, "points": points}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    lines = [f"# Fleet evaluation time per bag ({count} tabletop demo bags, embedded model)", "",
             f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end (other jobs share them).", "",
             "| run | workers | wall s | wall s / bag | vs sequential | s / bag in a worker | Ray start s | "
             "identical results |", "|---|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p['label']} | {p['workers']} | {p['wall_s']:.1f} | {p['wall_per_bag_s']:.3f} | "
                     f"{p['wall_per_bag_vs_sequential']:.2f}x | {p['bag_s_mean']:.3f} | "
                     f"{'-' if p['ray_init_s'] is None else format(p['ray_init_s'], '.1f')} | {p['identical']} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    _plot(points, out / "fleet_timing.png", count)
    return results


def _plot(points: list[dict[str, Any]], path: Path, count: int) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    x = range(len(points))
    ax.bar([i - 0.2 for i in x], [p["wall_per_bag_s"] for p in points], width=0.4, label="wall / bag (all)")
    ax.bar([i + 0.2 for i in x], [p["bag_s_mean"] for p in points], width=0.4, label="inside a worker / bag")
    for i, p in enumerate(points):
        ax.text(i - 0.2, p["wall_per_bag_s"], f"{p['wall_per_bag_vs_sequential']:.2f}x", ha="center", va="bottom")
    ax.set_xticks(list(x), [p["label"] for p in points])
    ax.set_ylabel("seconds per bag")
    ax.set_title(f"Fleet evaluation of {count} bags: sequential vs local Ray")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bags", type=int, default=20, help="demo bags (default 20)")
    p.add_argument("--out", type=Path, default=Path("runs/fleet_timing"))
    args = p.parse_args(argv)
    results = run(args.bags, args.out, [("sequential", False, 1), ("ray_1", True, 1), ("ray_2", True, 2)])
    print((args.out / "summary.md").read_text())
    return 0 if all(pt["identical"] for pt in results["points"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
