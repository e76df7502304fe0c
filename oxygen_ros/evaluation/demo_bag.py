"""A deterministic rosbag2 of the synthetic demo scene (:mod:`oxygen_ros.testing.synthetic_scene`): cameras, joint
states and the instruction, written with rosbags (``oxygen-make-demo-bag``).

Topics: one ``sensor_msgs/Image`` (rgb8) per camera per tick on ``camera_topic_fmt`` (or
``sensor_msgs/CompressedImage`` jpeg on ``<topic>/compressed``), ``/joint_states`` (``sensor_msgs/JointState``)
per tick, and ``/instruction`` (``std_msgs/String``) at the start and every ``instruction_period_s``. Header
stamps equal bag times; the start time is fixed, so the same arguments give the same message bytes.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from rosbags.rosbag2 import Writer
from tqdm import tqdm

from oxygen_ros.testing.synthetic_scene import joint_state, render_scene

from .typestore import STORAGES, get_ros2_typestore

__all__ = [
    "DEFAULT_CAMERAS",
    "DEFAULT_INSTRUCTION",
    "DEFAULT_JOINT_NAMES",
    "INSTRUCTION_TOPIC",
    "JOINT_STATES_TOPIC",
    "START_TIME_NS",
    "make_demo_bag",
]

DEFAULT_CAMERAS: tuple[str, ...] = ("base_0_rgb", "left_wrist_0_rgb")
DEFAULT_JOINT_NAMES: tuple[str, ...] = tuple(f"joint_{i}" for i in range(1, 8)) + ("gripper",)
DEFAULT_INSTRUCTION = "put the red block on the blue plate"
INSTRUCTION_TOPIC = "/instruction"
JOINT_STATES_TOPIC = "/joint_states"
START_TIME_NS = 1_700_000_000 * 1_000_000_000  # fixed bag start (2023-11-14T22:13:20Z): deterministic output


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
    # (over 60 lines with its signature and docstring; the body is one short pass)
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {sorted(STORAGES)}, got {storage!r}")
    if duration_s <= 0 or rate_hz <= 0 or size <= 0:
        raise ValueError("duration_s, rate_hz and size must be positive")
    if not cameras:
        raise ValueError("at least one camera is needed")
    out = Path(out)
    ts = get_ros2_typestore()
    T = ts.types
    JointState, String = T["sensor_msgs/msg/JointState"], T["std_msgs/msg/String"]
    img_type = T["sensor_msgs/msg/CompressedImage" if compressed else "sensor_msgs/msg/Image"].__msgtype__
    n_ticks = max(1, round(duration_s * rate_hz))
    instr_every = max(1, round(instruction_period_s * rate_hz))
    names = list(joint_names)
    show = (n_ticks >= 100 and sys.stderr.isatty()) if progress is None else progress

    with Writer(out, version=9, storage_plugin=STORAGES[storage]) as writer:
        instr_conn = writer.add_connection(INSTRUCTION_TOPIC, String.__msgtype__, typestore=ts)
        joint_conn = writer.add_connection(JOINT_STATES_TOPIC, JointState.__msgtype__, typestore=ts)
        cam_conns = {cam: writer.add_connection(camera_topic_fmt.format(name=cam)
                                                + ("/compressed" if compressed else ""), img_type, typestore=ts)
                     for cam in cameras}

        def write(conn: Any, stamp_ns: int, msg: Any) -> None:
            writer.write(conn, stamp_ns, ts.serialize_cdr(msg, msg.__msgtype__))

        for k in tqdm(range(n_ticks), desc=f"writing {out.name}", unit="tick", disable=not show):
            stamp_ns = start_time_ns + round(k * 1e9 / rate_hz)
            t = k / rate_hz
            if k % instr_every == 0:
                write(instr_conn, stamp_ns, String(data=instruction))
            q = joint_state(t, names)
            dq = (joint_state(t + 1e-3, names) - joint_state(t - 1e-3, names)) / 2e-3
            write(joint_conn, stamp_ns, JointState(header=_header(T, stamp_ns, ""), name=names, position=q,
                                                   velocity=dq, effort=np.zeros(0, dtype=np.float64)))
            for cam, conn in cam_conns.items():
                rgb = render_scene(t, cam, size, seed)
                write(conn, stamp_ns, _image(T, rgb, _header(T, stamp_ns, cam), compressed, jpeg_quality))
    return out


def _header(T: Mapping[str, Any], stamp_ns: int, frame_id: str) -> Any:
    sec, nsec = divmod(stamp_ns, 1_000_000_000)
    return T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=sec, nanosec=nsec), frame_id=frame_id)


def _image(T: Mapping[str, Any], rgb: np.ndarray, header: Any, compressed: bool, jpeg_quality: int) -> Any:
    """An rgb8 Image, or a jpeg CompressedImage, of ``rgb`` [S, S, 3] uint8."""
    if compressed:
        ok, jpg = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, jpeg_quality])
        if not ok:
            raise RuntimeError("JPEG encoding failed")
        return T["sensor_msgs/msg/CompressedImage"](header=header, format="rgb8; jpeg compressed bgr8",
                                                    data=jpg.reshape(-1))
    h, w = rgb.shape[:2]
    return T["sensor_msgs/msg/Image"](header=header, height=h, width=w, encoding="rgb8", is_bigendian=0, step=w * 3,
                                      data=rgb.reshape(-1))
