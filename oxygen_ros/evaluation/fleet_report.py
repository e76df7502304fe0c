"""The fleet report: one row per bag, aggregates, the worst bags and the timing (``fleet.json``), the same as a
Markdown table (``fleet.md``) and plots (``fleet_error_distribution.png``, ``fleet_worst_bags.png``,
``fleet_error_vs_horizon.png``).

Aggregates are weighted by frames: a scalar action score is the mean of the bags' scores weighted by each bag's
scored chunks (one per frame that had a covered step); the error per horizon step and joint pools the bags' sums
(every scored action counts once); language rates pool every scored output.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .plots import plot_error_vs_step

__all__ = ["FLEET_PLOTS", "WORST_BAGS", "bag_row", "build_fleet_report", "fleet_table", "write_fleet_outputs"]

FLEET_PLOTS = ("fleet_error_distribution.png", "fleet_worst_bags.png", "fleet_error_vs_horizon.png")
WORST_BAGS = 5
_ACTION_KEYS = ("mae", "mse", "first_mae", "executed_mae", "within_tolerance_executed", "within_tolerance_chunk")


def bag_row(name: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """A bag's row: its status, reason (failed), frames, action scores and language scores."""
    row: dict[str, Any] = {"name": name, "bag": result["bag"], "status": result["status"],
                           "digest": result.get("digest"), "worker": result.get("worker"),
                           "wall_s": result.get("wall_s")}
    if result["status"] == "failed":
        row["reason"] = result.get("reason", "")
        return row
    rep = result["report"]
    row.update(frames=rep["frames"], ticks=rep["ticks"], skipped=rep["skipped"], eval_s=rep["wall_s"],
               outputs_sha256=rep["digest"]["sha256"])
    a = rep["scores"]["actions"]
    row["actions"] = None if not a else {
        "chunks": a["chunks"], "uncovered_chunks": a["uncovered_chunks"], "mae": a["mae"], "mse": a["mse"],
        "first_mae": a["first_action"]["mae"], "executed_mae": a["executed"]["mae"],
        "within_tolerance_executed": a["within_tolerance"]["executed"],
        "within_tolerance_chunk": a["within_tolerance"]["chunk"]}
    row["language"] = {s: {"scored": v["scored"], "exact_match": v["exact_match"], "edit_distance": v["edit_distance"]}
                       for s, v in rep["scores"]["language"].items()}
    return row


