"""oxygen-bench's results: predictions and ratios against isolated, ``results.json`` and the ``summary.md`` table."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from oxygen_ros.bench.cost_model import predict_frame_s

# one colour per engine in every benchmark plot
COLORS = {"isolated": "tab:gray", "shared_kv": "tab:orange", "parallel": "tab:purple", "oxygen": "tab:green"}


def subplots(*args, **kwargs):
    """``plt.subplots`` on the Agg backend (no display): (figure, axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save_figure(fig, path: Path, tight: bool = True) -> Path:
    """Lay out (``tight``: tight_layout), write (110 dpi) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_run(out: Path, res: dict, table: str, plot: Callable[[dict, Path], object] | None = None,
              png: str | None = None, echo: bool = True) -> str:
    """A benchmark run's files in ``out``: ``results.json``, ``summary.md`` (``table``, printed where ``echo``) and
    the figures ``plot`` draws into ``out / png`` (into ``out`` without ``png``; none without matplotlib)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=2, default=str))
    (out / "summary.md").write_text(table + "\n")
    if plot is not None:
        try:
            plot(res, out / png if png else out)
        except ImportError:
            print("matplotlib is not installed: no plots")
    if echo:
        print(table)
    return table


def vs_isolated(p: dict, base: dict) -> dict:
    """A point's speedup over the isolated point ``base``: mean- and median-based."""
    return {"speedup_vs_isolated": base["frame_ms_mean"] / p["frame_ms_mean"],
            "speedup_vs_isolated_median": base["frame_ms_median"] / p["frame_ms_median"]}


def add_derived(points: list[dict], profile: dict) -> None:
    """In place: the predicted frame time of every point and its ratios against isolated at the same N."""
    for point in points:
        point["predicted_frame_ms"] = 1e3 * predict_frame_s(point, profile)
        point["measured_over_predicted"] = point["frame_ms_mean"] / point["predicted_frame_ms"]
    for p in points:
        base = next((q for q in points if q["engine"] == "isolated" and q["N"] == p["N"]), None)
        if base:
            p |= vs_isolated(p, base)
            p["token_rate_vs_isolated"] = p["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else None
            p["predicted_speedup"] = base["predicted_frame_ms"] / p["predicted_frame_ms"]
            p["memory_vs_isolated"] = p["memory_bytes"] / base["memory_bytes"]


def markdown_table(points: list[dict]) -> str:
    """One row per point: frequency, throughput, frame time, measured and predicted speedup, shares, memory."""
    rows = ["| engine | N | k | action Hz | median Hz | tokens/s | frame ms (p99) | stalls | speedup | median "
            "speedup | predicted | tokens/s x | manager % | other % | mean batch | memory x |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    nan = float("nan")
    for p in points:
        k = p["k"] if p["engine"] == "oxygen" else "-"
        rows.append(
            f"| {p['engine']} | {p['N']} | {k} | {p['action_hz']:.1f} | {p['action_hz_median']:.1f} | "
            f"{p['tokens_per_s']:.1f} | {p['frame_ms_mean']:.0f} ({p['frame_ms_p99']:.0f}) | {p['host_stalls']} | "
            f"{p.get('speedup_vs_isolated', nan):.2f}x | {p.get('speedup_vs_isolated_median', nan):.2f}x | "
            f"{p.get('predicted_speedup', nan):.2f}x | {p.get('token_rate_vs_isolated') or nan:.2f}x | "
            f"{100 * p['manager_share']:.2f} | {100 * p.get('unaccounted_share', nan):.2f} | {p['batch_mean']:.1f} | "
            f"{p.get('memory_vs_isolated', nan):.3f} |")
    return "\n".join(rows)
