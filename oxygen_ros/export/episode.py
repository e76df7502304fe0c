"""One bag -> episodes: the contract's topics read with rosbags, sampled on a fixed frame clock from the bag's time,
images decoded with the node's own conversion, and the node's language outputs as LeRobot language rows.

The frame clock: ``t_k = t_0 + k / fps`` from the first time every camera and the state have a message (bag receive
times) to the bag's (or the episode's) end. At each ``t_k`` every camera's and the state's newest message at or
before ``t_k`` must be at most ``tolerance.image_s`` / ``state_s`` old, and an action must be in force (below);
else the frame is dropped and counted by reason (``dropped``), never filled. Kept frames are numbered 0..N-1 and
stamped ``frame_index / fps`` as LeRobot stamps them.

The action in force at ``t``:

- ``action_chunk`` (``oxygen_ros/ActionChunk``): the newest chunk received at or before ``t`` whose observation
  stamp is at most ``action_s`` old; action ``i`` is due at stamp + (first_step + i + 1) * dt (the evaluation's
  rule, :mod:`oxygen_ros.evaluation.alignment`), and the one in force is the first not yet due: the step the robot
  is moving to. A chunk whose last step is past is not in force;
- ``setpoints`` / ``command``: the newest ``JointState`` (positions by name), ``Float64MultiArray`` (``data``) or
  ``JointTrajectory`` (its first point) at most ``action_s`` old.

Language (:data:`LANGUAGE_STYLES`): each ``LanguageOutput`` is stamped with the kept frame nearest its observation
stamp (within ``tolerance.language_s``; else counted in ``language_unmatched``). memory / subtask / narration
become ``language_persistent`` rows (role assistant; ``narration`` is this project's registered style), answers of
the ``ask_stream`` become ``vqa`` events (role assistant, the ``ask_camera``; the content is LeRobot's JSON
answer form ``{"attribute": "answer", "label": <task>, "value": <text>}``, its validator's ``attribute`` shape).
The instruction in force is each
frame's task; when it changes mid-episode a ``task_aug`` row (role user) marks the frame.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rosbags.highlevel import AnyReader

from oxygen_ros.evaluation.typestore import ACTION_TYPE, IMAGE_TYPES, LANGUAGE_TYPE, oxygen_typestore
from oxygen_ros.ros.image_conversion import ImageError, compressed_msg_to_array, image_msg_to_array

from .ask import ask_records, ask_topics, register_ask_types
from .contract import Contract

__all__ = ["LANGUAGE_STYLES", "NARRATION_STYLE", "Episode", "ExportError", "bag_parts", "read_episodes"]

NARRATION_STYLE = "narration"
# LanguageOutput.task -> LeRobot style (persistent); the ask stream's outputs are vqa events
LANGUAGE_STYLES: dict[str, str] = {"memory": "memory", "subtask": "subtask", "narration": NARRATION_STYLE}
STATE_TYPES = ("sensor_msgs/msg/JointState",)
COMMAND_TYPES = ("sensor_msgs/msg/JointState", "std_msgs/msg/Float64MultiArray",
                 "trajectory_msgs/msg/JointTrajectory")
STRING_TYPE = "std_msgs/msg/String"
NS = 1_000_000_000


class ExportError(ValueError):
    """A bag (or an episode of it) that cannot be exported: unreadable, a topic missing, a type mismatch, an image
    size change, no frame left. The message says which and why; the other bags still export."""


@dataclass
class Episode:
    """One episode's frames and rows, ready for the writer."""

    bag: str
    times_ns: np.ndarray                      # [N] bag time of each kept frame
    images: dict[str, np.ndarray]             # feature key -> [N, H, W, 3] uint8
    state: np.ndarray                         # [N, S] float32
    action: np.ndarray                        # [N, A] float32
    tasks: list[str]                          # [N] the instruction in force
    state_names: list[str]
    action_names: list[str]
    persistent: list[dict[str, Any]] = field(default_factory=list)   # rows with timestamp (frame time)
    events: dict[int, list[dict[str, Any]]] = field(default_factory=dict)   # frame -> event rows
    dropped: Counter = field(default_factory=Counter)
    language_unmatched: int = 0
    bag_duration_s: float = 0.0
    # set when the frames were encoded elsewhere (a fleet worker) and dropped to keep results small
    image_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    image_stats: dict[str, dict] | None = None

    def camera_shapes(self) -> dict[str, tuple[int, ...]]:
        """Feature key -> [H, W, 3]."""
        return {k: tuple(v.shape[1:]) for k, v in self.images.items()} or dict(self.image_shapes)

    @property
    def length(self) -> int:
        return len(self.times_ns)


