"""The deterministic run over a bag: the node's own input handling, observation building and frame runner, on
a virtual clock that steps through the bag time at the node's ``control_rate_hz``, without DDS.

Messages are fed in bag order up to each tick into the node's
:class:`~oxygen_ros.ros.input_store.InputStore` (clocked by the bag time), which validates each on
arrival (a bad one is counted and ignored; the previous valid value stays; images are decoded when a frame uses
them): camera images
(``sensor_msgs/Image`` or ``CompressedImage``), the instruction (``std_msgs/String``) and the joint states
(``sensor_msgs/JointState``, joints picked by name). At each tick the node's
:class:`~oxygen_ros.ros.observation_builder.ObservationBuilder` builds the observation, or skips the tick with a
reason when inputs are missing, stale (a camera header stamp more than ``max_image_age_s`` before the tick),
unsynchronised (``max_camera_skew_s``) or invalid. Otherwise one frame of the policy layer's
:class:`~oxygen_ros.policy.runner.FrameRunner` runs, built as
the node builds it (:func:`~oxygen_ros.runtime.model_loader.load_node_policy` / ``build_runner``): language requests
every ``request_every_n_frames`` frames, flow-matching noise seeded with ``seed + frame_index``. The action chunks
and texts therefore depend on the bag and the parameters only: by default (:class:`.timing.ReplayTiming` ``bag``)
the real-time chunking delay follows a modeled latency on the bag's clock, ``k_auto`` runs the fixed ``k`` and
``kernels: auto`` the plain kernels, so timings are measured and reported but never feed back into the outputs
(bit-exact digests also need the same device, dtype and torch thread count, which the report records).

Written into ``out``: ``report.json`` (:mod:`.report`), PNG plots (:mod:`.plots`) and ``out_bag/`` with the node's
output topics (:mod:`.outputs`), header-stamped with the originating observation time (the newest camera stamp
used) and logged at the tick that produced them. The report's ``scores`` compare every chunk with what the robot
was commanded and every text with the bag's annotations (:mod:`.reference`, :mod:`.scoring`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rosbags.highlevel import AnyReader
from rosbags.rosbag2 import Writer
from tqdm import tqdm

from oxygen_ros.policy.hooks import install_runner_hook
from oxygen_ros.ros.diagnostics import ReasonCounter
from oxygen_ros.ros.input_store import InputStore
from oxygen_ros.ros.observation_builder import ObservationBuilder, Skip
from oxygen_ros.runtime.model_loader import (
    LoadedPolicy,
    build_runner,
    instruction_char_cap,
    load_node_policy,
    resolve_device,
)
from oxygen_ros.runtime.params import DEFAULT_CAMERA_TOPIC, NodeParams, validate

from .outputs import OutputBag, prepare_out_bag
from .plots import write_plots
from .reference import ScoringOptions, load_references, score_run, scored_joints
from .report import STAGES, RunLog, build_report, exact_match
from .scoring import ChunkRecord
from .timing import ReplayTiming
from .typestore import IMAGE_TYPES, STORAGES, bag_storage, oxygen_typestore

__all__ = ["INSTRUCTION_TOPIC", "JOINT_STATES_TOPIC", "PolicyCache", "camera_topics", "evaluate_bag", "node_params"]

logger = logging.getLogger(__name__)

JOINT_STATES_TOPIC = "/joint_states"
INSTRUCTION_TOPIC = "/instruction"


def node_params(params: Mapping[str, Any] | NodeParams, reader: AnyReader,
                joint_states_topic: str = JOINT_STATES_TOPIC) -> NodeParams:
    """The node parameters of the run: a mapping is validated as the node validates its parameters; empty
    ``joint_names`` default to the names of the bag's first JointState on ``joint_states_topic``.

    Raises:
        ParamError: invalid values (all problems at once, each naming its parameter).
    """
    given = params.joint_names if isinstance(params, NodeParams) else params.get("joint_names")
    names = tuple(given or ()) or _first_joint_names(reader, joint_states_topic)
    if isinstance(params, NodeParams):
        return dataclasses.replace(params, joint_names=names)
    p = validate({**params, "joint_names": list(names)})
    if p.extra:
        logger.info("not node parameters, ignored: %s", sorted(p.extra))
    return p


def _first_joint_names(reader: AnyReader, topic: str) -> tuple[str, ...]:
    """Joint names of the first JointState on ``topic`` (empty when there is none)."""
    conns = [c for c in reader.connections if c.topic == topic]
    for conn, _, raw in reader.messages(connections=conns) if conns else ():
        return tuple(reader.deserialize(raw, conn.msgtype).name)
    logger.warning("no %s in the bag and no joint_names given", topic)
    return ()


def camera_topics(p: NodeParams, bag_topics: Mapping[str, str]) -> tuple[str, ...]:
    """One topic per camera: ``camera_topics``, else the node's default pattern (``/compressed`` for compressed
    cameras, or when only that variant is in the bag).

    Raises:
        ValueError: a camera topic in the bag that is not an image topic.
    """
    topics: list[str] = []
    for i, name in enumerate(p.camera_names):
        if p.camera_topics:
            topic = p.camera_topics[i]
        else:
            topic = DEFAULT_CAMERA_TOPIC.format(name=name)
            if (p.camera_compressed and p.camera_compressed[i]) or (
                    topic not in bag_topics and topic + "/compressed" in bag_topics):
                topic += "/compressed"
        if topic in bag_topics and bag_topics[topic] not in IMAGE_TYPES:
            raise ValueError(f"camera topic {topic} has type {bag_topics[topic]}, expected one of {IMAGE_TYPES}")
        topics.append(topic)
    missing = sorted(t for t in topics if t not in bag_topics)
    if missing:
        logger.warning("camera topics not in the bag (every frame will be skipped): %s", missing)
    return tuple(topics)


class _BagFeed:
    """The node's input handling, clocked by the bag: :meth:`until` feeds the bag's messages up to a tick, in bag
    order, into the node's InputStore, which validates each one (images are decoded when a frame uses them)."""

    def __init__(self, reader: AnyReader, p: NodeParams, max_instruction_chars: int, joint_states_topic: str,
                 instruction_topic: str) -> None:
        self.reader, self.now_ns = reader, reader.start_time  # log time of the message being fed
        self.rejected = ReasonCounter(logger.debug, "rejected input", clock=self.clock)
        self.store = InputStore(p.camera_names, p.joint_names, self.rejected, p.max_image_pixels,
                                max_instruction_chars, p.instruction, clock=self.clock)
        self.cameras = {t: i for i, t in enumerate(p.camera_topics)}
        self.joint_states_topic, self.instruction_topic = joint_states_topic, instruction_topic
        wanted = {*p.camera_topics, joint_states_topic, instruction_topic}
        conns = [c for c in reader.connections if c.topic in wanted]
        self._messages = iter(reader.messages(connections=conns)) if conns else iter(())
        self._pending = next(self._messages, None)

    def clock(self) -> float:
        """The bag time in seconds (the InputStore's clock)."""
        return self.now_ns / 1e9

    def until(self, tick_ns: int) -> None:
        """Feed every message logged at or before ``tick_ns``."""
        while self._pending is not None and self._pending[1] <= tick_ns:
            conn, self.now_ns, raw = self._pending
            self._feed(conn.topic, conn.msgtype, raw)
            self._pending = next(self._messages, None)

    def _feed(self, topic: str, msgtype: str, raw: bytes) -> None:
        try:
            msg = self.reader.deserialize(raw, msgtype)
        except Exception as e:  # a corrupt payload must not end the evaluation
            self.rejected.add("deserialize_error", f"{topic}: {e}")
            return
        if topic in self.cameras:
            on_image = self.store.on_compressed if msgtype == IMAGE_TYPES[1] else self.store.on_image
            on_image(self.cameras[topic], msg)
        elif topic == self.joint_states_topic:
            self.store.on_joint_state(msg)
        elif topic == self.instruction_topic:
            self.store.on_instruction(msg)


