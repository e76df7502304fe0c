"""Training curves of a toy-model run (matplotlib PNG from ``train_log.json``).

    python -m oxygen_ros.toy.train.curves oxygen_ros/toy/model      # writes oxygen_ros/toy/model/train_curves.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["plot_training"]

LOSSES = ("action", "objects", "memory", "subtask", "narration", "answer")
EXACT = (("val_memory_exact", "tab:green", "memory"), ("val_subtask_exact", "tab:purple", "subtask"),
         ("val_narration_exact", "tab:orange", "narration"), ("val_answer_exact", "tab:brown", "answer"))


def plot_training(log: dict, out: Path) -> Path:
    """Losses (log scale) and held-out open-loop validation against the step; returns the PNG path."""
    history = log["history"]
    fig, (ax_loss, ax_val) = plt.subplots(1, 2, figsize=(11, 4))
    for name in LOSSES:
        points = [(h["step"], h[name]) for h in history if name in h]
        if points:
            ax_loss.plot(*zip(*points, strict=True), label=name, lw=1)
    ax_loss.set(xlabel="step", ylabel="training loss", yscale="log", title="losses (one batch each)")
    ax_loss.legend()
    every, last = int(log["config"]["val_every"]), int(log["steps_done"]) - 1
    # logged rows repeat the latest validation; keep the steps where it was computed
    val = {h["step"]: h for h in history if "val_xy_error" in h and ((h["step"] + 1) % every == 0 or h["step"] == last)}
    steps = sorted(val)
    ax_val.plot(steps, [val[s]["val_xy_error"] for s in steps], "o-", color="tab:red", label="x-y error (table units)")
    ax_val.axhline(0.045, color="tab:red", ls=":", lw=1, label="grasp tolerance")
    ax_val.set(xlabel="step", ylabel="x-y error", title="held-out open-loop validation")
    ax_acc = ax_val.twinx()
    for key, color, label in (("val_gripper_agree", "tab:blue", "gripper agreement"),
                              *((k, c, f"{n} exact match") for k, c, n in EXACT)):
        points = [(s, val[s][key]) for s in steps if key in val[s]]
        if points:
            ax_acc.plot(*zip(*points, strict=True), "s--", color=color, ms=3, label=label)
    ax_acc.set(ylabel="fraction", ylim=(0, 1.05))
    lines = ax_val.get_legend_handles_labels()[0] + ax_acc.get_legend_handles_labels()[0]
    labels = ax_val.get_legend_handles_labels()[1] + ax_acc.get_legend_handles_labels()[1]
    ax_val.legend(lines, labels, loc="center right")
    fig.suptitle(f"toy pi0.5: {log['steps_done']} steps, {log['wall_s'] / 60:.1f} min, {log['samples']} samples, "
                 f"{log['parameters'] / 1e6:.2f}M parameters")
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    """CLI entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path, help="model directory with train_log.json")
    args = ap.parse_args(argv)
    path = plot_training(json.loads((args.model / "train_log.json").read_text()), args.model / "train_curves.png")
    print(path)


if __name__ == "__main__":
    main()