@dataclass
class _Stream:
    times: np.ndarray     # [M] int64 receive times
    msgs: list[Any]

    def newest(self, t: int) -> int:
        """Index of the newest message at or before ``t`` (-1: none)."""
        return int(np.searchsorted(self.times, t, side="right")) - 1


def bag_parts(bag: Path | str) -> list[Path]:
    """The bags one recording spans: ``bag`` itself, or for ``A+B[+...]`` (when no such path exists) each part,
    read together as one bag (e.g. a recording and the node outputs ``oxygen-evaluate-bag`` wrote for it)."""
    text = str(bag)
    if Path(text).exists() or "+" not in text:
        return [Path(text)]
    return [Path(p) for p in text.split("+")]


def _read(bag: Path, contract: Contract) -> tuple[dict[str, _Stream], int, int]:
    ts, _ = oxygen_typestore()
    try:
        reader = AnyReader(bag_parts(bag), default_typestore=ts)
        reader.open()
        register_ask_types(reader.typestore)  # where the bag does not define them itself
    except Exception as exc:  # rosbags raises its own errors for corrupt / truncated / missing storage
        raise ExportError(f"cannot open the bag: {type(exc).__name__}: {exc}") from exc
    try:
        types: dict[str, set[str]] = {}
        for c in reader.connections:
            types.setdefault(c.topic, set()).add(c.msgtype)
        # (role, topic, allowed types, required): a topic may serve several roles, each is checked
        roles: list[tuple[str, str, tuple[str, ...], bool]] = [
            *((f"camera {n}", t, IMAGE_TYPES, True) for n, t in contract.cameras.items()),
            ("state", contract.state_topic, STATE_TYPES, True),
            ("action", contract.action_topic,
             (ACTION_TYPE,) if contract.action_source == "action_chunk" else COMMAND_TYPES, True)]
        if contract.instruction_topic:
            roles.append(("instruction", contract.instruction_topic, (STRING_TYPE,), False))
        if contract.language_topic:
            roles.append(("language", contract.language_topic, (LANGUAGE_TYPE,), False))
        if contract.ask_action:
            goal, result = ask_topics(contract.ask_action)
            roles.append(("ask goals", goal, ("oxygen_ros/action/Ask_SendGoal_Event",), False))
            roles.append(("ask results", result, ("oxygen_ros/action/Ask_GetResult_Event",), False))
        if contract.episode_topic:
            roles.append(("episode", contract.episode_topic, tuple(t for v in types.values() for t in v), True))
        missing = sorted({t for _, t, _, req in roles if req and t not in types})
        if missing:
            raise ExportError(f"topics of the contract missing from the bag: {missing} (the bag has "
                              f"{sorted(types)})")
        for role, topic, allowed, _ in roles:
            bad = sorted(types.get(topic, set()) - set(allowed))
            if bad:
                raise ExportError(f"type mismatch on {topic} ({role}): the bag has {bad}, the contract needs one "
                                  f"of {list(allowed)}")
        wanted = {t for _, t, _, _ in roles}
        conns = [c for c in reader.connections if c.topic in wanted]
        rows: dict[str, list[tuple[int, Any]]] = {t: [] for t in wanted}
        try:
            for conn, stamp, raw in reader.messages(connections=conns):
                rows[conn.topic].append((int(stamp), reader.deserialize(raw, conn.msgtype)))
        except ExportError:
            raise
        except Exception as exc:
            raise ExportError(f"the bag is corrupt or truncated: {type(exc).__name__}: {exc}") from exc
        streams = {t: _Stream(np.array([s for s, _ in r], dtype=np.int64), [m for _, m in r])
                   for t, r in rows.items()}
        return streams, int(reader.start_time), int(reader.end_time)
    finally:
        reader.close()


def _stamp_ns(header: Any) -> int:
    return int(header.stamp.sec) * NS + int(header.stamp.nanosec)


def _decode(msg: Any) -> np.ndarray:
    if hasattr(msg, "encoding"):
        return image_msg_to_array(msg)
    return compressed_msg_to_array(msg)


def _by_names(names: list[str], values: np.ndarray, wanted: list[str], what: str) -> np.ndarray:
    idx = {n: i for i, n in enumerate(names)}
    absent = [n for n in wanted if n not in idx]
    if absent:
        raise ExportError(f"{what}: joints {absent} are not in the message's names {names}")
    return np.asarray([values[idx[n]] for n in wanted], dtype=np.float32)


