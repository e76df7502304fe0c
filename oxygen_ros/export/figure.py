"""``python -m oxygen_ros.export.figure DATASET OUT.png``: a few frames of an exported dataset (decoded from its
videos, both cameras) with the language rows in force at each: the latest persistent row of every style up to the
frame's timestamp, and the frame's events. For docs/export.md."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import av
import matplotlib
import numpy as np
import pyarrow.parquet as pq

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["plot_frames"]


def _decode(path: Path) -> np.ndarray:
    with av.open(str(path)) as f:
        return np.stack([fr.to_ndarray(format="rgb24") for fr in f.decode(video=0)])


def plot_frames(dataset: Path, out: Path, frames: list[int] | None = None) -> Path:
    info = json.loads((dataset / "meta" / "info.json").read_text())
    cams = [k for k, v in info["features"].items() if v["dtype"] == "video"]
    data = pq.read_table(dataset / "data" / "chunk-000" / "file-000.parquet").to_pylist()
    data = [r for r in data if r["episode_index"] == 0]
    tasks = {r["task_index"]: r["task"] for r in pq.read_table(dataset / "meta" / "tasks.parquet").to_pylist()}
    videos = {c: _decode(dataset / "videos" / c / "chunk-000" / "file-000.mp4") for c in cams}
    event = next((k for k, r in enumerate(data) if r["language_events"]), len(data) // 3)
    frames = frames or sorted({0, event, len(data) // 2, len(data) - 1})
    fig, axes = plt.subplots(len(cams) + 1, len(frames), figsize=(3.2 * len(frames), 2.4 * len(cams) + 1.8),
                             gridspec_kw={"height_ratios": [1] * len(cams) + [0.8]})
    for j, k in enumerate(frames):
        row = data[k]
        for i, c in enumerate(cams):
            axes[i, j].imshow(videos[c][k])
            axes[i, j].set_axis_off()
            axes[i, j].set_title(f"frame {k}  t={row['timestamp']:.1f} s\n{c.split('.')[-1]}" if i == 0
                                 else c.split(".")[-1], fontsize=8)
        active: dict[str, str] = {}
        for r in row["language_persistent"]:
            if r["timestamp"] <= row["timestamp"] + 1e-6:
                active[r["style"]] = r["content"]
        lines = [f"task: {tasks[row['task_index']]}"] + [f"{s}: {t}" for s, t in sorted(active.items())]
        for e in sorted(row["language_events"], key=lambda e: e["role"] != "user"):  # the question first
            text = e["content"]
            if e["style"] == "vqa" and e["role"] == "assistant":
                text = json.loads(text).get("value", text)
            where = f" ({e['camera'].split('.')[-1]})" if e["camera"] else ""
            lines.append(f"event {e['style']} {e['role']}{where}: {text}")
        ax = axes[-1, j]
        ax.set_axis_off()
        ax.text(0, 1, "\n".join(textwrap.fill(line, 38) for line in lines), va="top", ha="left", fontsize=7,
                family="monospace")
    fig.suptitle("exported frames and their language rows (language_persistent in force, language_events)",
                 fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(plot_frames(Path(sys.argv[1]), Path(sys.argv[2])))
