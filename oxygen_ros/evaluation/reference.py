"""What a bag says the robot did, and a run's scores against it: the reference joint positions and the language
annotations, read with rosbags (:func:`load_references`), and the scores of a run's chunks and texts
(:func:`score_run`, the metrics are :mod:`.scoring`'s).

Reference topics, by message type (times in bag time; a zero header stamp falls back to the message's log time):

- ``sensor_msgs/JointState`` (the bag's ``/joint_states``, the default; or a command topic): ``position`` at the
  header stamp, columns by ``name`` (messages missing one of the first message's joints are skipped);
- ``trajectory_msgs/JointTrajectory`` (what a trajectory controller was sent): each point at header stamp +
  ``time_from_start``; a newer trajectory replaces the older from its first point on (:mod:`.alignment`);
- ``oxygen_ros/ActionChunk`` (a policy's recorded chunks, e.g. the deployed node's): action ``i`` at
  stamp + (first_step + i + 1) * dt, replaced like trajectories.

Annotation topics: ``std_msgs/String`` (valid from its log time: the bag receive time) or ``oxygen_ros/LanguageOutput``
(valid from its header stamp; on a topic carrying several streams only the scored stream's messages count).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rosbags.highlevel import AnyReader

from .alignment import Annotations, ReferenceSeries, Trajectory, merge_trajectories
from .scoring import ChunkRecord, score_chunks, score_language
from .typestore import ACTION_TYPE, LANGUAGE_TYPE

__all__ = ["ANNOTATION_TYPES", "JOINT_STATE_TYPE", "REFERENCE_TYPES", "TRAJECTORY_TYPE", "References",
           "ScoringOptions", "load_references", "read_annotations", "read_reference", "score_run", "topic_type"]

logger = logging.getLogger(__name__)

JOINT_STATE_TYPE = "sensor_msgs/msg/JointState"
TRAJECTORY_TYPE = "trajectory_msgs/msg/JointTrajectory"
STRING_TYPE = "std_msgs/msg/String"
REFERENCE_TYPES = (JOINT_STATE_TYPE, TRAJECTORY_TYPE, ACTION_TYPE)
ANNOTATION_TYPES = (STRING_TYPE, LANGUAGE_TYPE)


@dataclass(frozen=True)
class ScoringOptions:
    """What to score a bag's outputs against.

    Attributes:
        reference_topic: what the robot was commanded (:data:`REFERENCE_TYPES`); '' = the evaluation's joint
            states topic (the future measured positions).
        reference_joints: the joints scored (default: the action names that the reference also has).
        reference_language_topics: language stream -> annotation topic (:data:`ANNOTATION_TYPES`).
        tolerance: a chunk is within tolerance when its largest absolute error is at most this (robot units).
    """

    reference_topic: str = ""
    reference_joints: tuple[str, ...] = ()
    reference_language_topics: Mapping[str, str] = field(default_factory=dict)
    tolerance: float = 0.05

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (report, cache keys)."""
        return {"reference_topic": self.reference_topic, "reference_joints": list(self.reference_joints),
                "reference_language_topics": dict(sorted(self.reference_language_topics.items())),
                "tolerance": self.tolerance}


def _stamp(msg: Any, log_ns: int) -> int:
    s = msg.header.stamp
    ns = int(s.sec) * 1_000_000_000 + int(s.nanosec)
    return ns if ns > 0 else int(log_ns)


def topic_type(reader: AnyReader, topic: str) -> str | None:
    """The message type of ``topic`` in the bag (None when absent)."""
    return next((c.msgtype for c in reader.connections if c.topic == topic), None)


def _messages(reader: AnyReader, topic: str, allowed: tuple[str, ...]) -> tuple[str, Iterator[tuple[int, Any]]]:
    msgtype = topic_type(reader, topic)
    if msgtype is None:
        raise ValueError(f"topic {topic} is not in the bag")
    if msgtype not in allowed:
        raise ValueError(f"topic {topic} has type {msgtype}; expected one of {list(allowed)}")
    conns = [c for c in reader.connections if c.topic == topic]
    return msgtype, ((log_ns, reader.deserialize(raw, c.msgtype)) for c, log_ns, raw in reader.messages(conns))


