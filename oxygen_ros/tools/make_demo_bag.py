"""Write a deterministic rosbag2 of the synthetic demo scene (cameras, joint states, instruction) with rosbags.

    python -m oxygen_ros.tools.make_demo_bag /tmp/demo_bag --duration 10 --rate 10 --storage mcap

Topics: one ``sensor_msgs/Image`` (rgb8) per camera per tick on ``camera_topic_fmt`` (or
``sensor_msgs/CompressedImage`` jpeg on ``<topic>/compressed``), ``/joint_states`` (``sensor_msgs/JointState``)
per tick, and ``/instruction`` (``std_msgs/String``) at the start and every ``instruction_period_s``. Header
stamps equal bag times; the start time is fixed, so the same arguments give the same message bytes.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore
from tqdm import tqdm

from oxygen_ros.tools.demo_scene import joint_state, render_scene

__all__ = [
    "DEFAULT_CAMERAS",
    "DEFAULT_INSTRUCTION",
    "DEFAULT_JOINT_NAMES",
    "INSTRUCTION_TOPIC",
    "JOINT_STATES_TOPIC",
    "START_TIME_NS",
    "get_ros2_typestore",
    "make_demo_bag",
    "main",
]

DEFAULT_CAMERAS: tuple[str, ...] = ("base_0_rgb", "left_wrist_0_rgb")
DEFAULT_JOINT_NAMES: tuple[str, ...] = tuple(f"joint_{i}" for i in range(1, 8)) + ("gripper",)
DEFAULT_INSTRUCTION = "put the red block on the blue plate"
INSTRUCTION_TOPIC = "/instruction"
JOINT_STATES_TOPIC = "/joint_states"
START_TIME_NS = 1_700_000_000 * 1_000_000_000  # fixed bag start (2023-11-14T22:13:20Z): deterministic output
_STORAGES = {"sqlite3": StoragePlugin.SQLITE3, "mcap": StoragePlugin.MCAP}


def get_ros2_typestore():
    """rosbags typestore for the newest ROS 2 distro this rosbags knows (kilted, else jazzy, else humble)."""
    for name in ("ROS2_KILTED", "ROS2_JAZZY", "ROS2_HUMBLE"):
        if hasattr(Stores, name):
            return get_typestore(getattr(Stores, name))
    raise RuntimeError("rosbags has no ROS 2 typestore")


def make_demo_bag(
    out: Path | str,
    duration_s: float = 10.0,
    rate_hz: float = 10.0,
    cameras: Sequence[str] = DEFAULT_CAMERAS,
    size: int = 224,
    instruction: str = DEFAULT_INSTRUCTION,
    joint_names: Sequence[str] = DEFAULT_JOINT_NAMES,
    storage: str = "sqlite3",
    camera_topic_fmt: str = "/cameras/{name}/image_raw",
    compressed: bool = False,
    *,
    seed: int = 0,
    start_time_ns: int = START_TIME_NS,
    instruction_period_s: float = 3.0,
    jpeg_quality: int = 90,
    progress: bool | None = None,
) -> Path:
    """Write the demo bag to the directory ``out`` (which must not exist) and return its path.

    ``progress``: show a tqdm bar (None: only for bags of 100+ ticks on a terminal).
    """
    if storage not in _STORAGES:
        raise ValueError(f"storage must be one of {sorted(_STORAGES)}, got {storage!r}")
    if duration_s <= 0 or rate_hz <= 0 or size <= 0:
        raise ValueError("duration_s, rate_hz and size must be positive")
    if not cameras:
        raise ValueError("at least one camera is needed")
    out = Path(out)
    ts = get_ros2_typestore()
    T = ts.types
    Header, Time = T["std_msgs/msg/Header"], T["builtin_interfaces/msg/Time"]
    Image, CompressedImage = T["sensor_msgs/msg/Image"], T["sensor_msgs/msg/CompressedImage"]
    JointState, String = T["sensor_msgs/msg/JointState"], T["std_msgs/msg/String"]
    img_type = CompressedImage.__msgtype__ if compressed else Image.__msgtype__

    n_ticks = max(1, round(duration_s * rate_hz))
    instr_every = max(1, round(instruction_period_s * rate_hz))
    names = list(joint_names)
    show = (n_ticks >= 100 and sys.stderr.isatty()) if progress is None else progress

    with Writer(out, version=9, storage_plugin=_STORAGES[storage]) as writer:
        instr_conn = writer.add_connection(INSTRUCTION_TOPIC, String.__msgtype__, typestore=ts)
        joint_conn = writer.add_connection(JOINT_STATES_TOPIC, JointState.__msgtype__, typestore=ts)
        cam_conns = {}
        for cam in cameras:
            topic = camera_topic_fmt.format(name=cam) + ("/compressed" if compressed else "")
            cam_conns[cam] = writer.add_connection(topic, img_type, typestore=ts)

        def write(conn, stamp_ns: int, msg) -> None:
            writer.write(conn, stamp_ns, ts.serialize_cdr(msg, msg.__msgtype__))

        for k in tqdm(range(n_ticks), desc=f"writing {out.name}", unit="tick", disable=not show):
            stamp_ns = start_time_ns + round(k * 1e9 / rate_hz)
            t = k / rate_hz
            sec, nsec = divmod(stamp_ns, 1_000_000_000)
            if k % instr_every == 0:
                write(instr_conn, stamp_ns, String(data=instruction))
            q = joint_state(t, names)
            dq = (joint_state(t + 1e-3, names) - joint_state(t - 1e-3, names)) / 2e-3
            write(joint_conn, stamp_ns, JointState(
                header=Header(stamp=Time(sec=sec, nanosec=nsec), frame_id=""), name=names,
                position=q, velocity=dq, effort=np.zeros(0, dtype=np.float64)))
            for cam, conn in cam_conns.items():
                rgb = render_scene(t, cam, size, seed)
                header = Header(stamp=Time(sec=sec, nanosec=nsec), frame_id=cam)
                if compressed:
                    ok, jpg = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR),
                                           [cv2.IMWRITE_JPEG_QUALITY, jpeg_quality])
                    if not ok:
                        raise RuntimeError("JPEG encoding failed")
                    msg = CompressedImage(header=header, format="rgb8; jpeg compressed bgr8", data=jpg.reshape(-1))
                else:
                    msg = Image(header=header, height=size, width=size, encoding="rgb8", is_bigendian=0,
                                step=size * 3, data=rgb.reshape(-1))
                write(conn, stamp_ns, msg)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="bag directory to create")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of bag time (default 10)")
    p.add_argument("--rate", type=float, default=10.0, help="camera and joint-state rate in Hz (default 10)")
    p.add_argument("--cameras", nargs="+", default=list(DEFAULT_CAMERAS), help="camera names (viewpoints)")
    p.add_argument("--size", type=int, default=224, help="square image size in pixels (default 224)")
    p.add_argument("--instruction", default=DEFAULT_INSTRUCTION)
    p.add_argument("--instruction-period", type=float, default=3.0, help="re-send the instruction every N s")
    p.add_argument("--joint-names", nargs="+", default=list(DEFAULT_JOINT_NAMES))
    p.add_argument("--storage", choices=sorted(_STORAGES), default="sqlite3")
    p.add_argument("--topic-fmt", default="/cameras/{name}/image_raw", help="camera topic, {name} = camera")
    p.add_argument("--compressed", action="store_true", help="write jpeg CompressedImage on <topic>/compressed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an existing bag directory")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)

    if args.out.exists():
        if not args.overwrite:
            p.error(f"{args.out} exists (use --overwrite)")
        if not (args.out / "metadata.yaml").exists():
            p.error(f"{args.out} exists and is not a rosbag2 directory; not removing it")
        shutil.rmtree(args.out)
    path = make_demo_bag(
        args.out, args.duration, args.rate, args.cameras, args.size, args.instruction, args.joint_names,
        args.storage, args.topic_fmt, args.compressed, seed=args.seed, instruction_period_s=args.instruction_period,
        progress=False if args.no_progress else None,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
