"""``python -m oxygen_ros.bench.export_speed --out runs/export_speed``: how fast ``oxygen-export-lerobot`` turns a bag
into a LeRobot dataset, against the bag's real time: the export demo bag (:mod:`oxygen_ros.export.demo`) with two
224x224 rgb8 cameras at ``--rate`` Hz for ``--duration`` s, exported ``--repeats`` times in this process (libsvtav1,
LeRobot's default encoder settings); per run the wall time split into reading + decoding + aligning the bag and
encoding + writing, frames of bag per second and the real-time factor (bag seconds per wall second). Writes
``export_speed.json`` and ``export_speed.png``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from oxygen_ros.export.contract import Contract  # noqa: E402
from oxygen_ros.export.demo import make_export_demo_bag  # noqa: E402
from oxygen_ros.export.episode import read_episodes  # noqa: E402
from oxygen_ros.export.writer import write_dataset  # noqa: E402

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="runs/export_speed")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    contract = Contract(cameras={"base_0_rgb": "/cameras/base_0_rgb/image_raw",
                                 "left_wrist_0_rgb": "/cameras/left_wrist_0_rgb/image_raw"},
                        state_topic="/joint_states", action_topic="/oxygen/action_chunk", fps=round(a.rate),
                        language_topic="/oxygen/language_output")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        bag = make_export_demo_bag(Path(tmp) / "bag", duration_s=a.duration, rate_hz=a.rate, size=a.size)
        for r in range(a.repeats):
            t0 = time.perf_counter()
            (ep,) = list(read_episodes(bag, contract))
            t1 = time.perf_counter()
            write_dataset([ep], Path(tmp) / f"ds{r}", contract.fps, "bench", contract.video)
            t2 = time.perf_counter()
            runs.append({"read_s": t1 - t0, "write_s": t2 - t1, "wall_s": t2 - t0, "frames": ep.length,
                         "bag_s": ep.bag_duration_s, "frames_per_s": ep.length / (t2 - t0),
                         "realtime_factor": ep.bag_duration_s / (t2 - t0)})
            print(json.dumps(runs[-1]))
    med = {k: statistics.median(r[k] for r in runs) for k in ("read_s", "write_s", "wall_s", "frames_per_s",
                                                              "realtime_factor")}
    result = {"host": {"machine": platform.machine(), "processor": platform.processor(), "python":
                       platform.python_version()},
              "date": time.strftime("%Y-%m-%d"), "bag": {"cameras": 2, "size": a.size, "rate_hz": a.rate,
                                                         "duration_s": a.duration},
              "codec": "libsvtav1 (crf 30, g 2, preset 12, yuv420p)", "runs": runs, "median": med}
    (out / "export_speed.json").write_text(json.dumps(result, indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(6, 3.2))
    xs = range(len(runs))
    ax.bar([x - 0.2 for x in xs], [r["read_s"] for r in runs], 0.4, label="read + decode + align")
    ax.bar([x + 0.2 for x in xs], [r["write_s"] for r in runs], 0.4, label="encode + write")
    ax.axhline(runs[0]["bag_s"], color="k", ls="--", lw=1, label=f"bag duration {runs[0]['bag_s']:.1f} s")
    ax.set_xticks(list(xs), [f"run {i + 1}" for i in xs])
    ax.set_ylabel("seconds")
    ax.set_title(f"export of a {a.duration:.0f} s bag, 2 cameras {a.size}x{a.size} at {a.rate:.0f} Hz: "
                 f"{med['realtime_factor']:.1f}x real time", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "export_speed.png", dpi=120)
    print(json.dumps(med))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