def read_reference(reader: AnyReader, topic: str) -> ReferenceSeries:
    """The joint positions ``topic`` holds over time (see the module docstring for each message type).

    Raises:
        ValueError: the topic is missing, of another type, or holds no usable message.
    """
    msgtype, messages = _messages(reader, topic, REFERENCE_TYPES)
    names: tuple[str, ...] | None = None
    if msgtype == JOINT_STATE_TYPE:
        samples = []
        for log_ns, msg in messages:
            names = names or tuple(msg.name)
            index = {n: i for i, n in enumerate(msg.name)}
            pos = np.asarray(msg.position, np.float64)
            if all(n in index and index[n] < pos.size for n in names):
                samples.append((_stamp(msg, log_ns), pos[[index[n] for n in names]]))
        series = ReferenceSeries.from_samples(names or (), samples)
    else:
        trajectories = []
        for log_ns, msg in messages:
            names = names or tuple(msg.joint_names)
            index = {n: i for i, n in enumerate(msg.joint_names)}
            if not all(n in index for n in names):
                continue
            start, cols = _stamp(msg, log_ns), [index[n] for n in names]
            if msgtype == TRAJECTORY_TYPE:
                times = [start + int(p.time_from_start.sec) * 1_000_000_000 + int(p.time_from_start.nanosec)
                         for p in msg.points]
                pos = [np.asarray(p.positions, np.float64) for p in msg.points]
                if any(p.size <= max(cols) for p in pos):
                    continue
                positions = np.stack([p[cols] for p in pos]) if pos else np.zeros((0, len(names)))
            else:  # ActionChunk
                h, d = int(msg.horizon), int(msg.action_dim)
                acts = np.asarray(msg.actions, np.float64)
                if acts.size != h * d or max(cols) >= d:
                    continue
                dt = int(msg.dt.sec) * 1_000_000_000 + int(msg.dt.nanosec)
                first = int(getattr(msg, "first_step", 0))  # actions already committed when it was sent
                times = [start + (first + i + 1) * dt for i in range(h)]
                positions = acts.reshape(h, d)[:, cols]
            trajectories.append(Trajectory(np.asarray(times, np.int64), positions))
        series = merge_trajectories(names or (), trajectories)
    if not len(series):
        raise ValueError(f"reference topic {topic} ({msgtype}) holds no usable message")
    return series


def read_annotations(reader: AnyReader, topic: str, stream: str) -> Annotations:
    """Stream ``stream``'s annotations on ``topic`` (see the module docstring).

    Raises:
        ValueError: the topic is missing or of another type.
    """
    msgtype, messages = _messages(reader, topic, ANNOTATION_TYPES)
    entries: list[tuple[int, str]] = []
    for log_ns, msg in messages:
        if msgtype == STRING_TYPE:
            entries.append((int(log_ns), msg.data))
        elif (msg.stream or msg.task or stream) == stream:
            entries.append((_stamp(msg, log_ns), msg.text))
    entries.sort(key=lambda e: e[0])  # stable: of equal times the later message wins
    return Annotations(topic, np.asarray([t for t, _ in entries], np.int64), tuple(t for _, t in entries))


@dataclass
class References:
    """A bag's references for one run: the joint positions (None, with ``note`` saying why, when the default
    reference cannot be read) and the annotations per stream."""

    options: ScoringOptions
    topic: str
    reference: ReferenceSeries | None
    annotations: dict[str, Annotations]
    note: str = ""


def load_references(reader: AnyReader, options: ScoringOptions, joint_states_topic: str) -> References:
    """Read ``options``' references from the bag. An explicitly named reference topic or joint set, and every
    annotation topic, must be readable; the default (the joint states) is skipped with a note when it is not.

    Raises:
        ValueError: a named topic is missing, of another type, or holds no usable message.
    """
    topic = options.reference_topic or joint_states_topic
    annotations = {stream: read_annotations(reader, t, stream)
                   for stream, t in sorted(options.reference_language_topics.items())}
    try:
        return References(options, topic, read_reference(reader, topic), annotations)
    except ValueError as e:
        if options.reference_topic or options.reference_joints:
            raise
        logger.warning("actions not scored: %s", e)
        return References(options, topic, None, annotations, note=str(e))


def scored_joints(refs: References, action_names: Sequence[str]) -> list[str]:
    """The joints to score: ``reference_joints``, else the action names the reference also has.

    Raises:
        ValueError: a named joint missing from the actions or the reference.
    """
    if refs.reference is None:
        return []
    names = refs.reference.names
    if refs.options.reference_joints:
        bad = [j for j in refs.options.reference_joints if j not in names or j not in action_names]
        if bad:
            raise ValueError(f"reference_joints {bad} are not both action names {list(action_names)} and joints "
                             f"of the reference {refs.topic} {list(names)}")
        return list(refs.options.reference_joints)
    return [n for n in action_names if n in names]


def score_run(refs: References, chunks: Sequence[ChunkRecord], items: Sequence[Mapping[str, Any]],
              action_names: Sequence[str], dt_s: float, n_execute: int) -> dict[str, Any]:
    """The report's ``scores``: the scoring options, the reference's span and ``actions`` (:func:`score_chunks`,
    None with a ``note`` when nothing could be scored) and ``language`` (:func:`score_language`)."""
    joints = scored_joints(refs, action_names)
    note = refs.note or ("" if joints else f"no action name {list(action_names)} is a joint of the reference "
                                          f"{refs.topic} {list(refs.reference.names)}")
    actions = (score_chunks(chunks, action_names, refs.reference, joints, dt_s, n_execute, refs.options.tolerance)
               if joints else None)
    span = refs.reference.span_ns if refs.reference is not None else None
    return {"options": refs.options.as_dict(), "reference_topic": refs.topic,
            "reference_samples": len(refs.reference) if refs.reference is not None else 0,
            "reference_span_ns": list(span) if span else None, "actions": actions, "note": note,
            "language": score_language(items, refs.annotations)}
