"""Offline evaluation: run the engine over a rosbag2 (sqlite3 or mcap) deterministically, without DDS.

    python -m oxygen_ros.tools.evaluate_bag /tmp/demo_bag --checkpoint /tmp/ckpt --out /tmp/eval --mode oxygen

A virtual clock steps through the bag time at ``rate_hz``. The node's own code decides what the model sees and
what is published: messages are fed in bag order up to each tick into the node's
:class:`~oxygen_ros.ros.observation_builder.InputStore` (clocked by the bag time), which validates and decodes
each on arrival (a bad one is counted and ignored; the previous valid value stays): camera images
(``sensor_msgs/Image`` or ``CompressedImage``), the instruction (``std_msgs/String``) and the joint states
(``sensor_msgs/JointState``, joints picked by name). At each tick the node's
:class:`~oxygen_ros.ros.observation_builder.ObservationBuilder` builds the observation, or skips the tick with a
reason when inputs are missing, stale (a camera header stamp more than ``max_image_age_s`` from the tick) or
invalid. Otherwise one engine frame runs, with a language request every ``request_every`` frames and flow-matching
noise drawn from a ``torch.Generator`` seeded with ``seed + frame_index``, so the action chunks and texts depend on
the bag and the arguments only (timings are measured but never feed back into the outputs, unless ``k="auto"``;
bit-exact digests also need the same device, dtype and torch thread count, which the report records).

Written into ``out``: ``report.json`` (configuration, per-frame stage timings, action frequency, language
throughput, request latencies, skipped ticks, a sha256 digest of all chunks and texts), PNG plots, and
``out_bag/``: a rosbag2 with the node's output topics, ``/oxygen/action_chunk`` (oxygen_ros/msg/ActionChunk) and
``/oxygen/language_output`` (oxygen_ros/msg/LanguageOutput), built by the node's post-processing and message
builders (:mod:`oxygen_ros.ros.publishers`), header-stamped with the originating observation time (the newest
camera stamp used) and logged at the tick that produced them.
"""

from __future__ import annotations

import argparse
import array
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import shutil
import statistics
import struct
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rosbags.highlevel import AnyReader
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import get_types_from_msg
from tqdm import tqdm

from oxygen_ros.engine.requests import FinishedRequest, FrameResult
from oxygen_ros.engine.tokenizer import CUSTOM_TASK, PromptTokenizer
from oxygen_ros.ros.diagnostics import ReasonCounter
from oxygen_ros.ros.model_loader import build_runner, load_node_policy, resolve_device
from oxygen_ros.ros.observation_builder import InputStore, ObservationBuilder, Skip
from oxygen_ros.ros.params import DEFAULT_CAMERA_TOPIC, NORMALIZATIONS, REQUEST_TASKS, NodeParams
from oxygen_ros.ros.publishers import language_output, make_action_chunk
from oxygen_ros.tools.make_demo_bag import get_ros2_typestore

__all__ = [
    "ACTION_TOPIC",
    "ACTION_TYPE",
    "EMBEDDED_MSGS",
    "LANGUAGE_TOPIC",
    "LANGUAGE_TYPE",
    "PLOT_FILES",
    "REPORT_KEYS",
    "evaluate_bag",
    "find_msg_dir",
    "main",
    "oxygen_typestore",
    "write_plots",
]

logger = logging.getLogger(__name__)

# The node's output topics as it resolves them (node name ``oxygen``, ``~/action_chunk``, ``~/language_output``).
ACTION_TOPIC = "/oxygen/action_chunk"
LANGUAGE_TOPIC = "/oxygen/language_output"
ACTION_TYPE = "oxygen_ros/msg/ActionChunk"
LANGUAGE_TYPE = "oxygen_ros/msg/LanguageOutput"
IMAGE_TYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")
STAGES = ("prefill", "language_prefill", "denoise", "decode", "manager")
PLOT_FILES = ("stage_latency.png", "action_frequency.png", "language_throughput.png", "request_latency.png")
REPORT_KEYS = ("version", "inputs", "config", "model", "ticks", "frames", "skipped", "skip_reasons",
               "skipped_frames", "rejected_inputs", "per_frame", "summary", "requests", "digest", "outputs",
               "wall_s")
_STORAGES = {"sqlite3": StoragePlugin.SQLITE3, "mcap": StoragePlugin.MCAP}

# Fallback copies of msg/*.msg (field lines must match the files; test_evaluate_bag checks).
EMBEDDED_MSGS: dict[str, str] = {
    ACTION_TYPE: """\
std_msgs/Header header
uint64 frame_index
string[] joint_names
uint32 horizon
uint32 action_dim
float32[] actions
builtin_interfaces/Duration dt
builtin_interfaces/Duration inference_latency
""",
    LANGUAGE_TYPE: """\
std_msgs/Header header
uint64 request_id
uint64 frame_index
string task
string text
uint32 num_tokens
bool eos
builtin_interfaces/Duration latency
""",
}