def _tick_count(reader: AnyReader, rate_hz: float, max_frames: int | None) -> int:
    """Ticks at ``rate_hz`` from the bag's first to its last message (both included), at most ``max_frames``."""
    last_ns = reader.end_time - 1  # rosbags' end_time is exclusive
    n = math.floor((last_ns - reader.start_time) * rate_hz / 1e9 + 1e-9) + 1 if reader.message_count else 0
    return n if max_frames is None else min(n, max_frames)


def _replay_clock(runner: Any, timing: ReplayTiming, p: NodeParams, tick_ns: int, stamp_ns: int,
                  dt_s: float) -> Callable[[], int] | None:
    """When a chunk is ready in a replay (:meth:`.timing.ReplayTiming.chunk_clock`): a fixed ``rtc.delay: N``, N
    actions after its observation; ``auto``, the modeled latency after its tick on the bag's clock (or, with the
    ``wall`` clock, None: the measured latency counts, as on the robot)."""
    rtc = runner.rtc
    return timing.chunk_clock(p, rtc.delay if rtc is not None else None, tick_ns, stamp_ns, dt_s)


def _run_ticks(feed: _BagFeed, loaded: LoadedPolicy, runner: Any, outputs: OutputBag, log: RunLog,
               dt_s: float, show: bool, timing: ReplayTiming) -> None:
    """Every tick: feed the bag up to it, build the observation (or skip), run one frame, write its outputs."""
    p, reader = loaded.params, feed.reader
    builder = ObservationBuilder(feed.store, loaded.policy, p.max_image_age_s, p.max_joint_age_s,
                                 max_camera_skew_s=p.max_camera_skew_s)
    for tick in tqdm(range(log.ticks), desc=f"evaluating {Path(reader.paths[0]).name} ({p.mode})", unit="frame",
                     disable=not show):
        tick_ns = reader.start_time + round(tick * 1e9 / p.control_rate_hz)
        feed.until(tick_ns)
        t0 = time.perf_counter()
        built = builder.build(tick_ns, runner.subtask)
        t_obs = time.perf_counter()
        if isinstance(built, Skip):
            log.skip(tick, tick_ns, built.reason, built.detail)
            continue
        if built.prompt_truncated:
            feed.rejected.add("prompt_truncated", "instruction + state exceed the model's max_token_len")
        out = runner.step(built.prepared, stamp_ns=built.stamp_ns, instruction=built.instruction,
                          clock_ns=_replay_clock(runner, timing, p, tick_ns, built.stamp_ns, dt_s))
        res, chunk = out.result, out.chunk
        log.issued += out.new_requests
        # the whole chunk as a robot receives it (ActionChunk's float32), scored against the reference afterwards
        log.chunks.append(ChunkRecord(res.frame_index, built.stamp_ns, chunk.chunk.astype(np.float32)))
        outputs.chunk(res.frame_index, built.stamp_ns, tick_ns, chunk.published, loaded.action_names, dt_s,
                      chunk.latency_s, chunk.subtask, chunk.start)
        for f in res.finished:
            if not f.dropped:
                outputs.language(f, tick_ns)
            log.request(f, res.frame_index)
        timings = {s: 1e3 * res.timings.get(s, 0.0) for s in STAGES}
        timings["frame"] = 1e3 * res.timings["frame"]
        timings["preprocess"] = 1e3 * (t_obs - t0)  # the builder prepares the policy input
        timings["tick"] = 1e3 * (time.perf_counter() - t0)
        timings["latency"] = 1e3 * chunk.latency_s  # measured (input -> chunk ready); with the bag clock unused
        log.per_frame.append({"frame": res.frame_index, "tick": tick, "tick_ns": tick_ns,
                              "stamp_ns": built.stamp_ns, "timings_ms": timings, "tokens": res.tokens_generated,
                              "new_requests": out.new_requests, "finished": len(res.finished),
                              "inflight": res.inflight, "decode_steps": res.decode_steps,
                              "batch_sizes": res.batch_sizes, "rejected": res.rejected,
                              "rtc_delay": chunk.delay, "first_step": chunk.start,
                              "state": built.state.tolist()})


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """``torch_threads`` as the node applies it (0: unchanged), restored afterwards."""
    before = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _config(loaded: LoadedPolicy, dt_s: float, max_frames: int | None, timing: dict[str, Any],
            joint_states_topic: str, instruction_topic: str) -> dict[str, Any]:
    """The report's ``config``: the values the run used (names as before the node parameters were adopted) and
    ``params``, every node parameter."""
    p, spec = loaded.params, loaded.policy.spec
    dev, _ = resolve_device(p.device, p.dtype)
    precision = loaded.policy.precision
    return {"mode": p.mode, "rate_hz": p.control_rate_hz, "num_steps": p.num_steps,
            "max_new_tokens": p.max_new_tokens, "k": "auto" if p.k_auto else p.k,
            "request_every": p.request_every_n_frames, "task": p.request_task, "request_prompt": p.request_prompt,
            "max_prompt_tokens": p.max_prompt_tokens, "max_inflight": p.max_inflight,
            "camera_names": list(p.camera_names),
            "camera_topics": dict(zip(p.camera_names, p.camera_topics, strict=True)),
            "joint_names": list(p.joint_names), "action_names": list(loaded.action_names),
            "delta_action_mask": list(spec.delta_mask), "joint_states_topic": joint_states_topic,
            "instruction_topic": instruction_topic, "norm_stats": p.norm_stats_path or None,
            "normalization": spec.action_norm.mode if spec.action_norm else "none", "framework": spec.framework,
            "seed": p.seed, "max_image_age_s": p.max_image_age_s, "action_rate_hz": 1.0 / dt_s,
            "max_frames": max_frames, "device": str(dev),
            "dtype": str(loaded.policy.model.dtype).removeprefix("torch."), "precision": precision.precision,
            "precision_reason": precision.reason,
            "torch_threads": torch.get_num_threads(), "timing": timing,
            "params": {f.name: list(v) if isinstance(v := getattr(p, f.name), tuple) else v
                       for f in dataclasses.fields(p) if f.name not in ("extra", "streams")},
            "language_streams": [dataclasses.asdict(s) for s in p.streams]}


