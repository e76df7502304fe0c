"""Camera streams at robot sizes: what they cost the node. Three cameras at 30 Hz, raw rgb8 or JPEG, 640x480 or
1280x720, published from another process with the project's DDS profile (config/fastdds.xml).

    python -m oxygen_ros.bench.camera_bench --out runs/camera_bench [--window 4 --repeats 3]

In process and as a node process; the figures: docs/benchmarks.md. Writes ``results.json``, ``summary.md`` and
``camera_bench.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from oxygen_ros.bench.paired import timed
from oxygen_ros.bench.report import save_figure, subplots, write_run

__all__ = ["main", "micro_benchmark", "node_benchmark"]

SIZES = ((640, 480), (1280, 720))
ENCODINGS = ("rgb8", "jpeg")
CAMERAS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
JOINTS = ("j1", "j2", "j3")
RATE_HZ = 30.0
CONTROL_HZ = 10.0
SMALL = (64, 48)  # the baseline stream for the latency the size adds


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    return 1e3 * statistics.median(timed(fn) for _ in range(repeats))


def micro_benchmark(repeats: int = 30) -> list[dict[str, Any]]:
    """Per message / per used image costs of the node's own code, in this process (milliseconds, medians)."""
    from oxygen_ros.policy import load_policy
    from oxygen_ros.policy.synthetic import make_random_checkpoint
    from oxygen_ros.ros.camera_image import CameraImage
    from oxygen_ros.ros.diagnostics import ReasonCounter
    from oxygen_ros.ros.image_conversion import compressed_msg_to_array, image_msg_to_array
    from oxygen_ros.ros.input_store import InputStore
    from oxygen_ros.testing.camera_streams import StreamSpec, make_frames

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_random_checkpoint(Path(tmp), "tiny", None, tokenizer=True, camera_names=CAMERAS,
                                      max_token_len=128, action_dim=8)
        policy = load_policy(ckpt, generated=True)
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String

    from oxygen_ros.ros.observation_builder import ObservationBuilder
    from oxygen_ros.ros.stamps import time_msg

    def build_ms(width: int, height: int, encoding: str) -> float:
        """ObservationBuilder.build with three fresh images: the frame's decode + convert + prepare."""
        msg = make_frames(StreamSpec("/bench", width, height, encoding), 1, seed=0)[0]
        store = InputStore(CAMERAS, JOINTS, ReasonCounter(None, "rejected"))
        store.on_joint_state(JointState(name=list(JOINTS), position=[0.0] * len(JOINTS)))
        store.on_instruction(String(data="put the red block on the blue plate"))
        builder = ObservationBuilder(store, policy, max_age_s=1e6)
        feed = store.on_compressed if encoding == "jpeg" else store.on_image
        times = []
        for k in range(repeats):
            msg.header.stamp = time_msg(k + 1)
            for c in range(len(CAMERAS)):
                feed(c, msg)
            t0 = time.perf_counter()
            built = builder.build(k + 1)
            times.append(time.perf_counter() - t0)
            assert not hasattr(built, "reason"), built
        return statistics.median(times) * 1e3

    baseline = {e: build_ms(*SMALL, e) for e in ENCODINGS}
    rows = []
    for width, height in SIZES:
        for encoding in ENCODINGS:
            msg = make_frames(StreamSpec("/bench", width, height, encoding), 1, seed=0)[0]
            compressed = encoding == "jpeg"
            store = InputStore(CAMERAS[:1], JOINTS, ReasonCounter(None, "rejected"))
            arrive = (lambda s=store, m=msg: s.on_compressed(0, m)) if compressed else \
                (lambda s=store, m=msg: s.on_image(0, m))
            decode = (lambda m=msg: compressed_msg_to_array(m)) if compressed else (lambda m=msg: image_msg_to_array(m))

            def use(m=msg, c=compressed) -> None:  # a fresh image used by a frame: decode + model input
                CameraImage(m, c, 0, 0.0).pixels(policy.convert_image)

            rows.append({"size": f"{width}x{height}", "encoding": encoding, "message_bytes": len(msg.data),
                         "arrival_ms": _median_ms(arrive, repeats * 10),
                         "eager_decode_ms": _median_ms(decode, repeats),
                         "decode_and_convert_ms": _median_ms(use, repeats),
                         "frame_build_ms": build_ms(width, height, encoding),
                         "frame_build_small_ms": baseline[encoding]})
    return rows


