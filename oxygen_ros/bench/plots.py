"""Plots for oxygen-bench results (matplotlib, PNG)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from oxygen_ros.bench.report import COLORS  # noqa: E402


def _label(p: dict) -> str:
    return f"{p['engine']} k={p['k']}" if p["engine"] == "oxygen" else p["engine"]


def plot_bench(result: dict, out: Path) -> list[Path]:
    """Stage breakdown per engine and the action-frequency / token-throughput trade-off."""
    points = result["points"]
    cfg = result["config"]
    title = f"{cfg['model']}/{cfg['preset']} on {result['machine']['device']} ({cfg['dtype']})"
    paths = []

    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = [f"{_label(p)}\nN={p['N']}" for p in points]
    bottom = [0.0] * len(points)
    for stage, color in (("prefill", "tab:blue"), ("language_prefill", "tab:cyan"), ("denoise", "tab:red"),
                         ("decode", "tab:green"), ("manager", "black")):
        vals = [p["stage_ms"].get(stage, 0.0) for p in points]
        ax.bar(labels, vals, bottom=bottom, label=stage, color=color)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.scatter(labels, [p["frame_ms_mean"] for p in points], marker="_", s=400, color="k", label="frame time")
    ax.set_ylabel("ms per frame")
    ax.set_title(f"Per-frame stage time: {title}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "frame_breakdown.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4.5))
    groups: dict[str, list[dict]] = {}
    for p in points:
        groups.setdefault(_label(p), []).append(p)
    for name, ps in groups.items():
        ps = sorted(ps, key=lambda q: q["N"])
        ax.plot([q["tokens_per_s"] for q in ps], [q["action_hz"] for q in ps], "o-", label=name,
                color=COLORS.get(ps[0]["engine"]))
        for q in ps:
            ax.annotate(f"N={q['N']}", (q["tokens_per_s"], q["action_hz"]), fontsize=7)
    ax.set_xlabel("language throughput (tokens/s)")
    ax.set_ylabel("action frequency (Hz)")
    ax.set_title(f"Action frequency vs language throughput\n{title}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "tradeoff.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths
