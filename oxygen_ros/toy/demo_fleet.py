"""A demo fleet: rosbag2 recordings of the tabletop world (:mod:`oxygen_ros.toy.world`) driven by its scripted expert,
with what the robot was commanded and what was going on in words, for scoring a policy offline
(``oxygen-make-demo-bag OUT --scene tabletop --count 20``).

One bag per episode seed, every step (``step_rate_hz``, the simulator's 20 Hz by default) stamped with one time:

- ``/cameras/<camera>/image_raw`` (``sensor_msgs/Image`` rgb8) and ``/joint_states`` (ee_x, ee_y, ee_z, gripper), as
  the simulator node publishes them; ``/instruction`` (``std_msgs/String``) at the start and every 2 s;
- :data:`COMMAND_TOPIC` (``trajectory_msgs/JointTrajectory``): the expert's command of the step, one point
  ``time_from_start`` = one step after the header stamp, the time the world reaches (or heads for) it; so chunk
  action ``i`` of an observation stamped ``t`` is compared with the command sent at ``t + i * dt``;
- :data:`SUBTASK_TOPIC` (``std_msgs/String``, the expert's subtask) and :data:`NARRATION_TOPIC`
  (``oxygen_ros/LanguageOutput``, stream ``narration``, stamped with the step's time): the world's truth, written
  when it changes.

The episode runs until success or ``max_steps``; ``tail_s`` more seconds of the finished scene follow.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from rosbags.rosbag2 import Writer
from tqdm import tqdm

from oxygen_ros.evaluation.demo_bag import INSTRUCTION_TOPIC, JOINT_STATES_TOPIC, START_TIME_NS, _header, _image
from oxygen_ros.evaluation.typestore import LANGUAGE_TYPE, STORAGES, oxygen_typestore
from oxygen_ros.toy.world import CAMERAS, JOINT_NAMES, TabletopWorld, expert_action, expert_subtask, narration_text

__all__ = ["COMMAND_TOPIC", "FIRST_SEED", "NARRATION_TOPIC", "SUBTASK_TOPIC", "make_demo_fleet", "make_tabletop_bag"]

COMMAND_TOPIC = "/expert/joint_trajectory"
SUBTASK_TOPIC = "/annotations/subtask"
NARRATION_TOPIC = "/annotations/narration"
FIRST_SEED = 1_000_000  # the world's evaluation seeds (training used 0 .. 1999)
_INSTRUCTION_PERIOD_S = 2.0


def make_tabletop_bag(out: Path | str, seed: int = FIRST_SEED, step_rate_hz: float = 20.0, *, tail_s: float = 0.5,
                      storage: str = "sqlite3", start_time_ns: int = START_TIME_NS) -> Path:
    """Write one expert episode of the tabletop world (scene ``seed``) to the new bag directory ``out``."""
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {sorted(STORAGES)}, got {storage!r}")
    if step_rate_hz <= 0 or tail_s < 0:
        raise ValueError("step_rate_hz must be positive and tail_s not negative")
    out = Path(out)
    ts, _ = oxygen_typestore()
    T = ts.types
    world = TabletopWorld(seed=seed)
    dt_ns = round(1e9 / step_rate_hz)
    dt = T["builtin_interfaces/msg/Duration"](sec=dt_ns // 1_000_000_000, nanosec=dt_ns % 1_000_000_000)
    zero = T["builtin_interfaces/msg/Duration"](sec=0, nanosec=0)
    names, empty = list(JOINT_NAMES), np.zeros(0, np.float64)
    with Writer(out, version=9, storage_plugin=STORAGES[storage]) as writer:
        conns = {topic: writer.add_connection(topic, msgtype, typestore=ts) for topic, msgtype in (
            (INSTRUCTION_TOPIC, "std_msgs/msg/String"), (JOINT_STATES_TOPIC, "sensor_msgs/msg/JointState"),
            (COMMAND_TOPIC, "trajectory_msgs/msg/JointTrajectory"), (SUBTASK_TOPIC, "std_msgs/msg/String"),
            (NARRATION_TOPIC, LANGUAGE_TYPE),
            *((f"/cameras/{c}/image_raw", "sensor_msgs/msg/Image") for c in CAMERAS))}

        def write(topic: str, stamp_ns: int, msg: Any) -> None:
            writer.write(conns[topic], stamp_ns, ts.serialize_cdr(msg, msg.__msgtype__))

        last = {"subtask": None, "narration": None}
        tail_steps, k = round(tail_s * step_rate_hz), 0
        while tail_steps >= 0:
            stamp = start_time_ns + k * dt_ns
            header = _header(T, stamp, "")
            if k % max(1, round(_INSTRUCTION_PERIOD_S * step_rate_hz)) == 0:
                write(INSTRUCTION_TOPIC, stamp, T["std_msgs/msg/String"](data=world.instruction))
            write(JOINT_STATES_TOPIC, stamp, T["sensor_msgs/msg/JointState"](
                header=header, name=names, position=world.joint_state.astype(np.float64), velocity=empty, effort=empty))
            for cam in CAMERAS:
                write(f"/cameras/{cam}/image_raw", stamp, _image(T, world.render(cam), _header(T, stamp, cam),
                                                                 False, 90))
            texts = {"subtask": expert_subtask(world), "narration": narration_text(world)}
            if texts["subtask"] != last["subtask"]:
                write(SUBTASK_TOPIC, stamp, T["std_msgs/msg/String"](data=texts["subtask"]))
            if texts["narration"] != last["narration"]:
                write(NARRATION_TOPIC, stamp, T[LANGUAGE_TYPE](
                    header=header, request_id=0, frame_index=k, task="narration", stream="narration",
                    text=texts["narration"], num_tokens=0, eos=True, latency=zero))
            last = texts
            command = expert_action(world)
            point = T["trajectory_msgs/msg/JointTrajectoryPoint"](
                positions=command.astype(np.float64), velocities=empty, accelerations=empty, effort=empty,
                time_from_start=dt)
            write(COMMAND_TOPIC, stamp, T["trajectory_msgs/msg/JointTrajectory"](
                header=header, joint_names=names, points=[point]))
            if world.done:
                tail_steps -= 1
            world.apply(command)
            k += 1
    return out


def make_demo_fleet(out: Path | str, count: int, first_seed: int = FIRST_SEED, *, step_rate_hz: float = 20.0,
                    tail_s: float = 0.5, storage: str = "sqlite3", progress: bool | None = None) -> list[Path]:
    """``count`` tabletop bags ``out/tabletop_<seed>`` for seeds ``first_seed`` on (``out`` is created; existing
    bags of the same name are an error)."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    show = sys.stderr.isatty() if progress is None else progress
    seeds: Iterable[int] = tqdm(range(first_seed, first_seed + count), desc="writing bags", unit="bag",
                                disable=not show)
    return [make_tabletop_bag(out / f"tabletop_{seed}", seed, step_rate_hz, tail_s=tail_s, storage=storage)
            for seed in seeds]