def _weighted(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    pairs = [(r["actions"]["chunks"], r["actions"][key]) for r in rows if r["actions"][key] is not None]
    total = sum(w for w, _ in pairs)
    return sum(w * v for w, v in pairs) / total if total else None


def _pooled_steps(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The error per horizon step and joint over every scored action of the bags sharing the first one's joints
    and horizon (a ``scores.actions``-shaped dict for the plot)."""
    actions = [r["scores"]["actions"] for r in reports if r and r["scores"]["actions"]
               and r["scores"]["actions"]["chunks"]]
    if not actions:
        return None
    first = actions[0]
    same = [a for a in actions if a["joints"] == first["joints"] and a["horizon"] == first["horizon"]]
    abs_sum = sum(np.asarray(a["sums"]["abs"]) for a in same)
    count = sum(np.asarray(a["sums"]["count"]) for a in same)
    n_j = len(first["joints"])
    with np.errstate(invalid="ignore", divide="ignore"):
        per = abs_sum / count[:, None]
        step = abs_sum.sum(1) / (count * n_j)
        joint = abs_sum.sum(0) / max(int(count.sum()), 1)

    def listed(a: np.ndarray) -> list:
        return [None if not np.isfinite(v) else float(v) for v in a]

    return {"joints": first["joints"], "horizon": first["horizon"], "n_execute": first["n_execute"],
            "bags": len(same), "count_per_step": count.tolist(), "mae_per_step_joint": [listed(r) for r in per],
            "mae_per_step": listed(step), "mae_per_joint": listed(joint)}


def build_fleet_report(results: Sequence[Mapping[str, Any]], names: Sequence[str], *, params: Mapping[str, Any],
                       options: Mapping[str, Any], run: str, timing: Mapping[str, Any]) -> dict[str, Any]:
    """``fleet.json``'s content from the workers' results (in bag order) and the run's settings and timing."""
    rows = [bag_row(n, r) for n, r in zip(names, results, strict=True)]
    done = [r for r in rows if r["status"] != "failed"]
    scored = [r for r in done if r["actions"] and r["actions"]["chunks"]]
    language: dict[str, Any] = {}
    for res in results:
        for stream, v in ((res.get("report") or {}).get("scores") or {}).get("language", {}).items():
            acc = language.setdefault(stream, {"scored": 0, "exact": 0, "edit_distance_sum": 0.0})
            acc["scored"] += v["scored"]
            acc["exact"] += v["exact"]
            acc["edit_distance_sum"] += v["edit_distance_sum"]
    for acc in language.values():
        acc["exact_match"] = acc["exact"] / acc["scored"] if acc["scored"] else None
        acc["edit_distance"] = acc.pop("edit_distance_sum") / acc["scored"] if acc["scored"] else None
    worst = sorted(scored, key=lambda r: -r["actions"]["mae"])[:WORST_BAGS]
    evaluated = [r for r in rows if r["status"] == "ok"]
    timing = dict(timing)
    if evaluated:
        timing["bag_s_mean"] = float(np.mean([r["wall_s"] for r in evaluated]))  # inside the worker, per bag
        timing["wall_per_evaluated_bag_s"] = timing["wall_s"] / len(evaluated)
    return {
        "version": 1,
        "config": {"params": dict(params), **options, "run_key": run},
        "bags": {"total": len(rows), "evaluated": len(evaluated),
                 "cached": sum(r["status"] == "cached" for r in rows),
                 "failed": sum(r["status"] == "failed" for r in rows)},
        "aggregate": {"weighting": "frames (each bag's scored chunks)",
                      "bags_scored": len(scored), "frames": sum(r["frames"] for r in done),
                      "chunks": sum(r["actions"]["chunks"] for r in scored),
                      **{k: _weighted(scored, k) for k in _ACTION_KEYS},
                      "per_step": _pooled_steps([r.get("report") for r in results]),
                      "language": language},
        "worst": [{"name": r["name"], "mae": r["actions"]["mae"], "first_mae": r["actions"]["first_mae"]}
                  for r in worst],
        "timing": timing,
        "rows": rows,
    }


def _fmt(v: Any, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec)


def fleet_table(fleet: Mapping[str, Any]) -> str:
    """The fleet report as Markdown: a summary, one row per bag, the aggregate row, failures and worst bags."""
    streams = sorted(fleet["aggregate"]["language"])
    b, t, agg = fleet["bags"], fleet["timing"], fleet["aggregate"]
    lines = [f"# Fleet evaluation: {b['total']} bags ({b['evaluated']} evaluated, {b['cached']} cached, "
             f"{b['failed']} failed)", "",
             f"Engine {t['engine']} with {t['workers']} worker(s); wall {t['wall_s']:.1f} s"
             + (f", {t['bag_s_mean']:.2f} s per bag inside a worker" if "bag_s_mean" in t else "") + ". Reference "
             f"{fleet['config']['scoring']['reference_topic'] or 'joint states'}, tolerance "
             f"{fleet['config']['scoring']['tolerance']}; MAE/MSE in robot units.", ""]
    head = ["bag", "status", "frames", "chunks", "MAE", "MSE", "first MAE", "executed MAE", "within tol",
            *(f"{s} exact" for s in streams), *(f"{s} edit" for s in streams), "s"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cells(name: str, status: str, frames: Any, a: Mapping[str, Any] | None, lang: Mapping[str, Any],
              wall: Any) -> str:
        a = a or {}
        vals = [name, status, str(frames), str(a.get("chunks", "-")), _fmt(a.get("mae")), _fmt(a.get("mse"), ".5f"),
                _fmt(a.get("first_mae")), _fmt(a.get("executed_mae")),
                _fmt(a.get("within_tolerance_executed"), ".0%"),
                *(_fmt((lang.get(s) or {}).get("exact_match"), ".0%") for s in streams),
                *(_fmt((lang.get(s) or {}).get("edit_distance"), ".3f") for s in streams), _fmt(wall, ".2f")]
        return "| " + " | ".join(vals) + " |"

    for r in fleet["rows"]:
        lines.append(cells(r["name"], r["status"], r.get("frames", "-"), r.get("actions"), r.get("language", {}),
                           r.get("wall_s")))
    lines.append(cells("**all (frame-weighted)**", "", agg["frames"], {**agg, "chunks": agg["chunks"]},
                       agg["language"], None))
    failed = [r for r in fleet["rows"] if r["status"] == "failed"]
    if failed:
        lines += ["", "Failed bags:", *(f"- {r['name']}: {r['reason']}" for r in failed)]
    if fleet["worst"]:
        lines += ["", "Worst bags (MAE): " + ", ".join(f"{w['name']} {w['mae']:.4f}" for w in fleet["worst"])]
    return "\n".join(lines) + "\n"


def _plots(fleet: Mapping[str, Any], out: Path) -> list[Path]:
    from matplotlib.figure import Figure

    scored = [r for r in fleet["rows"] if r.get("actions") and r["actions"]["chunks"]]
    agg = fleet["aggregate"]
    paths = []
    fig = Figure(figsize=(9, 4.5))
    ax = fig.add_subplot()
    if scored:
        series = {"whole chunk": "mae", "first action": "first_mae", "executed part": "executed_mae"}
        data = {label: [r["actions"][k] for r in scored if r["actions"][k] is not None]
                for label, k in series.items()}
        bins = np.linspace(0, max(max(v) for v in data.values() if v) * 1.05 or 1.0, 21)
        for (label, vals), color in zip(data.items(), ("tab:blue", "tab:orange", "tab:green"), strict=True):
            ax.hist(vals, bins=bins, alpha=0.5, label=f"{label} (weighted mean {agg[series[label]]:.4f})",
                    color=color)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no bag scored", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("per-bag MAE (robot units)")
    ax.set_ylabel("bags")
    ax.set_title(f"Per-bag action error over {len(scored)} bags")
    paths.append(out / FLEET_PLOTS[0])
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=100)

    fig = Figure(figsize=(9, 4.5))
    ax = fig.add_subplot()
    ranked = sorted(scored, key=lambda r: r["actions"]["mae"])[-max(WORST_BAGS * 2, 10):]
    if ranked:
        y = np.arange(len(ranked))
        ax.barh(y - 0.2, [r["actions"]["mae"] for r in ranked], height=0.4, label="whole chunk")
        ax.barh(y + 0.2, [r["actions"]["first_mae"] or 0.0 for r in ranked], height=0.4, label="first action")
        ax.set_yticks(y, [r["name"] for r in ranked], fontsize=8)
        ax.axvline(agg["mae"], color="k", ls="--", lw=1, label="fleet (frame-weighted)")
        ax.legend(fontsize=8)
    ax.set_xlabel("MAE (robot units)")
    ax.set_title("Worst bags")
    paths.append(out / FLEET_PLOTS[1])
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=100)

    fig = Figure(figsize=(9, 4.5))
    ax = fig.add_subplot()
    if agg["per_step"]:
        plot_error_vs_step(ax, agg["per_step"], f" (pooled over {agg['per_step']['bags']} bags)")
    paths.append(out / FLEET_PLOTS[2])
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=100)
    return paths


def write_fleet_outputs(fleet: dict[str, Any], out: Path, plots: bool = True) -> None:
    """Write ``fleet.json``, ``fleet.md`` and (``plots``) the PNGs of :data:`FLEET_PLOTS` into ``out``."""
    fleet["outputs"] = {"table": "fleet.md", "plots": [p.name for p in _plots(fleet, out)] if plots else []}
    (out / "fleet.json").write_text(json.dumps(fleet, indent=2))
    (out / "fleet.md").write_text(fleet_table(fleet))