# ---------------------------------------------------------------------------------------------- message types
def find_msg_dir() -> Path | None:
    """The folder holding ActionChunk.msg and LanguageOutput.msg: the source tree's ``msg/``, else
    ``<prefix>/share/oxygen_ros/msg`` of an installed package (ament index, AMENT_PREFIX_PATH, sys.prefix)."""
    candidates = [Path(__file__).resolve().parents[2] / "msg"]
    try:
        from ament_index_python.packages import get_package_share_directory

        candidates.append(Path(get_package_share_directory("oxygen_ros")) / "msg")
    except Exception:  # not installed, or oxygen_ros is not in the ament index
        pass
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p] + [sys.prefix]
    candidates += [Path(p) / "share" / "oxygen_ros" / "msg" for p in prefixes]
    names = [t.rsplit("/", 1)[1] + ".msg" for t in EMBEDDED_MSGS]
    return next((c for c in candidates if all((c / n).is_file() for n in names)), None)


def oxygen_typestore() -> tuple[Any, str]:
    """A ROS 2 rosbags typestore with ActionChunk and LanguageOutput registered, and where they came from
    (a ``msg/`` folder, or ``"embedded"`` when no .msg files are found)."""
    ts = get_ros2_typestore()
    msg_dir = find_msg_dir()
    types: dict = {}
    for name, embedded in EMBEDDED_MSGS.items():
        text = (msg_dir / (name.rsplit("/", 1)[1] + ".msg")).read_text() if msg_dir else embedded
        types.update(get_types_from_msg(text, name))
    ts.register(types)
    return ts, str(msg_dir) if msg_dir else "embedded"


# ---------------------------------------------------------------------------------------------- helpers
def _bag_storage(bag: Path) -> str:
    """``sqlite3`` or ``mcap``: the input bag's storage (metadata.yaml, else file extensions)."""
    meta = bag / "metadata.yaml"
    if meta.is_file():
        m = re.search(r"storage_identifier:\s*['\"]?(\w+)", meta.read_text())
        if m and m.group(1) in _STORAGES:
            return m.group(1)
    return "mcap" if bag.is_dir() and any(bag.glob("*.mcap")) else "sqlite3"


