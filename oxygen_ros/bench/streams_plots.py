"""Plots of ``oxygen-bench streams`` results (matplotlib, PNG): frame-time distribution and trace per engine,
per-stream request latency per engine."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from oxygen_ros.bench.plots import COLORS  # noqa: E402


def _title(res: dict) -> str:
    cfg, m = res.get("config", {}), res.get("machine", {})
    return (f"{cfg.get('model', '?')}/{cfg.get('preset', '?')} on {m.get('device', '?')} "
            f"(torch threads: {m.get('threads', '?')})")


def plot_frame_times(res: dict, path: Path) -> Path:
    """Left: each engine's measured frame times (box, every frame as a dot, stalls as red crosses) with the
    no-language frame and oxygen's deadline; right: frame time against the measured frame index."""
    engines = res["engines"]
    names = list(engines)
    base = res["no_language_frame_ms"]["median"]
    deadline = res["oxygen"].get("deadline_ms")
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 1.6]})
    data = [engines[n]["frame_ms_all"] for n in names]
    ax.boxplot(data, showfliers=False, widths=0.5)
    ax.set_xticks(range(1, len(names) + 1), names)
    for i, n in enumerate(names, start=1):
        s = engines[n]
        stall_at = s["frame_ms_median"] * 5
        xs = [i + 0.18 * ((j % 7) / 6 - 0.5) for j in range(len(s["frame_ms_all"]))]
        calm = [(x, t) for x, t in zip(xs, s["frame_ms_all"], strict=True) if t <= stall_at]
        ax.scatter([x for x, _ in calm], [t for _, t in calm], s=9, alpha=0.6, color=COLORS.get(n, "tab:blue"))
        stalls = [(x, t) for x, t in zip(xs, s["frame_ms_all"], strict=True) if t > stall_at]
        if stalls:
            ax.scatter([x for x, _ in stalls], [t for _, t in stalls], marker="x", color="red",
                       label="host stall (> 5x median)")
        ax.hlines(s["frame_ms_p99_without_stalls"], i - 0.3, i + 0.3, colors="k", linestyles=":")
    ax.axhline(base, color="tab:blue", ls="--", lw=1, label=f"no-language frame {base:.0f} ms")
    if deadline:
        ax.axhline(deadline, color="tab:red", ls="--", lw=1, label=f"oxygen deadline (median) {deadline:.0f} ms")
    ax.set_ylabel("frame ms")
    ax.set_ylim(0, 1.3 * max(max(d) for d in data))  # headroom for the legend
    ax.set_title("frame time per engine (dotted: p99 without stalls)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    for n in names:
        ax2.plot(engines[n]["frame_ms_all"], ".-", lw=0.8, ms=4, label=n, color=COLORS.get(n))
    ax2.axhline(base, color="tab:blue", ls="--", lw=1)
    per_frame = engines.get("oxygen", {}).get("deadline_ms_all")
    if per_frame:
        ax2.step(range(len(per_frame)), per_frame, where="mid", color="tab:red", ls="--", lw=1,
                 label="oxygen deadline")
    elif deadline:
        ax2.axhline(deadline, color="tab:red", ls="--", lw=1)
    ax2.set_xlabel("measured frame")
    ax2.set_ylabel("frame ms")
    ax2.set_ylim(bottom=0)
    ax2.set_title("frame time over the run (frames interleaved across engines)", fontsize=10)
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.suptitle(f"Multi-stream workload: {_title(res)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_stream_latency(res: dict, path: Path) -> Path:
    """Per stream, bars per engine: median latency (p99 as the whisker's top), in frames and in seconds."""
    engines = res["engines"]
    names = list(engines)
    streams = [s["name"] for s in res["workload"]["streams"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(len(names), 1)
    for ax, unit, label in ((axes[0], "frames", "latency (frames spanned)"), (axes[1], "s", "latency (s)")):
        for j, n in enumerate(names):
            st = engines[n]["streams"]
            p50 = [st[s].get(f"latency_{unit}_p50", 0.0) for s in streams]
            p99 = [st[s].get(f"latency_{unit}_p99", 0.0) for s in streams]
            xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(streams))]
            ax.bar(xs, p50, width, color=COLORS.get(n), label=n)
            ax.errorbar(xs, p50, yerr=[[0] * len(p50), [b - a for a, b in zip(p50, p99, strict=True)]],
                        fmt="none", ecolor="k", capsize=3, lw=1)
        ax.set_xticks(range(len(streams)), streams)
        ax.set_ylabel(label)
        ax.set_title(f"per-stream {label}: bar p50, whisker p99", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Request latency per stream: {_title(res)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_streams(res: dict, out: Path) -> list[Path]:
    """``frame_times.png`` and ``stream_latency.png`` in ``out``."""
    return [plot_frame_times(res, out / "frame_times.png"), plot_stream_latency(res, out / "stream_latency.png")]