# ---------------------------------------------------------------------------------------------- the node
def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _streamer(size: tuple[int, int], encoding: str, seconds: float, env: dict[str, str]) -> subprocess.Popen:
    suffix = "/compressed" if encoding == "jpeg" else ""
    streams = [f"/cameras/{c}/image_raw{suffix}:{size[0]}x{size[1]}:{encoding}" for c in CAMERAS]
    return subprocess.Popen([sys.executable, "-m", "oxygen_ros.testing.camera_streams", *streams, "--rate",
                             str(RATE_HZ), "--duration", str(seconds)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _sent(out: str) -> int:
    return sum(int(line.split(": ")[1].split()[0]) for line in out.splitlines() if " sent (" in line)


def _received(probe: Any) -> int:
    return sum(probe.diagnostic_count(f"camera.{c}.received") for c in CAMERAS)


def _windows(pid: int, window_s: float, repeats: int) -> list[float]:
    """CPU seconds per second of ``pid`` over ``repeats`` consecutive windows."""
    rates = []
    for _ in range(repeats):
        c0, t0 = _cpu_seconds(pid), time.monotonic()
        time.sleep(window_s)
        rates.append((_cpu_seconds(pid) - c0) / (time.monotonic() - t0))
    return rates


def _stream_point(node: Any, probe: Any, env: dict[str, str], size: tuple[int, int], encoding: str,
                  window_s: float, repeats: int, frames: bool) -> dict[str, Any]:
    warm = 2.0
    before = _received(probe)
    proc = _streamer(size, encoding, warm + window_s * repeats + 0.5, env)
    time.sleep(1.0)  # the streamer starts and discovers the node
    time.sleep(warm)
    t0 = time.monotonic()
    cpu = _windows(node.proc.pid, window_s, repeats)
    t1 = time.monotonic()
    out, _ = proc.communicate(timeout=60)
    time.sleep(1.2)  # the next diagnostics message carries the final counts
    sent, received = _sent(out), _received(probe) - before
    point: dict[str, Any] = {"size": f"{size[0]}x{size[1]}", "encoding": encoding, "frames_running": frames,
                             "cpu_per_s": statistics.median(cpu), "cpu_windows": cpu, "sent": sent,
                             "received": received, "received_fraction": received / sent if sent else 0.0}
    if frames:
        chunks = [m for t, m in list(probe.received.chunks) if t0 <= t < t1]
        latencies = [c.inference_latency.sec * 1e3 + c.inference_latency.nanosec / 1e6 for c in chunks]
        point.update(chunks=len(chunks), frame_hz=len(chunks) / (t1 - t0),
                     latency_ms=statistics.median(latencies) if latencies else float("nan"))
    return point


def node_benchmark(window_s: float = 4.0, repeats: int = 3, log: Callable[[str], None] = print
                   ) -> dict[str, list[dict[str, Any]]]:
    """The node as a process, one per encoding: idle, receive-only and frames-running points."""
    from oxygen_ros.policy.synthetic import make_random_checkpoint
    from oxygen_ros.ros.dds import PROFILE_ENV_VARS, dds_profile_environment, default_profile_path
    from oxygen_ros.testing import NodeProcess, Probe, ros_env

    domain = 170 + os.getpid() % 40
    base = {k: v for k, v in os.environ.items() if k not in PROFILE_ENV_VARS}
    dds, why = dds_profile_environment(default_profile_path(), base)
    log(why)
    os.environ.update(dds)  # this process's participant (the probe) too
    env = {**ros_env(domain, base), **dds}
    out: dict[str, list[dict[str, Any]]] = {"idle": [], "receive": [], "frames": []}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_random_checkpoint(Path(tmp), "tiny", None, tokenizer=True, camera_names=CAMERAS,
                                      max_token_len=128, action_dim=8)
        for encoding in ENCODINGS:
            compressed = encoding == "jpeg"
            node = NodeProcess(None, {
                "model": "", "checkpoint_path": str(ckpt), "normalization": "none", "device": "cpu",
                "torch_threads": 1, "joint_names": list(JOINTS), "camera_names": list(CAMERAS),
                "camera_compressed": [compressed] * 3, "control_rate_hz": CONTROL_HZ, "max_new_tokens": 4, "k": 2,
                "request_every_n_frames": 1, "request_task": "narration"}, domain_id=domain)
            node.env = env
            node.start()
            probe = Probe([], list(JOINTS), domain_id=domain, name="camera_bench_probe")
            try:
                if not probe.wait_for(lambda p=probe: p.diagnostics().get("state") == "active", 90):
                    raise RuntimeError(f"the node did not become active:\n{node.output()[-3000:]}")
                probe.start_stream(50.0)  # joint states only
                time.sleep(2.0)
                idle = _windows(node.proc.pid, window_s, repeats)
                out["idle"].append({"encoding": encoding, "cpu_per_s": statistics.median(idle), "cpu_windows": idle})
                log(f"{encoding}: idle {statistics.median(idle) * 1e3:.0f} ms CPU/s")
                for size in SIZES:
                    point = _stream_point(node, probe, env, size, encoding, window_s, repeats, frames=False)
                    out["receive"].append(point)
                    log(f"{encoding} {point['size']} receive: {point['cpu_per_s'] * 1e3:.0f} ms CPU/s, "
                        f"{point['received']}/{point['sent']} received")
                probe.publish_instruction("put the red block on the blue plate")
                for size in (SMALL, *SIZES):
                    point = _stream_point(node, probe, env, size, encoding, window_s, repeats, frames=True)
                    out["frames"].append(point)
                    log(f"{encoding} {point['size']} frames: {point['frame_hz']:.1f} Hz, latency "
                        f"{point['latency_ms']:.1f} ms, {point['cpu_per_s'] * 1e3:.0f} ms CPU/s")
            finally:
                probe.close()
                node.stop(signal.SIGINT if node.alive else signal.SIGKILL, timeout=10)
    return out


# ---------------------------------------------------------------------------------------------- report
def summarize(micro: list[dict[str, Any]], node: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (size, encoding): per-message CPU, added frame latency and the in-process costs."""
    idle = {p["encoding"]: p["cpu_per_s"] for p in node["idle"]}
    small = {p["encoding"]: p for p in node["frames"] if p["size"] == f"{SMALL[0]}x{SMALL[1]}"}
    rows = []
    for m in micro:
        recv = next(p for p in node["receive"] if p["size"] == m["size"] and p["encoding"] == m["encoding"])
        frames = next(p for p in node["frames"] if p["size"] == m["size"] and p["encoding"] == m["encoding"])
        msgs_per_s = len(CAMERAS) * RATE_HZ * recv["received_fraction"]
        base = small[m["encoding"]]
        rows.append({**m, "received_fraction": recv["received_fraction"],
                     "node_cpu_ms_per_message": (recv["cpu_per_s"] - idle[m["encoding"]]) * 1e3 / msgs_per_s
                     if msgs_per_s else float("nan"),
                     "node_cpu_share_receive": recv["cpu_per_s"],
                     "frame_hz": frames["frame_hz"], "latency_ms": frames["latency_ms"],
                     "latency_small_ms": base["latency_ms"],
                     "added_latency_ms": frames["latency_ms"] - base["latency_ms"],
                     "node_cpu_share_frames": frames["cpu_per_s"]})
    return rows


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The README / summary.md table."""
    lines = ["| size | encoding | message | received | node CPU / message | callback now (before: eager decode) "
             "| decode + convert / used image | frame build, 3 cameras (64x48) | chunk latency (64x48) | frame Hz |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['size']} | {r['encoding']} | {r['message_bytes'] / 1e3:.0f} KB | "
                     f"{100 * r['received_fraction']:.1f}% | {r['node_cpu_ms_per_message']:.2f} ms | "
                     f"{r['arrival_ms'] * 1e3:.0f} us ({r['eager_decode_ms']:.2f} ms) | "
                     f"{r['decode_and_convert_ms']:.1f} ms | {r['frame_build_ms']:.1f} ms "
                     f"({r['frame_build_small_ms']:.1f}) | {r['latency_ms']:.0f} ms ({r['latency_small_ms']:.0f}) | "
                     f"{r['frame_hz']:.1f} |")
    return "\n".join(lines)


def plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Bars: node CPU per message and added frame latency per configuration."""
    labels = [f"{r['size']}\n{r['encoding']}" for r in rows]
    fig, axes = subplots(1, 3, figsize=(13, 3.8))
    x = np.arange(len(rows))
    axes[0].bar(x, [r["node_cpu_ms_per_message"] for r in rows], color="tab:blue")
    axes[0].set_title("node CPU per camera message (ms)")
    axes[1].bar(x - 0.2, [r["eager_decode_ms"] for r in rows], 0.4, label="eager decode (before)", color="tab:red")
    axes[1].bar(x + 0.2, [r["arrival_ms"] for r in rows], 0.4, label="arrival checks (now)", color="tab:green")
    axes[1].set_title("callback work per message (ms, in process)")
    axes[1].legend(fontsize=8)
    axes[2].bar(x - 0.2, [r["frame_build_ms"] - r["frame_build_small_ms"] for r in rows], 0.4,
                label="frame build (in process)", color="tab:orange")
    axes[2].bar(x + 0.2, [r["added_latency_ms"] for r in rows], 0.4, label="chunk latency (node)", color="tab:purple")
    axes[2].set_title("added frame latency vs 64x48 (ms)")
    axes[2].legend(fontsize=8)
    for ax in axes:
        ax.set_xticks(x, labels, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"3 cameras x {RATE_HZ:.0f} Hz, node at {CONTROL_HZ:.0f} Hz, {os.cpu_count()} CPUs (medians)")
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> None:
    """Run both parts and write results.json, summary.md and camera_bench.png."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/camera_bench"))
    ap.add_argument("--window", type=float, default=4.0, help="seconds per CPU window")
    ap.add_argument("--repeats", type=int, default=3, help="windows per point (the median is reported)")
    ap.add_argument("--micro-repeats", type=int, default=30)
    args = ap.parse_args(argv)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    load_start = os.getloadavg()  # other processes on the host (the benchmark does not control them)
    micro = micro_benchmark(args.micro_repeats)
    node = node_benchmark(args.window, args.repeats)
    rows = summarize(micro, node)
    load_before = os.getloadavg()
    result = {"machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                          "cpus": os.cpu_count(), "opencv": cv2.__version__,
                          "load_average_1min": {"start": round(load_start[0], 2), "end": round(load_before[0], 2)}},
              "setup": {"cameras": len(CAMERAS), "camera_rate_hz": RATE_HZ, "control_rate_hz": CONTROL_HZ,
                        "window_s": args.window, "repeats": args.repeats, "dds_profile": "config/fastdds.xml"},
              "summary": rows, "micro": micro, "node": node,
              "measured": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    table = markdown(rows)
    write_run(args.out, result, f"# Camera streams: node cost\n\n{table}", lambda r, path: plot(r["summary"], path),
              "camera_bench.png", echo=False)
    print(table)


if __name__ == "__main__":
    main()