def _evaluate(reader: AnyReader, loaded: LoadedPolicy, out_bag: Path, storage: str, ts: Any,
              max_frames: int | None, show: bool, topics: tuple[str, str],
              timing: tuple[ReplayTiming, dict[str, Any]]) -> tuple[RunLog, dict, dict]:
    """The run itself: (log, report sections config / model and the engine's totals, digest)."""
    p, cfg = loaded.params, loaded.policy.model.config
    runner = build_runner(loaded)  # the node's frame: request cadence, noise (seed + frame index), post-processing
    # TEST-ONLY, as in the node: the runner hook (e.g. fault injection, every frame 0.2 s slower); unset: none
    injector = install_runner_hook(runner, loaded.policy.model, logger.warning)
    try:
        dt_s = 1.0 / (p.action_rate_hz if p.action_rate_hz > 0 else runner.n_execute * p.control_rate_hz)
        feed = _BagFeed(reader, p, instruction_char_cap(p, loaded.policy), *topics)
        log = RunLog(ticks=_tick_count(reader, p.control_rate_hz, max_frames))
        with Writer(out_bag, version=9, storage_plugin=STORAGES[storage]) as writer:
            outputs = OutputBag(writer, ts)
            _run_ticks(feed, loaded, runner, outputs, log, dt_s, show, timing[0])
    finally:
        if injector is not None:
            injector.release()
        runner.close()
    sections = {"config": _config(loaded, dt_s, max_frames, timing[1], *topics),
                "model": {"name": cfg.name, "action_horizon": runner.n_execute, "action_dim": cfg.action_dim,
                          "image_size": cfg.vision.image_size, "camera_slots": list(cfg.camera_names),
                          "max_token_len": cfg.max_token_len},
                "rejected": feed.rejected.snapshot(), "engine_totals": dict(runner.engine.totals),
                "backlog": runner.engine.backlog}
    return log, sections, outputs.digest()