def _percentiles(values: Sequence[float]) -> dict[str, float | int | None]:
    """count, mean, p50, p90, p99, max of ``values`` (None entries when empty)."""
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    a = np.asarray(values, dtype=np.float64)
    return {"count": int(a.size), "mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def _to_typestore(msg: Any, ts: Any) -> Any:
    """A generated ROS message (as the node publishes it) -> the same message as a rosbags typestore object, for
    the bag writer (its CDR zeroes padding bytes, so equal messages give equal bag bytes)."""
    fields = {}
    for name in msg.get_fields_and_field_types():
        value = getattr(msg, name)
        if hasattr(value, "get_fields_and_field_types"):
            value = _to_typestore(value, ts)
        elif isinstance(value, list) and value and hasattr(value[0], "get_fields_and_field_types"):
            value = [_to_typestore(v, ts) for v in value]
        elif isinstance(value, array.array):
            value = np.asarray(value)  # rosbags holds primitive sequences as numpy arrays
        fields[name] = value
    cls = type(msg)
    return ts.types[f"{cls.__module__.split('.')[0]}/msg/{cls.__name__}"](**fields)


# ---------------------------------------------------------------------------------------------- outputs
class _Outputs:
    """Writes the node's ActionChunk / LanguageOutput messages to the output bag and keeps the determinism
    digests."""

    def __init__(self, writer: Writer, ts: Any) -> None:
        self.ts, self.writer = ts, writer
        self.action_conn = writer.add_connection(ACTION_TOPIC, ACTION_TYPE, typestore=ts)
        self.language_conn = writer.add_connection(LANGUAGE_TOPIC, LANGUAGE_TYPE, typestore=ts)
        self.actions_hash, self.texts_hash = hashlib.sha256(), hashlib.sha256()
        self.num_chunks = self.num_texts = 0

    def _write(self, conn: Any, log_ns: int, msg: Any, msgtype: str) -> None:
        self.writer.write(conn, log_ns, self.ts.serialize_cdr(_to_typestore(msg, self.ts), msgtype))

    def chunk(self, frame_index: int, stamp_ns: int, log_ns: int, actions: np.ndarray, names: Sequence[str],
              dt_s: float, latency_s: float) -> None:
        """One action chunk [H, D] float32 in robot units, stamped with the observation time ``stamp_ns`` and
        logged at the tick ``log_ns`` that produced it."""
        self._write(self.action_conn, log_ns,
                    make_action_chunk(actions, stamp_ns, frame_index, names, dt_s, latency_s), ACTION_TYPE)
        horizon, dim = actions.shape
        self.actions_hash.update(struct.pack("<qqii", frame_index, stamp_ns, horizon, dim) + actions.tobytes())
        self.num_chunks += 1

    def language(self, f: FinishedRequest, now_ns: int) -> None:
        """A finished request: header stamp = originating observation time, logged at the finishing tick."""
        self._write(self.language_conn, now_ns, language_output(f), LANGUAGE_TYPE)
        self.texts_hash.update(struct.pack("<qqq?", f.request_id, f.frame_index, int(f.stamp), bool(f.eos))
                               + np.asarray(f.tokens, dtype=np.int64).tobytes() + (f.text or "").encode() + b"\0")
        self.num_texts += 1

    def digest(self) -> dict[str, Any]:
        a, t = self.actions_hash.hexdigest(), self.texts_hash.hexdigest()
        return {"sha256": hashlib.sha256(f"{a}:{t}".encode()).hexdigest(), "actions_sha256": a,
                "texts_sha256": t, "num_chunks": self.num_chunks, "num_texts": self.num_texts}


# ---------------------------------------------------------------------------------------------- evaluation
def evaluate_bag(
    bag: str | Path,
    checkpoint: str | Path,
    out: str | Path,
    *,
    tokenizer: str | Path | None = None,
    mode: str = "oxygen",
    rate_hz: float = 10.0,
    num_steps: int = 10,
    max_new_tokens: int = 30,
    k: int | str = 5,
    request_every: int = 1,
    task: str = "memory",
    request_prompt: str = "",
    max_prompt_tokens: int = 16,
    max_inflight: int = 32,
    camera_topics: Sequence[str] | None = None,
    camera_names: Sequence[str] | None = None,
    joint_names: Sequence[str] | None = None,
    action_names: Sequence[str] | None = None,
    delta_action_mask: Sequence[bool] = (),
    joint_states_topic: str = "/joint_states",
    instruction_topic: str = "/instruction",
    instruction: str = "",
    norm_stats: str | Path | None = None,
    normalization: str = "auto",
    asset_id: str = "",
    openpi_config: str = "",
    seed: int = 0,
    max_image_age_s: float = 0.5,
    max_image_pixels: int = 4096 * 4096,
    max_instruction_chars: int = 1000,
    action_rate_hz: float = 0.0,
    max_frames: int | None = None,
    device: str = "auto",
    dtype: str = "auto",
    storage: str | None = None,
    plots: bool = True,
    progress: bool | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run the engine over ``bag`` on a virtual clock and write report.json, plots and ``out_bag/`` into ``out``.

    Args:
        bag: rosbag2 directory (sqlite3 or mcap).
        checkpoint: directory with model.safetensors (+ config.json); its tokenizer is used unless ``tokenizer``.
        out: output directory (created; an existing ``out_bag`` needs ``overwrite``).
        mode: engine mode, oxygen | isolated | shared_kv (| parallel).
        rate_hz: control frames per second of bag time.
        num_steps, max_new_tokens, k: S, N and the per-frame decode budget (``"auto"`` makes outputs timing
            dependent).
        request_every: a language request every n-th processed frame (0: no language).
        task, request_prompt: language task (memory | narration | subtask | custom) and a prompt template fed
            after the shared prefix (``{instruction}`` is replaced; '' uses the task's built-in prompt, required
            for custom).
        camera_names: model camera slots fed from the bag (default: all the model's slots); slots not listed are
            masked out. camera_topics: one topic per camera name (default ``/cameras/<name>/image_raw``, or its
            ``/compressed`` variant when only that is in the bag).
        joint_names: state joints in model order (default: the names of the bag's first JointState).
        action_names: names of the published action dims (default: joint_names); their number is the published
            action dim (model actions cut or zero-padded to it).
        delta_action_mask: per action dim, true = the model predicts a delta added to the current state.
        norm_stats: an openpi-format norm_stats.json replacing the checkpoint's (openpi / ours); default: what the
            checkpoint holds (LeRobot processor files, openpi ``assets/<asset_id>/``, our ``norm_stats.json``).
        normalization, asset_id, openpi_config: as the node's parameters of the same names.
        max_image_age_s: a camera whose newest valid image is older than this at a tick skips the tick.
        action_rate_hz: ActionChunk.dt = 1 / rate; 0 means horizon * rate_hz.
        max_frames: stop after this many ticks (None: the whole bag).
        device, dtype: ``auto`` picks cuda (bfloat16) when available, else cpu (float32).
        storage: output bag storage (default: the input's).
        progress: tqdm bar (None: only on a terminal).

    Returns:
        The report (also written to ``out/report.json``).

    Raises:
        ValueError: invalid arguments, or a configured camera topic of the wrong message type.
        FileExistsError: ``out/out_bag`` exists and ``overwrite`` is false.
    """
    t_start = time.perf_counter()
    bag, checkpoint, out = Path(bag), Path(checkpoint), Path(out)
    if mode not in ("oxygen", "isolated", "shared_kv", "parallel"):
        raise ValueError(f"mode must be oxygen, isolated, shared_kv or parallel, got {mode!r}")
    if not rate_hz > 0 or not max_image_age_s > 0 or request_every < 0:
        raise ValueError("rate_hz and max_image_age_s must be > 0 and request_every >= 0")
    if task not in REQUEST_TASKS:
        raise ValueError(f"task must be one of {list(REQUEST_TASKS)}, got {task!r}")
    if task == CUSTOM_TASK and not request_prompt:
        raise ValueError("request_prompt is required for task 'custom'")
    if request_prompt:
        request_prompt.format(instruction="")  # malformed templates fail here, with str.format's message
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    storage = storage or _bag_storage(bag)
    if storage not in _STORAGES:
        raise ValueError(f"storage must be one of {sorted(_STORAGES)}, got {storage!r}")
    dev, torch_dtype = resolve_device(device, dtype)
    out_bag = out / "out_bag"
    if out_bag.exists():
        if not overwrite:
            raise FileExistsError(f"{out_bag} exists (pass overwrite=True / --overwrite)")
        if not (out_bag / "metadata.yaml").exists():
            raise FileExistsError(f"{out_bag} exists and is not a rosbag2 directory; not removing it")
        shutil.rmtree(out_bag)
    out.mkdir(parents=True, exist_ok=True)

    # --- the policy (checkpoint + its I/O contract), loaded and checked as the node loads it
    p = NodeParams(
        checkpoint_path=str(checkpoint), tokenizer_path=str(tokenizer or ""), norm_stats_path=str(norm_stats or ""),
        normalization=normalization, asset_id=asset_id, openpi_config=openpi_config, device=device, dtype=dtype,
        seed=seed, mode=mode, num_steps=num_steps,
        max_new_tokens=max_new_tokens, k=NodeParams.k if k == "auto" else k, k_auto=k == "auto",
        request_every_n_frames=request_every, request_task=task, request_prompt=request_prompt,
        max_prompt_tokens=max_prompt_tokens, max_inflight=max_inflight, camera_names=tuple(camera_names or ()),
        max_image_age_s=max_image_age_s, max_image_pixels=max_image_pixels, action_names=tuple(action_names or ()),
        delta_action_mask=tuple(bool(d) for d in delta_action_mask), instruction=instruction,
        max_instruction_chars=max_instruction_chars, control_rate_hz=rate_hz, action_rate_hz=action_rate_hz)
    ts, msg_source = oxygen_typestore()
    with AnyReader([bag], default_typestore=ts) as reader:
        if joint_names is None:
            joint_names = _first_joint_names(reader, joint_states_topic)
        p = dataclasses.replace(p, joint_names=tuple(joint_names))
        loaded = load_node_policy(p)
        for note in loaded.notes:
            logger.info(note)
        p, policy = loaded.params, loaded.policy
        cfg, tok = policy.model.config, policy.tokenizer
        if camera_topics and len(camera_topics) != len(p.camera_names):
            raise ValueError(f"{len(camera_topics)} camera_topics for {len(p.camera_names)} camera_names")
        robot_names = list(loaded.action_names)

        # the node's input handling, clocked by the bag: each message is validated and decoded as it is fed
        bag_now = [reader.start_time]  # log time of the message being fed

        def bag_clock() -> float:
            return bag_now[0] / 1e9

        rejected = ReasonCounter(logger.debug, "rejected input", clock=bag_clock)
        store = InputStore(p.camera_names, p.joint_names, rejected, p.max_image_pixels, p.max_instruction_chars,
                           p.instruction, clock=bag_clock)
        builder = ObservationBuilder(store, policy, p.max_image_age_s)

        bag_topics = {c.topic: c.msgtype for c in reader.connections}
        topics: list[str] = []
        for i, name in enumerate(p.camera_names):
            topic = camera_topics[i] if camera_topics else DEFAULT_CAMERA_TOPIC.format(name=name)
            if not camera_topics and topic not in bag_topics and topic + "/compressed" in bag_topics:
                topic += "/compressed"
            if topic in bag_topics and bag_topics[topic] not in IMAGE_TYPES:
                raise ValueError(f"camera topic {topic} has type {bag_topics[topic]}, expected one of {IMAGE_TYPES}")
            topics.append(topic)
        missing_topics = sorted(t for t in topics if t not in bag_topics)
        if missing_topics:
            logger.warning("camera topics not in the bag (every frame will be skipped): %s", missing_topics)
        p = dataclasses.replace(p, camera_topics=tuple(topics))
        camera_index = {t: i for i, t in enumerate(p.camera_topics)}

        def feed(topic: str, msgtype: str, raw: bytes) -> None:
            try:
                msg = reader.deserialize(raw, msgtype)
            except Exception as e:  # a corrupt payload must not end the evaluation
                rejected.add("deserialize_error", f"{topic}: {e}")
                return
            if topic in camera_index:
                on_image = store.on_compressed if msgtype == IMAGE_TYPES[1] else store.on_image
                on_image(camera_index[topic], msg)
            elif topic == joint_states_topic:
                store.on_joint_state(msg)
            elif topic == instruction_topic:
                store.on_instruction(msg)

        runner = build_runner(loaded)  # the node's frame: request cadence, noise (seed + frame index), post-processing
        dt_s = 1.0 / (action_rate_hz if action_rate_hz > 0 else runner.n_execute * rate_hz)
        start_ns, last_ns = reader.start_time, reader.end_time - 1  # rosbags' end_time is exclusive
        n_ticks = math.floor((last_ns - start_ns) * rate_hz / 1e9 + 1e-9) + 1 if reader.message_count else 0
        if max_frames is not None:
            n_ticks = min(n_ticks, max_frames)
        wanted = {*topics, joint_states_topic, instruction_topic}
        conns = [c for c in reader.connections if c.topic in wanted]
        messages = iter(reader.messages(connections=conns)) if conns else iter(())
        pending = next(messages, None)

        per_frame: list[dict[str, Any]] = []
        skipped: list[dict[str, Any]] = []
        requests: list[dict[str, Any]] = []
        issued = 0
        show = sys.stderr.isatty() if progress is None else progress
        with Writer(out_bag, version=9, storage_plugin=_STORAGES[storage]) as writer:
            outputs = _Outputs(writer, ts)
            for tick in tqdm(range(n_ticks), desc=f"evaluating {bag.name} ({mode})", unit="frame", disable=not show):
                tick_ns = start_ns + round(tick * 1e9 / rate_hz)
                while pending is not None and pending[1] <= tick_ns:
                    conn, bag_now[0], raw = pending
                    feed(conn.topic, conn.msgtype, raw)
                    pending = next(messages, None)
                t0 = time.perf_counter()
                built = builder.build(tick_ns)
                t_obs = time.perf_counter()
                if isinstance(built, Skip):
                    skipped.append({"tick": tick, "tick_ns": tick_ns, "reason": built.reason, "detail": built.detail})
                    continue
                if built.prompt_truncated:
                    rejected.add("prompt_truncated", "instruction + state exceed the model's max_token_len")
                out_frame = runner.step(built.prepared, stamp_ns=built.stamp_ns, instruction=built.instruction)
                res: FrameResult = out_frame.result
                frame_index, chunk = res.frame_index, out_frame.chunk
                issued += out_frame.new_requests
                outputs.chunk(frame_index, built.stamp_ns, tick_ns, chunk.actions, robot_names, dt_s,
                              chunk.latency_s)
                for f in res.finished:
                    if not f.dropped:
                        outputs.language(f, tick_ns)
                    requests.append({"request_id": f.request_id, "task": f.task, "frame_index": f.frame_index,
                                     "stamp_ns": int(f.stamp), "finished_frame": frame_index,
                                     "latency_s": f.latency_s, "latency_frames": f.frames,
                                     "num_tokens": len(f.tokens), "eos": f.eos, "dropped": f.dropped,
                                     "text": f.text or ""})
                timings = {s: 1e3 * res.timings.get(s, 0.0) for s in STAGES}
                timings["frame"] = 1e3 * res.timings["frame"]
                timings["preprocess"] = 1e3 * (t_obs - t0)  # the builder prepares the policy input
                timings["tick"] = 1e3 * (time.perf_counter() - t0)
                per_frame.append({"frame": frame_index, "tick": tick, "tick_ns": tick_ns, "stamp_ns": built.stamp_ns,
                                  "timings_ms": timings, "tokens": res.tokens_generated,
                                  "new_requests": out_frame.new_requests,
                                  "finished": len(res.finished), "inflight": res.inflight,
                                  "decode_steps": res.decode_steps, "batch_sizes": res.batch_sizes,
                                  "rejected": res.rejected, "state": built.state.tolist()})
    runner.close()

    report = _report(
        bag=bag, storage=storage, checkpoint=checkpoint, tok=tok, msg_source=msg_source, out=out, cfg=cfg,
        engine=runner.engine, horizon=runner.n_execute, per_frame=per_frame, skipped=skipped,
        rejected=rejected.snapshot(), requests=requests, issued=issued, n_ticks=n_ticks, period=p.period_s,
        digest=outputs.digest(),
        config={"mode": mode, "rate_hz": rate_hz, "num_steps": num_steps, "max_new_tokens": max_new_tokens, "k": k,
                "request_every": request_every, "task": task, "request_prompt": request_prompt,
                "max_prompt_tokens": max_prompt_tokens, "max_inflight": max_inflight,
                "camera_names": list(p.camera_names), "camera_topics": dict(zip(p.camera_names, topics, strict=True)),
                "joint_names": list(p.joint_names), "action_names": robot_names,
                "delta_action_mask": list(policy.spec.delta_mask), "joint_states_topic": joint_states_topic,
                "instruction_topic": instruction_topic, "norm_stats": str(norm_stats) if norm_stats else None,
                "normalization": policy.spec.action_norm.mode if policy.spec.action_norm else "none",
                "framework": policy.spec.framework, "seed": seed,
                "max_image_age_s": max_image_age_s, "action_rate_hz": 1.0 / dt_s, "max_frames": max_frames,
                "device": str(dev), "dtype": str(torch_dtype).removeprefix("torch."),
                "torch_threads": torch.get_num_threads()},
    )
    if plots:
        report["outputs"]["plots"] = [p.name for p in write_plots(report, out)]
    report["wall_s"] = time.perf_counter() - t_start
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return report


def _first_message(reader: AnyReader, topic: str) -> Any:
    """The first message on ``topic`` (deserialised), or None."""
    conns = [c for c in reader.connections if c.topic == topic]
    for conn, _, raw in reader.messages(connections=conns) if conns else ():
        return reader.deserialize(raw, conn.msgtype)
    return None


def _first_joint_names(reader: AnyReader, topic: str) -> list[str]:
    """Joint names of the first JointState on ``topic`` (empty when there is none)."""
    msg = _first_message(reader, topic)
    if msg is None:
        logger.warning("no %s in the bag and no joint_names given: every frame will be skipped", topic)
        return []
    return list(msg.name)


def _report(*, bag: Path, storage: str, checkpoint: Path, tok: PromptTokenizer, msg_source: str, out: Path, cfg: Any,
            engine: Any, horizon: int, per_frame: list[dict], skipped: list[dict], rejected: Mapping[str, int],
            requests: list[dict], issued: int, n_ticks: int, period: float, digest: dict,
            config: dict) -> dict[str, Any]:
    """Assemble the JSON report from the per-frame records."""
    frame_s = [f["timings_ms"]["frame"] / 1e3 for f in per_frame]
    total_s = sum(frame_s)
    tokens = sum(f["tokens"] for f in per_frame)
    lat = [r["latency_s"] for r in requests if not r["dropped"]]
    lat_frames = [r["latency_frames"] for r in requests if not r["dropped"]]
    summary = {
        "action_hz": horizon * len(per_frame) / total_s if total_s > 0 else None,
        "action_hz_end_to_end": (horizon * len(per_frame) / sum(f["timings_ms"]["tick"] / 1e3 for f in per_frame)
                                 if per_frame else None),
        "control_rate_hz": 1.0 / period,
        "frame_ms": _percentiles([1e3 * s for s in frame_s]),
        "stage_ms_mean": {s: statistics.fmean(f["timings_ms"][s] for f in per_frame) if per_frame else None
                          for s in (*STAGES, "preprocess", "frame", "tick")},
        "deadline_misses": sum(s > period for s in frame_s),
        "tokens_total": tokens,
        "tokens_per_s": tokens / total_s if total_s > 0 else None,
        "decode_steps_per_frame": statistics.fmean(f["decode_steps"] for f in per_frame) if per_frame else None,
    }
    reasons = Counter(s["reason"] for s in skipped)
    return {
        "version": 1,
        "inputs": {"bag": str(bag), "storage": storage, "checkpoint": str(checkpoint),
                   "tokenizer": str(tok.model_path), "msg_definitions": msg_source},
        "config": config,
        "model": {"name": cfg.name, "action_horizon": horizon, "action_dim": cfg.action_dim,
                  "image_size": cfg.vision.image_size, "camera_slots": list(cfg.camera_names),
                  "max_token_len": cfg.max_token_len},
        "ticks": n_ticks,
        "frames": len(per_frame),
        "skipped": len(skipped),
        "skip_reasons": dict(sorted(reasons.items())),
        "skipped_frames": skipped,
        "rejected_inputs": dict(sorted(rejected.items())),
        "per_frame": per_frame,
        "summary": summary,
        "requests": {"issued": issued, "finished": sum(not r["dropped"] for r in requests),
                     "eos": sum(bool(r["eos"]) for r in requests if not r["dropped"]),
                     "rejected": engine.totals["rejected"], "dropped": engine.totals["dropped"],
                     "unfinished": engine.backlog, "latency_s": _percentiles(lat),
                     "latency_frames": _percentiles(lat_frames), "items": requests},
        "digest": digest,
        "outputs": {"dir": str(out), "report": "report.json", "bag": "out_bag", "action_topic": ACTION_TOPIC,
                    "language_topic": LANGUAGE_TOPIC, "plots": []},
        "wall_s": None,
    }


# ---------------------------------------------------------------------------------------------- plots
def write_plots(report: dict[str, Any], out: str | Path) -> list[Path]:
    """The four PNGs of :data:`PLOT_FILES` from a report (placeholders when no frame ran)."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state
    from matplotlib.ticker import MaxNLocator

    out = Path(out)
    frames = report["per_frame"]
    x = [f["frame"] for f in frames]
    cfg = report["config"]
    title = f"{report['model']['name']} {cfg['mode']} k={cfg['k']} N={cfg['max_new_tokens']} S={cfg['num_steps']}"
    period_ms = 1e3 / cfg["rate_hz"]
    paths = []

    def save(fig: Figure, name: str) -> None:
        for ax in fig.axes:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        paths.append(out / name)
        fig.savefig(paths[-1], dpi=100)

    def empty(ax: Any) -> bool:
        if not frames:
            ax.text(0.5, 0.5, "no frames processed", ha="center", va="center", transform=ax.transAxes)
        return not frames

    fig = Figure(figsize=(9, 4.5))
    ax = fig.add_subplot()
    if not empty(ax):
        stages = ("preprocess", *STAGES)
        colors = ("tab:gray", "tab:blue", "tab:cyan", "tab:red", "tab:green", "black")
        bottom = np.zeros(len(frames))
        for stage, color in zip(stages, colors, strict=True):
            vals = np.array([f["timings_ms"][stage] for f in frames])
            if vals.any():
                ax.bar(x, vals, bottom=bottom, width=1.0, label=stage, color=color)
                bottom += vals
        ax.plot(x, [f["timings_ms"]["tick"] for f in frames], "k.", ms=3, label="tick total")
        ax.axhline(period_ms, color="tab:red", ls="--", lw=1, label="control period")
        ax.legend(fontsize=8, ncol=4, loc="upper right")
    ax.set_xlabel("frame")
    ax.set_ylabel("ms")
    ax.set_title(f"Stage latency per frame: {title}")
    save(fig, PLOT_FILES[0])

    fig = Figure(figsize=(9, 5))
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    if not empty(ax1):
        frame_ms = np.array([f["timings_ms"]["frame"] for f in frames])
        h = report["model"]["action_horizon"]
        ax1.plot(x, frame_ms, ".-", lw=1, label="engine frame")
        ax1.axhline(period_ms, color="tab:red", ls="--", lw=1, label="control period")
        ax1.legend(fontsize=8)
        ax2.plot(x, 1e3 * h / frame_ms, ".-", lw=1, label="H / frame time")
        ax2.plot(x, 1e3 * h * np.arange(1, len(frames) + 1) / np.cumsum(frame_ms), lw=2, label="cumulative")
        ax2.legend(fontsize=8)
    ax1.set_ylabel("frame time (ms)")
    ax2.set_ylabel("action frequency (Hz)")
    ax2.set_xlabel("frame")
    ax1.set_title(f"Action frequency: {title}")
    save(fig, PLOT_FILES[1])

    fig = Figure(figsize=(9, 4.5))
    ax = fig.add_subplot()
    if not empty(ax):
        tok_s = [1e3 * f["tokens"] / f["timings_ms"]["frame"] for f in frames]
        ax.bar(x, tok_s, width=1.0, color="tab:green", label="tokens/s (frame)")
        ax.set_ylabel("tokens / s")
        ax_b = ax.twinx()
        ax_b.plot(x, [f["inflight"] for f in frames], "k-", lw=1, label="in-flight requests")
        ax_b.set_ylabel("in-flight requests")
        ax.legend(loc="upper left", fontsize=8)
        ax_b.legend(loc="upper right", fontsize=8)
    ax.set_xlabel("frame")
    ax.set_title(f"Language throughput: {title}")
    save(fig, PLOT_FILES[2])

    fig = Figure(figsize=(9, 4))
    ax1, ax2 = fig.subplots(1, 2)
    items = [r for r in report["requests"]["items"] if not r["dropped"]]
    if not items:
        for ax in (ax1, ax2):
            ax.text(0.5, 0.5, "no finished requests", ha="center", va="center", transform=ax.transAxes)
    else:
        ax1.hist([1e3 * r["latency_s"] for r in items], bins=20, color="tab:purple")
        frames_lat = [r["latency_frames"] for r in items]
        ax2.hist(frames_lat, bins=np.arange(0.5, max(frames_lat) + 1.5), color="tab:orange")
    ax1.set_xlabel("request latency (ms, wall)")
    ax2.set_xlabel("request latency (frames)")
    ax1.set_ylabel("requests")
    fig.suptitle(f"Request latency: {title}")
    save(fig, PLOT_FILES[3])
    return paths


# ---------------------------------------------------------------------------------------------- CLI
def _k(value: str) -> int | str:
    return value if value == "auto" else int(value)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bag", type=Path, help="rosbag2 directory (sqlite3 or mcap)")
    p.add_argument("--checkpoint", type=Path, required=True, help="checkpoint directory (model.safetensors)")
    p.add_argument("--tokenizer", type=Path, help="SentencePiece model or directory (default: the checkpoint's)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--mode", choices=["oxygen", "isolated", "shared_kv", "parallel"], default="oxygen")
    p.add_argument("--rate-hz", type=float, default=10.0, help="control frames per second of bag time")
    p.add_argument("--num-steps", type=int, default=10, help="S: denoise steps")
    p.add_argument("--max-new-tokens", type=int, default=30, help="N: tokens per language request")
    p.add_argument("--k", type=_k, default=5, help="per-frame decode budget (oxygen), or 'auto'")
    p.add_argument("--request-every", type=int, default=1, help="a language request every n frames (0: none)")
    p.add_argument("--task", choices=REQUEST_TASKS, default="memory")
    p.add_argument("--request-prompt", default="", help="prompt for --task custom ({instruction} replaced)")
    p.add_argument("--max-inflight", type=int, default=32)
    p.add_argument("--camera-topics", nargs="+", help="one image topic per camera name")
    p.add_argument("--camera-names", nargs="+", help="model camera slots to feed (default: all)")
    p.add_argument("--joint-names", nargs="+", help="state joints in model order (default: the bag's)")
    p.add_argument("--action-names", nargs="+", help="published action dims (default: the joint names)")
    p.add_argument("--delta-action-mask", nargs="+", type=int, choices=[0, 1], default=[],
                   help="per action dim, 1 = delta added to the state")
    p.add_argument("--joint-states-topic", default="/joint_states")
    p.add_argument("--instruction-topic", default="/instruction")
    p.add_argument("--instruction", default="", help="instruction used until one is in the bag")
    p.add_argument("--norm-stats", type=Path, help="openpi-format norm_stats.json replacing the checkpoint's")
    p.add_argument("--normalization", choices=NORMALIZATIONS, default="auto")
    p.add_argument("--asset-id", default="", help="openpi: assets/<asset_id> to use")
    p.add_argument("--openpi-config", default="", help="openpi: pi05_libero | pi05_droid | pi05_aloha | generic")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-image-age", type=float, default=0.5, help="seconds; older cameras skip the frame")
    p.add_argument("--action-rate-hz", type=float, default=0.0, help="ActionChunk.dt = 1/rate (0: H * rate)")
    p.add_argument("--max-frames", type=int, help="evaluate at most this many ticks")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--storage", choices=sorted(_STORAGES), help="output bag storage (default: the input's)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--overwrite", action="store_true", help="replace an existing out_bag")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    report = evaluate_bag(
        args.bag, args.checkpoint, args.out, tokenizer=args.tokenizer, mode=args.mode, rate_hz=args.rate_hz,
        num_steps=args.num_steps, max_new_tokens=args.max_new_tokens, k=args.k, request_every=args.request_every,
        task=args.task, request_prompt=args.request_prompt, max_inflight=args.max_inflight,
        camera_topics=args.camera_topics, camera_names=args.camera_names, joint_names=args.joint_names,
        action_names=args.action_names, delta_action_mask=[bool(d) for d in args.delta_action_mask],
        joint_states_topic=args.joint_states_topic, instruction_topic=args.instruction_topic,
        instruction=args.instruction, norm_stats=args.norm_stats, normalization=args.normalization,
        asset_id=args.asset_id, openpi_config=args.openpi_config, seed=args.seed,
        max_image_age_s=args.max_image_age, action_rate_hz=args.action_rate_hz, max_frames=args.max_frames,
        device=args.device, dtype=args.dtype, storage=args.storage, plots=not args.no_plots,
        progress=False if args.no_progress else None, overwrite=args.overwrite,
    )
    s, r = report["summary"], report["requests"]

    def fmt(v: float | None, spec: str) -> str:
        return "n/a" if v is None else format(v, spec)

    print(f"{report['frames']}/{report['ticks']} frames ({report['skipped']} skipped {report['skip_reasons']}), "
          f"action {fmt(s['action_hz'], '.1f')} Hz, {fmt(s['tokens_per_s'], '.1f')} tokens/s, "
          f"{r['finished']} language outputs (p50 {fmt(r['latency_frames']['p50'], '.0f')} frames)")
    print(f"digest {report['digest']['sha256']}")
    print(f"wrote {args.out / 'report.json'}, {len(report['outputs']['plots'])} plots, {args.out / 'out_bag'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
