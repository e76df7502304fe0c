"""A filmstrip PNG of one closed-loop episode: both camera views per frame with the memory text the model
generated for that frame (green: exact match with the world's ground truth, red: mismatch)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["FilmFrame", "save_filmstrip"]


@dataclass
class FilmFrame:
    """One control frame: the images the model saw, the ground-truth memory and the generated one (if any)."""

    step: int
    images: list[np.ndarray]  # RGB uint8, one per camera
    memory_true: str
    memory_pred: str | None = None


def save_filmstrip(frames: list[FilmFrame], path: Path, title: str, max_frames: int = 12) -> Path:
    """Draw up to ``max_frames`` evenly spaced frames (always the first and last) into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len(frames) > max_frames:
        frames = [frames[i] for i in np.linspace(0, len(frames) - 1, max_frames).round().astype(int)]
    rows = len(frames[0].images)
    fig, axes = plt.subplots(rows, len(frames), figsize=(1.9 * len(frames), 1.9 * rows + 1.3), squeeze=False)
    for col, fr in enumerate(frames):
        for row, img in enumerate(fr.images):
            ax = axes[row][col]
            ax.imshow(img, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(f"step {fr.step}", fontsize=8)
        pred = fr.memory_pred if fr.memory_pred is not None else "(no output)"
        color = "green" if pred == fr.memory_true else "red"
        axes[-1][col].text(0.5, -0.08, textwrap.fill(pred, 22), transform=axes[-1][col].transAxes, ha="center",
                           va="top", fontsize=7, color=color)
    fig.suptitle(title, fontsize=9)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.86, bottom=0.22, wspace=0.05, hspace=0.05)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
