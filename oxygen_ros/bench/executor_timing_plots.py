"""The executor timing benchmark's figure: one joint's setpoints over a few chunk switches, with the chunks the
node published drawn at their actions' due times, for the 100 Hz runs (one panel per run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .report import save_figure

__all__ = ["plot_setpoints"]

PANELS = ("100hz_replace_executor", "100hz_aggregate_executor", "100hz_replace_timing_rule",
          "100hz_aggregate_timing_rule", "500hz_replace_executor")


def plot_setpoints(result: dict[str, Any], path: Path, panels: int = 2) -> Path:
    """Draw up to ``panels`` runs (the executor-remainder ones first) into ``path``."""
    import matplotlib.pyplot as plt

    by = {}
    for r in result["runs"]:
        by.setdefault(r["name"], r)  # the first repeat
    chosen = [by[n] for n in PANELS if n in by][:panels] or result["runs"][:1]
    fig, axes = plt.subplots(len(chosen), 1, figsize=(11, 3.4 * len(chosen)), squeeze=False)
    for ax, run in zip(axes[:, 0], chosen, strict=True):
        s = run["series"]
        colors = plt.get_cmap("tab10")
        for i, c in enumerate(s["chunks"]):
            ax.plot(c["t_s"], c["joint0"], "o--", ms=3, lw=0.8, color=colors(i % 10), alpha=0.7,
                    label="chunks (actions at their due times)" if i == 0 else None)
        ax.plot(s["t_s"], s["setpoint"], "-", color="k", lw=1.6, label=f"setpoints ({run['rate_hz']:g} Hz)")
        switches = [t for t, a, b in zip(s["t_s"][1:], s["frame_index"][:-1], s["frame_index"][1:], strict=True)
                    if a != b]
        for k, t in enumerate(switches):
            ax.axvline(t, color="tab:red", lw=0.6, alpha=0.6, label="chunk switch" if k == 0 else None)
        if s["t_s"]:
            ax.set_xlim(s["t_s"][0], s["t_s"][-1])
        j = run["jumps"]["switch"]
        ax.set(xlabel="time (s)", ylabel=s["joint"],
               title=f"{run['name']}: switch {run['switch']}, remainder {run['remainder_source']}; mean jump "
                     f"{(j['mean'] or 0):.3f} units/s")
        ax.legend(loc="best", fontsize=8)
    return save_figure(fig, path)