class _Actions:
    """The action in force at a time (module docstring), and the action names."""

    def __init__(self, stream: _Stream, contract: Contract) -> None:
        self.s, self.c = stream, contract
        self.tol = int(contract.tolerance.action_s * NS)
        first = stream.msgs[0] if stream.msgs else None
        names = list(contract.action_names)
        if not names and first is not None:
            names = list(getattr(first, "joint_names", None) or getattr(first, "name", None) or [])
        if not names and first is not None:
            n = len(first.data) if hasattr(first, "data") else len(first.points[0].positions)
            names = [f"action_{i}" for i in range(n)]
        self.names = names

    def at(self, t: int) -> np.ndarray | None:
        i = self.s.newest(t)
        if i < 0:
            return None
        m = self.s.msgs[i]
        if self.c.action_source == "action_chunk":
            stamp = _stamp_ns(m.header)
            if t - stamp > self.tol:  # the chunk's observation is too old
                return None
            dt = int(m.dt.sec) * NS + int(m.dt.nanosec)
            if dt <= 0:
                raise ExportError(f"{self.c.action_topic}: a chunk with dt <= 0")
            acts = np.asarray(m.actions, dtype=np.float32).reshape(int(m.horizon), int(m.action_dim))
            step = max(0, math.ceil((t - stamp) / dt) - int(m.first_step) - 1)
            if step >= acts.shape[0]:
                return None
            names = list(m.joint_names) or self.names
            return _by_names(names, acts[step], self.names, self.c.action_topic) if names else acts[step]
        if t - int(self.s.times[i]) > self.tol:
            return None
        if hasattr(m, "position"):
            return _by_names(list(m.name), np.asarray(m.position), self.names, self.c.action_topic)
        if hasattr(m, "points"):
            if not m.points:
                return None
            return _by_names(list(m.joint_names), np.asarray(m.points[0].positions), self.names,
                             self.c.action_topic)
        return np.asarray(m.data, dtype=np.float32)


def _segments(streams: Mapping[str, _Stream], contract: Contract, start: int, end: int) -> list[tuple[int, int]]:
    if not contract.episode_topic:
        return [(start, end + 1)]
    cuts = sorted(set(int(t) for t in streams[contract.episode_topic].times))
    bounds = [start] + [c for c in cuts if start < c <= end] + [end + 1]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def read_episodes(bag: Path | str, contract: Contract) -> Iterator[Episode | ExportError]:
    """The bag's episodes (one, or one per segment of ``episode_topic``), each an :class:`Episode` or the
    :class:`ExportError` saying why that episode cannot be exported. Raises :class:`ExportError` for the whole bag
    (unreadable, topics missing, types wrong)."""
    bag = Path(bag)
    streams, start, end = _read(bag, contract)
    for a, b in _segments(streams, contract, start, end):
        try:
            yield _episode(bag, streams, contract, a, b, (end - start) / NS)
        except ExportError as exc:
            yield exc


