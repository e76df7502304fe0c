"""The evaluation's PNG plots, drawn from a report: stage latency per frame, action frequency, language
throughput, request latency and the action error against the reference (placeholders when nothing ran).
matplotlib's object API only: no pyplot, no global backend or figure state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .report import STAGES

__all__ = ["PLOT_FILES", "plot_error_vs_step", "write_plots"]

PLOT_FILES = ("stage_latency.png", "action_frequency.png", "language_throughput.png", "request_latency.png",
              "action_error.png")


def _placeholder(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def _stage_latency(fig: Any, frames: list[dict], x: list[int], period_ms: float, title: str) -> None:
    ax = fig.add_subplot()
    if frames:
        colors = ("tab:gray", "tab:blue", "tab:cyan", "tab:red", "tab:green", "black")
        bottom = np.zeros(len(frames))
        for stage, color in zip(("preprocess", *STAGES), colors, strict=True):
            vals = np.array([f["timings_ms"][stage] for f in frames])
            if vals.any():
                ax.bar(x, vals, bottom=bottom, width=1.0, label=stage, color=color)
                bottom += vals
        ax.plot(x, [f["timings_ms"]["tick"] for f in frames], "k.", ms=3, label="tick total")
        ax.axhline(period_ms, color="tab:red", ls="--", lw=1, label="control period")
        ax.legend(fontsize=8, ncol=4, loc="upper right")
    else:
        _placeholder(ax, "no frames processed")
    ax.set_xlabel("frame")
    ax.set_ylabel("ms")
    ax.set_title(f"Stage latency per frame: {title}")


def _action_frequency(fig: Any, frames: list[dict], x: list[int], period_ms: float, title: str,
                      horizon: int) -> None:
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    if frames:
        frame_ms = np.array([f["timings_ms"]["frame"] for f in frames])
        ax1.plot(x, frame_ms, ".-", lw=1, label="engine frame")
        ax1.axhline(period_ms, color="tab:red", ls="--", lw=1, label="control period")
        ax1.legend(fontsize=8)
        ax2.plot(x, 1e3 * horizon / frame_ms, ".-", lw=1, label="H / frame time")
        ax2.plot(x, 1e3 * horizon * np.arange(1, len(frames) + 1) / np.cumsum(frame_ms), lw=2, label="cumulative")
        ax2.legend(fontsize=8)
    else:
        _placeholder(ax1, "no frames processed")
    ax1.set_ylabel("frame time (ms)")
    ax2.set_ylabel("action frequency (Hz)")
    ax2.set_xlabel("frame")
    ax1.set_title(f"Action frequency: {title}")


def _language_throughput(fig: Any, frames: list[dict], x: list[int], title: str) -> None:
    ax = fig.add_subplot()
    if frames:
        tok_s = [1e3 * f["tokens"] / f["timings_ms"]["frame"] for f in frames]
        ax.bar(x, tok_s, width=1.0, color="tab:green", label="tokens/s (frame)")
        ax.set_ylabel("tokens / s")
        ax_b = ax.twinx()
        ax_b.plot(x, [f["inflight"] for f in frames], "k-", lw=1, label="in-flight requests")
        ax_b.set_ylabel("in-flight requests")
        ax.legend(loc="upper left", fontsize=8)
        ax_b.legend(loc="upper right", fontsize=8)
    else:
        _placeholder(ax, "no frames processed")
    ax.set_xlabel("frame")
    ax.set_title(f"Language throughput: {title}")


def _request_latency(fig: Any, items: list[dict], title: str) -> None:
    ax1, ax2 = fig.subplots(1, 2)
    if items:
        ax1.hist([1e3 * r["latency_s"] for r in items], bins=20, color="tab:purple")
        frames_lat = [r["latency_frames"] for r in items]
        ax2.hist(frames_lat, bins=np.arange(0.5, max(frames_lat) + 1.5), color="tab:orange")
    else:
        for ax in (ax1, ax2):
            _placeholder(ax, "no finished requests")
    ax1.set_xlabel("request latency (ms, wall)")
    ax2.set_xlabel("request latency (frames)")
    ax1.set_ylabel("requests")
    fig.suptitle(f"Request latency: {title}")


def plot_error_vs_step(ax: Any, actions: dict[str, Any], label: str = "") -> None:
    """MAE per horizon step, one line per joint and the mean over joints (``actions``: a report's
    ``scores.actions``), with the executed part's end marked."""
    steps = np.arange(1, actions["horizon"] + 1)
    per = np.array([[np.nan if v is None else v for v in row] for row in actions["mae_per_step_joint"]])
    for j, name in enumerate(actions["joints"]):
        ax.plot(steps, per[:, j], ".-", lw=1, label=name)
    ax.plot(steps, [np.nan if v is None else v for v in actions["mae_per_step"]], "k-", lw=2.5,
            label="mean over joints")
    if actions["n_execute"] < actions["horizon"]:
        ax.axvline(actions["n_execute"] + 0.5, color="tab:red", ls="--", lw=1, label="executed part")
    ax.set_xlabel("horizon step (action i at stamp + i * dt)")
    ax.set_ylabel("MAE (robot units)")
    ax.set_title(f"Error vs horizon step{label}")
    ax.legend(fontsize=8)


def _action_error(fig: Any, scores: dict[str, Any] | None, title: str) -> None:
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    actions = (scores or {}).get("actions")
    if actions and actions["chunks"]:
        plot_error_vs_step(ax1, actions, f" ({scores['reference_topic']})")
        per = actions["per_chunk"]
        ax2.plot([c["frame"] for c in per], [c["mae"] for c in per], ".-", lw=1, label="whole chunk (covered)")
        ax2.plot([c["frame"] for c in per], [np.nan if c["first_mae"] is None else c["first_mae"] for c in per],
                 ".-", lw=1, label="first action")
        ax2.axhline(actions["tolerance"], color="tab:gray", ls=":", lw=1, label="tolerance")
        ax2.set_xlabel("frame")
        ax2.set_ylabel("MAE")
        ax2.set_title("Error per chunk")
        ax2.legend(fontsize=8)
    else:
        for ax in (ax1, ax2):
            _placeholder(ax, (scores or {}).get("note") or "no chunk scored")
    fig.suptitle(f"Action error against the recording: {title}")


def write_plots(report: dict[str, Any], out: str | Path) -> list[Path]:
    """Write the PNGs of :data:`PLOT_FILES` from a report into ``out``; returns their paths."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    out = Path(out)
    frames = report["per_frame"]
    x = [f["frame"] for f in frames]
    cfg = report["config"]
    title = f"{report['model']['name']} {cfg['mode']} k={cfg['k']} N={cfg['max_new_tokens']} S={cfg['num_steps']}"
    period_ms = 1e3 / cfg["rate_hz"]
    items = [r for r in report["requests"]["items"] if not r["dropped"]]
    draws = (
        ((9, 4.5), lambda fig: _stage_latency(fig, frames, x, period_ms, title)),
        ((9, 5), lambda fig: _action_frequency(fig, frames, x, period_ms, title, report["model"]["action_horizon"])),
        ((9, 4.5), lambda fig: _language_throughput(fig, frames, x, title)),
        ((9, 4), lambda fig: _request_latency(fig, items, title)),
        ((12, 4.5), lambda fig: _action_error(fig, report.get("scores"), title)),
    )
    paths = []
    for name, (size, draw) in zip(PLOT_FILES, draws, strict=True):
        fig = Figure(figsize=size)
        draw(fig)
        for ax in fig.axes:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        paths.append(out / name)
        fig.savefig(paths[-1], dpi=100)
    return paths
