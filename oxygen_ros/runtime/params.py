"""The node's parameters, each declared once: a field of :class:`NodeParams` with its type, default, help and
simple validation (``param(..., choices=, minimum=, positive=)``); :data:`PARAMS` (what the node declares,
docs/parameters.md) and :func:`validate` are derived from those fields. Cross-parameter rules live in :func:`validate`.

Parameters are declared with ``dynamic_typing`` so a wrongly typed override (``control_rate_hz: 10`` instead of
``10.0``, a string for a number) never stops the node from starting; :func:`validate` checks every value at
configure time and reports all problems at once, each naming the parameter. Nothing here needs a running ROS
graph: :func:`validate` takes a plain mapping (a YAML file's ``ros__parameters``, say).
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oxygen_ros.engine.rtc import GUIDANCES as RTC_GUIDANCES
from oxygen_ros.engine.rtc import SCHEDULES as RTC_SCHEDULES
from oxygen_ros.engine.tokenizer import CUSTOM_TASK
from oxygen_ros.params import MISSING, ParamError, ParamSpec, lookup, param, read_specs, robot_param, specs_of
from oxygen_ros.params import markdown_table as _table
from oxygen_ros.policy.options import NORMALIZATIONS, REQUEST_TASKS, StreamParams, shared
from oxygen_ros.robot.limits import LIMIT_FIELDS, LIMIT_POLICIES, joint_limit_names
from oxygen_ros.robot.limits import parse_limit_parameters as _joint_limits

__all__ = [
    "DEFAULT_CAMERA_TOPIC",
    "LIMIT_FIELDS",
    "NORMALIZATIONS",
    "PARAMS",
    "PARAM_GROUPS",
    "PARAM_NAMES",
    "RESERVED_STREAM_NAMES",
    "STREAM_NAME_RE",
    "STREAM_PARAMS",
    "NodeParams",
    "ParamError",
    "ParamSpec",
    "StreamParams",
    "joint_limit_names",
    "markdown_table",
    "stream_param_names",
    "validate",
]

EMBEDDED_MODELS = ("toy", "random_tiny")
RELIABILITIES = ("best_effort", "reliable")
DEFAULT_CAMERA_TOPIC = "/cameras/{name}/image_raw"
_DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
STREAM_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class NodeParams:
    """Validated parameter values. Each field is one node parameter (see :func:`param`)."""

    # --- lifecycle and model
    autostart: bool = robot_param('autostart')
    model: str = param('',
        "'' to load checkpoint_path; 'toy': the package's default model (pi0.5 trained on the tabletop world,"
        " see oxygen_ros.toy.sim); or 'random_tiny': generate a tiny random pi0.5 and tokenizer into a "
        'temporary directory (demos, tests).')
    checkpoint_path: str = shared('checkpoint_path')
    tokenizer_path: str = shared('tokenizer_path')
    asset_id: str = shared('asset_id')
    openpi_config: str = shared('openpi_config')
    norm_stats_path: str = shared('norm_stats_path')
    normalization: str = shared('normalization')
    device: str = shared('device')
    dtype: str = shared('dtype')
    torch_threads: int = shared('torch_threads')
    seed: int = shared('seed')
    # --- engine
    mode: str = shared('mode')
    num_steps: int = shared('num_steps')
    action_horizon: int = param(0,
        'H: the checkpoint decides the chunk length; 0 accepts it, any other value must equal it (a check, '
        'never an override).', minimum=0)
    actions_per_chunk: int = shared('actions_per_chunk')
    max_new_tokens: int = shared('max_new_tokens')
    k: int = shared('k')
    k_auto: bool = param(False,
        'Pick k every frame so the frame fits the control period (deadline = 1 / control_rate_hz).')
    language_streams: tuple[str, ...] = shared('language_streams')
    request_every_n_frames: int = shared('request_every_n_frames')
    request_task: str = shared('request_task')
    request_prompt: str = shared('request_prompt')
    max_prompt_tokens: int = shared('max_prompt_tokens')
    max_inflight: int = shared('max_inflight')
    subtask_conditioning: str = shared('subtask_conditioning')
    speculate: int = shared('speculate')
    overflow: str = shared('overflow')
    graphs: str = shared('graphs')
    compile_cache_dir: str = shared('compile_cache_dir')
    kernels: str = shared('kernels')
    prefill_layout: str = shared('prefill_layout')
    # --- inputs
    camera_names: tuple[str, ...] = param((),
        'Model camera slots fed by camera_topics (e.g. base_0_rgb, left_wrist_0_rgb; LeRobot: the part after '
        'observation.images.); [] = the cameras the checkpoint expects, in its order. Slots not listed are '
        'masked out.')
    camera_topics: tuple[str, ...] = param((),
        'One image topic per camera (camera_names, or the checkpoint\'s cameras when that is empty); [] = '
        '/cameras/<name>/image_raw (+ /compressed for compressed cameras).')
    camera_compressed: tuple[bool, ...] = param((),
        'Per camera: subscribe sensor_msgs/CompressedImage instead of Image; [] = all raw.')
    camera_reliability: str = param('best_effort',
        'Camera QoS reliability: best_effort (sensor data) | reliable. History is KEEP_LAST depth 1.',
        choices=RELIABILITIES)
    max_image_age_s: float = param(0.5,
        "Skip the frame when a camera's newest image is older than this (node clock). Images stamped more "
        'than 0.1 s ahead of the node clock are rejected (image_from_future).', positive=True)
    max_camera_skew_s: float = param(0.1,
        "Images of one observation lie within this many seconds of each other: chosen from each camera's last "
        '4 images as an approximate-time synchroniser does (smallest spread, then newest); no such set skips '
        'the frame (camera_skew). 0 = equal stamps (hardware-triggered cameras); negative = no synchronisation '
        "(each camera's newest image).")
    max_image_pixels: int = param(4096 * 4096, 'Reject images with more pixels than this.', minimum=1)
    joint_names: tuple[str, ...] = param((), 'Joints read from /joint_states, in model state order (required).')
    max_joint_age_s: float = robot_param('max_joint_age_s')
    action_names: tuple[str, ...] = robot_param('action_names')
    delta_action_mask: tuple[bool, ...] = param((),
        "Per action dim: true = the model predicts a delta added to the state; [] = the checkpoint's rule "
        "(LeRobot relative actions, openpi's data config). Only for checkpoints that define none.")
    instruction: str = param('', "Instruction used until one arrives on /instruction ('' = wait).")
    max_instruction_chars: int = param(0,
        "Longer instructions are cut on arrival (counted, warned); 0 = 8 x the model's max_token_len, more "
        "than any text that fits its prompt. A frame whose prompt would overflow cuts the instruction at a token "
        'boundary so that the state fits (counted and warned once per instruction).', minimum=0)
    # --- timing and outputs
    control_rate_hz: float = param(10.0, 'Control frames per second (one engine step per frame).', positive=True)
    action_rate_hz: float = robot_param('action_rate_hz')
    language_topic_per_stream: bool = param(False,
        'Also publish each stream\'s outputs on ~/language/<stream> (besides ~/language_output).')
    publish_trajectory: bool = param(False,
        'Also publish each chunk as trajectory_msgs/JointTrajectory on ~/trajectory (remap to '
        '/<controller>/joint_trajectory).')
    # --- questions: the ~/ask action (oxygen_ros/action/Ask), answered like a language stream named "ask"
    ask_enabled: bool = param(True,
        'Serve the ~/ask action: a question answered from the current observation, decoded batched with the '
        'language streams; feedback every frame, the answer also on ~/language_output (stream ask).',
        ros_name='ask.enabled')
    ask_max_new_tokens: int = shared('ask_max_new_tokens')
    ask_max_pending: int = param(4,
        'Goals in progress (queued or decoding) at most; more are rejected. An answer needs a free KV slot '
        '(max_inflight) when its frame comes, else it is aborted (pool full).', minimum=1,
        ros_name='ask.max_pending')
    ask_max_question_chars: int = shared('ask_max_question_chars')
    ask_max_prompt_tokens: int = shared('ask_max_prompt_tokens')
    ask_priority: int = shared('ask_priority')
    # --- tasks: the ~/run action (oxygen_ros/action/RunTask, docs/tasks.md)
    run_enabled: bool = param(True,
        'Serve the ~/run action: a task (instruction, success rule, time-out, end behaviour) with feedback every '
        'frame, cancel and preemption.', ros_name='run.enabled')
    run_may_enable: bool = param(False,
        'A ~/run goal may open a gate that is disabled (start_enabled false, or ~/enable false) as ~/enable true '
        'would; false: such a goal is refused until an operator calls ~/enable. ~/halt is never overridden.',
        ros_name='run.may_enable')
    run_stall_s: float = param(3.0,
        'A running ~/run goal is aborted (stale inputs) when no control frame has run for this long (every frame '
        'skipped: stale cameras or joints, ...); 0 = never.', minimum=0.0, ros_name='run.stall_s')
    # --- real-time chunking (oxygen_ros/engine/rtc.py): each chunk continues the one the robot is executing
    rtc_enabled: bool = param(False,
        "Guide each chunk's denoise toward the remainder of the last published chunk (Black et al. 2025): the "
        'actions that execute while it is computed are frozen to it, the next ones pulled toward it; the whole '
        'chunk is published (it lasts until the next one replaces it), from its first action not already '
        'committed.', ros_name='rtc.enabled')
    rtc_guidance: str = param('identity',
        "identity (LeRobot's: the correction is the weighted error, no backward pass) | vjp (the paper's: a "
        'vector-Jacobian product through the action expert; several times the denoise cost).',
        choices=RTC_GUIDANCES, ros_name='rtc.guidance')
    rtc_schedule: str = param('',
        "Prefix weights past the delay: zeros | ones | linear | exp; '' = the checkpoint's (LeRobot rtc_config), "
        "else exp (the paper's).", choices=('', *RTC_SCHEDULES), ros_name='rtc.schedule')
    rtc_max_guidance_weight: float = param(0.0,
        "Clamp of the guidance weight (beta); 0 = the checkpoint's (LeRobot rtc_config), else 5 (the paper's).",
        minimum=0.0, ros_name='rtc.max_guidance_weight')
    rtc_execution_horizon: int = param(0,
        "Where the guided region ends, in actions (capped at the remainder's length); 0 = the checkpoint's "
        '(LeRobot rtc_config), else the whole remainder.', minimum=0, ros_name='rtc.execution_horizon')
    rtc_delay: str = param('auto',
        "The inference delay d in actions: auto (a p90 of the recent chunk ages, observation stamp -> chunk "
        'ready, over 30 frames, rounded up) or a fixed N.', ros_name='rtc.delay',
        int_ok=True)
    rtc_remainder_source: str = param('timing_rule',
        'What the next chunk is guided toward: timing_rule (the last published chunk from the observation stamp '
        'on, as if the robot executed the timing rule) | executor (the chunk executor\'s ExecutedPlan on '
        'rtc.executor_topic: what it executed and will execute, aggregation included; the timing rule while no '
        'fresh plan exists, counted).', choices=('timing_rule', 'executor'), ros_name='rtc.remainder_source')
    rtc_executor_topic: str = param('oxygen_executor/executed',
        'The chunk executor\'s oxygen_ros/ExecutedPlan topic (rtc.remainder_source: executor); relative names '
        'move with the namespace.', ros_name='rtc.executor_topic')
    rtc_executor_max_age_s: float = param(0.25,
        'A newest executor plan older than this (node clock) is not fresh: the timing rule is used instead.',
        positive=True, ros_name='rtc.executor_max_age_s')
    # --- safety (docs/safety.md): the enable gate, output limits, faults
    start_enabled: bool = param(True,
        'Publish action chunks from activation on; false: none until ~/enable (std_srvs/SetBool) is called with '
        'true (a dry run until then: frames, limit checks and language run). Real robots: false.')
    limits_policy: str = param('clamp',
        'A chunk beyond the joint limits (URDF on limits.robot_description, limits.<joint>.min / .max / '
        '.max_velocity): clamp (clipped to them, counted, logged once per joint) | reject (not published, counted '
        'with the reason). Non-finite actions are never published.', choices=LIMIT_POLICIES,
        ros_name='limits.policy')
    limits_robot_description: str = robot_param('limits_robot_description')
    limits_required: bool = robot_param('limits_required')
    max_consecutive_faults: int = param(3,
        'Frames in a row that raise before the node goes to the lifecycle\'s error processing (the model is '
        'released, /diagnostics reports ERROR, configure works again); 0 = never (each is counted and the engine '
        'reset).', minimum=0)
    watchdog_s: float = param(0.0,
        'A frame running longer than this is reported (logged, /diagnostics ERROR while it runs); 0 = 3 control '
        'periods.', minimum=0.0)
    max_chunk_age_s: float = param(0.0,
        'A chunk whose observation is older than this when it is ready is not published (chunk_too_old); 0 = '
        'max_image_age_s + watchdog_s.', minimum=0.0)
    extra: dict = field(default_factory=dict, compare=False)  # overrides that are not parameters
    joint_limits: dict = field(default_factory=dict, compare=False)  # limits.<joint>.<field> overrides
    streams: tuple[StreamParams, ...] = field(default=(), compare=False)  # resolved language streams

    @property
    def period_s(self) -> float:
        """Control period (the frame deadline)."""
        return 1.0 / self.control_rate_hz

    @property
    def watchdog_limit_s(self) -> float:
        """watchdog_s resolved (0: 3 control periods)."""
        return self.watchdog_s or 3.0 * self.period_s

    @property
    def chunk_age_limit_s(self) -> float:
        """max_chunk_age_s resolved (0: max_image_age_s + the watchdog)."""
        return self.max_chunk_age_s or self.max_image_age_s + self.watchdog_limit_s

    def robot_action_names(self, dims: int) -> tuple[str, ...]:
        """Names of the ``dims`` published action dimensions: action_names, else joint_names when they have that
        length, else ``action_0 ..``."""
        if self.action_names:
            return self.action_names
        if len(self.joint_names) == dims:
            return self.joint_names
        return tuple(f"action_{i}" for i in range(dims))

    def camera_topic(self, index: int) -> str:
        """Topic of camera ``index`` (explicit, or the default pattern)."""
        if self.camera_topics:
            return self.camera_topics[index]
        topic = DEFAULT_CAMERA_TOPIC.format(name=self.camera_names[index])
        return topic + "/compressed" if self.compressed(index) else topic

    def compressed(self, index: int) -> bool:
        """Whether camera ``index`` is subscribed as CompressedImage."""
        return bool(self.camera_compressed[index]) if self.camera_compressed else False


_DERIVED = ("extra", "streams", "joint_limits")  # NodeParams fields that are not parameters
PARAMS: tuple[ParamSpec, ...] = specs_of(NodeParams, skip=_DERIVED)
_SPECS = {p.name: p for p in PARAMS}
PARAM_NAMES = frozenset(_SPECS)
PARAM_GROUPS = frozenset(n.split(".", 1)[0] for n in PARAM_NAMES if "." in n)  # ask: ask.<field>
RESERVED_STREAM_NAMES = PARAM_NAMES | PARAM_GROUPS  # a stream's <name>.<field> would clash with them
STREAM_PARAMS: tuple[ParamSpec, ...] = specs_of(StreamParams, skip=("name",))


def stream_param_names(stream: str) -> list[str]:
    """The ROS parameter names of one stream (``<stream>.<field>``)."""
    return [f"{stream}.{spec.name}" for spec in STREAM_PARAMS]


def _streams(values: Mapping[str, Any], p: Mapping[str, Any]) -> tuple[tuple[StreamParams, ...], list[str]]:
    """The language streams the parameters describe, and the problems found."""
    if not p["language_streams"]:  # the one-stream shorthand
        task = p["request_task"]
        return (StreamParams(task, task, p["request_prompt"], p["request_every_n_frames"]),), []
    problems: list[str] = []  # with language_streams set, the shorthand (request_*) is ignored
    names = p["language_streams"]
    if len(set(names)) != len(names):
        problems.append(f"language_streams: duplicates in {list(names)}")
    streams = []
    for name in names:
        if not STREAM_NAME_RE.match(name) or name in RESERVED_STREAM_NAMES:
            problems.append(f"language_streams: {name!r} is not a valid stream name (letters, digits, _; not a "
                            f"parameter name nor one of {sorted(PARAM_GROUPS)})")
            continue
        got: dict[str, Any] = {}
        for spec in STREAM_PARAMS:
            named = dataclasses.replace(spec, name=f"{name}.{spec.name}")
            raw = lookup(values, named.name)
            value, problem = named.check(spec.default if raw is MISSING else raw)
            if problem:
                problems.append(problem)
                value = spec.default
            got[spec.name] = value
        got["task"] = got["task"] or (name if name in REQUEST_TASKS else CUSTOM_TASK)
        s = StreamParams(name=name, **got)
        if s.task == CUSTOM_TASK and not s.prompt:
            problems.append(f"{name}.prompt: required (the stream's task is custom)")
        if s.prompt and (problem := _template_problem(s.prompt)):
            problems.append(f"{name}.{problem}")
        if s.trigger == "periodic" and not (s.every_n_frames or s.period_s):
            problems.append(f"{name}: a periodic stream needs {name}.every_n_frames or {name}.period_s > 0")
        if s.max_new_tokens > p["max_new_tokens"]:
            problems.append(f"{name}.max_new_tokens: {s.max_new_tokens} > max_new_tokens={p['max_new_tokens']} "
                            "(the KV pool is sized for max_new_tokens)")
        streams.append(s)
    conditioned = p.get("subtask_conditioning", "")
    if conditioned and conditioned not in names:
        problems.append(f"subtask_conditioning: {conditioned!r} is not one of language_streams {list(names)}")
    return tuple(streams), problems


def _template_problem(template: str) -> str | None:
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        return f"request_prompt: malformed template ({e}); escape literal braces as {{{{ }}}}"
    unknown = sorted({f for f in fields if f != "instruction"})
    return f"request_prompt: unknown placeholder(s) {unknown}; only {{instruction}} is supported" if unknown else None


def _cross_problems(p: Mapping[str, Any]) -> list[str]:
    """Rules that involve several parameters."""
    problems: list[str] = []
    if not _DEVICE_RE.match(p["device"]):
        problems.append(f"device: expected auto, cpu, mps, cuda or cuda:N; got {p['device']!r}")
    if p["model"] and p["model"] not in EMBEDDED_MODELS:
        problems.append(f"model: must be '' (load checkpoint_path) or one of {', '.join(EMBEDDED_MODELS)}; "
                        f"got {p['model']!r}")
    if not p["model"] and not p["checkpoint_path"]:
        problems.append("checkpoint_path: required (or set model:=toy for the embedded tabletop model)")
    if p["request_task"] == CUSTOM_TASK and not p["request_prompt"]:
        problems.append("request_prompt: required when request_task is custom")
    if p["request_prompt"] and (problem := _template_problem(p["request_prompt"])):
        problems.append(problem)
    cams = p["camera_names"]
    if len(set(cams)) != len(cams):
        problems.append(f"camera_names: duplicates in {list(cams)}")
    if any(not c for c in cams):
        problems.append("camera_names: empty name")
    if cams and p["camera_topics"] and len(p["camera_topics"]) != len(cams):
        problems.append(f"camera_topics: {len(p['camera_topics'])} topics for {len(cams)} camera_names "
                        "(give one topic per camera, or none for the default pattern; camera_names must be set)")
    if cams and p["camera_compressed"] and len(p["camera_compressed"]) != len(cams):
        problems.append(f"camera_compressed: {len(p['camera_compressed'])} flags for {len(cams)} camera_names")
    if any(not t for t in p["camera_topics"]):
        problems.append("camera_topics: empty topic name")
    if not p["joint_names"]:
        problems.append("joint_names: required (the joints read from /joint_states, in model state order)")
    for name in ("joint_names", "action_names"):
        if len(set(p[name])) != len(p[name]):
            problems.append(f"{name}: duplicates in {list(p[name])}")
    if p["action_names"] and len(p["delta_action_mask"]) > len(p["action_names"]):
        problems.append(f"delta_action_mask: {len(p['delta_action_mask'])} flags for {len(p['action_names'])} "
                        "action_names")
    if p["ask_max_new_tokens"] > p["max_new_tokens"]:
        problems.append(f"ask.max_new_tokens: {p['ask_max_new_tokens']} > max_new_tokens={p['max_new_tokens']} "
                        "(the KV pool is sized for max_new_tokens)")
    if p["rtc_delay"] != "auto" and not p["rtc_delay"].isdigit():
        problems.append(f"rtc.delay: auto or a whole number of actions >= 0; got {p['rtc_delay']!r}")
    deltas = [i for i, d in enumerate(p["delta_action_mask"]) if d]
    if deltas and max(deltas) >= len(p["joint_names"]):
        problems.append("delta_action_mask: delta dims need a matching state dim (joint_names is shorter)")
    return problems


def validate(values: Mapping[str, Any]) -> NodeParams:
    """Type-check and cross-check parameter values (missing names take their defaults).

    Raises:
        ParamError: listing every problem, each starting with the parameter's name.
    """
    out, problems = read_specs(PARAMS, values)
    problems += _cross_problems(out)
    streams, stream_problems = _streams(values, out) if not problems else ((), [])
    problems += stream_problems
    joint_limits, limit_problems = _joint_limits(values)
    problems += limit_problems
    if problems:
        raise ParamError(problems)
    consumed = set(_SPECS) | {n for s in streams if s.name in out["language_streams"]
                              for n in (s.name, *stream_param_names(s.name))}
    consumed |= set(joint_limit_names(values))
    consumed |= {g for g in PARAM_GROUPS if isinstance(values.get(g), Mapping)}  # a YAML file's nested group
    extra = {k: v for k, v in values.items() if k not in consumed}
    return NodeParams(**out, extra=extra, streams=streams, joint_limits=joint_limits)


def markdown_table(specs: Iterable[ParamSpec] = PARAMS) -> str:
    """A Markdown table of ``specs`` (docs/parameters.md, written by ``oxygen_ros.runtime.param_docs``)."""
    return _table(specs)