def _episode(bag: Path, streams: Mapping[str, _Stream], c: Contract, a: int, b: int, dur: float) -> Episode:
    cams = c.camera_keys
    state = streams[c.state_topic]
    actions = _Actions(streams[c.action_topic], c)
    if not actions.names:
        raise ExportError(f"no action on {c.action_topic}: cannot name the action dimensions")
    firsts = []
    for topic in [*cams.values(), c.state_topic]:
        s = streams[topic]
        k = int(np.searchsorted(s.times, a, side="left"))
        if k >= len(s.times) or s.times[k] >= b:
            raise ExportError(f"no message on {topic} in the episode [{a / NS:.3f}, {b / NS:.3f}) s")
        firsts.append(int(s.times[k]))
    t0 = max(firsts)
    period = NS / c.fps
    n_ticks = int((b - 1 - t0) // period) + 1
    itol, stol = int(c.tolerance.image_s * NS), int(c.tolerance.state_s * NS)
    state_names = list(c.state_names) or list(state.msgs[0].name)
    dropped: Counter = Counter()
    kept_t: list[int] = []
    cam_idx: dict[str, list[int]] = {k: [] for k in cams}
    states, acts = [], []
    for k in range(n_ticks):
        t = t0 + round(k * period)
        idx = {key: streams[topic].newest(t) for key, topic in cams.items()}
        stale = [key for key, i in idx.items() if i < 0 or t - streams[cams[key]].times[i] > itol]
        if stale:
            dropped["image_stale"] += 1
            continue
        si = state.newest(t)
        if si < 0 or t - state.times[si] > stol:
            dropped["state_stale"] += 1
            continue
        act = actions.at(t)
        if act is None:
            dropped["no_action"] += 1
            continue
        if len(act) != len(actions.names):
            raise ExportError(f"{c.action_topic}: an action of {len(act)} values, expected {len(actions.names)}")
        m = state.msgs[si]
        states.append(_by_names(list(m.name), np.asarray(m.position), state_names, c.state_topic))
        acts.append(act)
        kept_t.append(t)
        for key, i in idx.items():
            cam_idx[key].append(i)
    if not kept_t:
        raise ExportError(f"no frame left: {dict(dropped)} of {n_ticks} frames dropped")
    images: dict[str, np.ndarray] = {}
    for key, topic in cams.items():
        msgs = streams[topic].msgs
        cache: dict[int, np.ndarray] = {}
        frames = []
        for i in cam_idx[key]:
            if i not in cache:
                try:
                    cache[i] = _decode(msgs[i])
                except ImageError as exc:
                    raise ExportError(f"{topic}: message {i}: {exc}") from exc
            frames.append(cache[i])
        shapes = sorted({f.shape for f in frames})
        if len(shapes) > 1:
            raise ExportError(f"image size change on {topic} within the episode: {shapes} (LeRobot features have "
                              f"one shape; split the bag with episode_topic or resize upstream)")
        images[key] = np.stack(frames)
    times = np.asarray(kept_t, dtype=np.int64)
    tasks = _tasks(streams, c, times)
    ep = Episode(bag=str(bag), times_ns=times, images=images, state=np.stack(states), action=np.stack(acts),
                 tasks=tasks, state_names=state_names, action_names=list(actions.names), dropped=dropped,
                 bag_duration_s=dur)
    _language(ep, streams, c)
    return ep


def _tasks(streams: Mapping[str, _Stream], c: Contract, times: np.ndarray) -> list[str]:
    s = streams.get(c.instruction_topic) if c.instruction_topic else None
    if s is None or not len(s.times):
        return [""] * len(times)
    out = []
    for t in times:
        i = s.newest(int(t))
        out.append(str(s.msgs[max(i, 0)].data))  # before the first instruction: the first one
    return out


def _language(ep: Episode, streams: Mapping[str, _Stream], c: Contract) -> None:
    fps = c.fps
    for k in range(1, ep.length):
        if ep.tasks[k] != ep.tasks[k - 1]:
            ep.persistent.append({"role": "user", "content": ep.tasks[k], "style": "task_aug",
                                  "timestamp": float(np.float32(k / fps)), "camera": None, "tool_calls": None})
    tol = int(c.tolerance.language_s * NS)

    def frame_of(stamp: int) -> int | None:
        k = int(np.searchsorted(ep.times_ns, stamp))
        near = [j for j in (k - 1, k) if 0 <= j < ep.length]
        if not near:
            return None
        j = min(near, key=lambda j: abs(int(ep.times_ns[j]) - stamp))
        return j if abs(int(ep.times_ns[j]) - stamp) <= tol else None

    answered: set[int] = set()
    if c.ask_action:
        goal, result = ask_topics(c.ask_action)
        for a in ask_records(streams[goal].msgs, streams[result].msgs):
            j = frame_of(a.observation_stamp_ns)
            if j is None or j in ep.events:  # LeRobot allows one question and answer per frame and camera
                ep.language_unmatched += 1
                continue
            answered.add(a.request_id)
            ep.events[j] = [{"role": "user", "content": a.question, "style": "vqa", "camera": c.vqa_camera,
                             "tool_calls": None},
                            {"role": "assistant", "content": _vqa_answer("answer", a.text), "style": "vqa",
                             "camera": c.vqa_camera, "tool_calls": None}]
    s = streams.get(c.language_topic) if c.language_topic else None
    for m in s.msgs if s is not None else ():
        j = frame_of(_stamp_ns(m.header))
        if j is None:
            ep.language_unmatched += 1
            continue
        stream = str(m.stream or m.task)
        ts = float(np.float32(j / fps))
        if stream == c.ask_stream:
            if int(m.request_id) in answered:  # its question and answer came from the action's records
                continue
            if j in ep.events:
                ep.language_unmatched += 1
                continue
            ep.events.setdefault(j, []).append({"role": "assistant", "content": _vqa_answer(m.task, m.text),
                                                "style": "vqa",
                                                "camera": c.vqa_camera, "tool_calls": None})
        elif str(m.task) in LANGUAGE_STYLES:
            ep.persistent.append({"role": "assistant", "content": str(m.text), "style": LANGUAGE_STYLES[str(m.task)],
                                  "timestamp": ts, "camera": None, "tool_calls": None})
        else:
            ep.language_unmatched += 1
    # LeRobot's annotation writer's orders: persistent by (timestamp, style, role), a frame's events by
    # (style, role, camera)
    ep.persistent.sort(key=lambda r: (r["timestamp"], r["style"] or "", r["role"]))
    for rows in ep.events.values():
        rows.sort(key=lambda r: (r["style"] or "", r["role"] or "", r["camera"] or ""))


def _vqa_answer(task: str, text: str) -> str:
    """LeRobot's vqa answers are JSON of one of its answer shapes: the free-text answer as an ``attribute``."""
    return json.dumps({"attribute": "answer", "label": str(task or "answer"), "value": str(text)}, sort_keys=True)