class PolicyCache:
    """One loaded policy kept across runs with equal node parameters, so that a fleet worker loads the model once
    and evaluates bag after bag (different parameters load anew). :meth:`close` releases it."""

    def __init__(self) -> None:
        self._params: NodeParams | None = None
        self._loaded: LoadedPolicy | None = None
        self.loads = 0

    def get(self, p: NodeParams) -> LoadedPolicy:
        """The policy for ``p``, loaded on the first call and whenever ``p`` changes."""
        if self._loaded is None or self._params != p:
            self.close()
            self._loaded = load_node_policy(p)
            self._params = p
            self.loads += 1
            for note in self._loaded.notes:
                logger.info(note)
        return self._loaded

    def close(self) -> None:
        if self._loaded is not None:
            self._loaded.release()
        self._loaded = self._params = None


def evaluate_bag(
    bag: str | Path,
    out: str | Path,
    params: Mapping[str, Any] | NodeParams,
    *,
    max_frames: int | None = None,
    storage: str | None = None,
    plots: bool = True,
    progress: bool | None = None,
    overwrite: bool = False,
    joint_states_topic: str = JOINT_STATES_TOPIC,
    instruction_topic: str = INSTRUCTION_TOPIC,
    reference: str | Path | Mapping[str, Any] | None = None,
    scoring: ScoringOptions | None = None,
    policies: PolicyCache | None = None,
    timing: ReplayTiming | None = None,
) -> dict[str, Any]:
    """Run the node's pipeline over ``bag`` on a virtual clock; write report.json, plots and ``out_bag/`` to ``out``.

    Args:
        bag: rosbag2 directory (sqlite3 or mcap).
        out: output directory (created; an existing ``out_bag`` needs ``overwrite``).
        params: the node's parameter values (a mapping, validated like the node's, e.g. a params YAML's
            ``ros__parameters``; or a :class:`~oxygen_ros.runtime.params.NodeParams`). ``control_rate_hz`` is the
            tick rate; camera topics are ``camera_topics`` or the node's default pattern (its ``/compressed``
            variant when only that is in the bag); empty ``joint_names`` take the bag's first JointState names.
        max_frames: stop after this many ticks (None: the whole bag).
        storage: output bag storage, sqlite3 | mcap (default: the input's).
        plots: write the PNGs of :data:`~oxygen_ros.evaluation.plots.PLOT_FILES`.
        progress: tqdm bar (None: only on a terminal).
        joint_states_topic, instruction_topic: the bag's topics for the joint states and the instruction.
        reference: another evaluation's report (or its path): ``requests.exact_match`` then gives, per stream, the
            share of texts equal to the reference's from the same observation (e.g. ``oxygen`` against
            ``isolated``: 1.0 when the unified engine changes no output).
        scoring: what the report's ``scores`` compare with (:class:`~oxygen_ros.evaluation.reference.ScoringOptions`;
            default: the chunks against the bag's future joint states, no language).
        policies: keep the loaded policy here across calls (a fleet worker); None: load and release it.
        timing: the run's clock (:class:`~oxygen_ros.evaluation.timing.ReplayTiming`; default: the bag's clock,
            deterministic: actions, texts and scores do not depend on the host's speed or load; the report's
            ``config.timing`` says which delay model was in force and which parameters it replaced).

    Returns:
        The report (also written to ``out/report.json``).

    Raises:
        ParamError: invalid parameters. ValueError: a bad storage, a camera topic of the wrong message type, a
            parameter contradicting the checkpoint, a reference or annotation topic that is missing or of the
            wrong type. FileExistsError: ``out/out_bag`` exists and not ``overwrite``.
    """
    # (over 60 lines with its signature and docstring; the body is one short pass)
    t_start = time.perf_counter()
    bag, out = Path(bag), Path(out)
    storage = storage or bag_storage(bag)
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {sorted(STORAGES)}, got {storage!r}")
    ts, msg_source = oxygen_typestore()
    with AnyReader([bag], default_typestore=ts) as reader:
        timing = timing or ReplayTiming()
        given = node_params(params, reader, joint_states_topic)
        p, replaced = timing.adopt(given)
        resolve_device(p.device, p.dtype)  # an unavailable device fails before anything is written
        refs = load_references(reader, scoring or ScoringOptions(), joint_states_topic)
        out_bag = prepare_out_bag(out, overwrite)
        cache = policies or PolicyCache()
        with _torch_threads(p.torch_threads):
            loaded = cache.get(p)
            try:
                scored_joints(refs, loaded.action_names)  # named joints that do not exist fail before the run
                topics = camera_topics(loaded.params, {c.topic: c.msgtype for c in reader.connections})
                run = dataclasses.replace(loaded, params=dataclasses.replace(loaded.params, camera_topics=topics))
                show = sys.stderr.isatty() if progress is None else progress
                log, s, digest = _evaluate(reader, run, out_bag, storage, ts, max_frames, show,
                                           (joint_states_topic, instruction_topic),
                                           (timing, timing.describe(p, replaced)))
            finally:
                if policies is None:
                    cache.close()
    inputs = {"bag": str(bag), "storage": storage, "checkpoint": loaded.source,
              "tokenizer": str(loaded.policy.tokenizer.model_path), "msg_definitions": msg_source}
    report = build_report(log=log, inputs=inputs, config=s["config"], model=s["model"], rejected=s["rejected"],
                          engine_totals=s["engine_totals"], backlog=s["backlog"], period=run.params.period_s,
                          digest=digest, out=str(out))
    report["scores"] = score_run(refs, log.chunks, log.requests, run.action_names,
                                 1.0 / s["config"]["action_rate_hz"], s["model"]["action_horizon"])
    if reference is not None:
        ref = reference if isinstance(reference, Mapping) else json.loads(Path(reference).read_text())
        report["requests"]["exact_match"] = exact_match(report["requests"]["items"], ref["requests"]["items"])
    if plots:
        report["outputs"]["plots"] = [path.name for path in write_plots(report, out)]
    report["wall_s"] = time.perf_counter() - t_start
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return report
