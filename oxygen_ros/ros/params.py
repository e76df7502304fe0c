"""The node's parameters: one table of names, types, defaults and descriptions, and their validation.

Parameters are declared with ``dynamic_typing`` so a wrongly typed override (``control_rate_hz: 10`` instead of
``10.0``, a string for a number) never stops the node from starting; :func:`validate` checks every value at
configure time and reports all problems at once, each naming the parameter. Nothing here needs a running ROS
graph: :func:`validate` takes a plain mapping.
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oxygen_ros.engine.scheduler import OVERFLOW_POLICIES
from oxygen_ros.engine.tokenizer import CUSTOM_TASK, LANGUAGE_TEMPLATES

NORMALIZATIONS = ("auto", "none", "quantile", "mean_std")

__all__ = [
    "DEFAULT_CAMERA_TOPIC",
    "ENGINE_MODES",
    "PARAMS",
    "NodeParams",
    "ParamError",
    "ParamSpec",
    "markdown_table",
    "validate",
]

ENGINE_MODES = ("oxygen", "isolated", "shared_kv")
EMBEDDED_MODELS = ("toy", "random_tiny")
RELIABILITIES = ("best_effort", "reliable")
DTYPES = ("auto", "float32", "bfloat16", "float16")
REQUEST_TASKS = (*LANGUAGE_TEMPLATES, CUSTOM_TASK)
DEFAULT_CAMERA_TOPIC = "/cameras/{name}/image_raw"
_DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


class ParamError(ValueError):
    """Invalid parameters; ``problems`` lists one message per offending parameter."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid parameters:\n  - " + "\n  - ".join(self.problems))


@dataclass(frozen=True)
class ParamSpec:
    """One declared parameter. ``kind`` is bool, int, float, str, 'str[]' or 'bool[]'."""

    name: str
    kind: Any
    default: Any
    description: str

    @property
    def type_name(self) -> str:
        return self.kind if isinstance(self.kind, str) else self.kind.__name__


PARAMS: tuple[ParamSpec, ...] = (
    # --- lifecycle and model
    ParamSpec("autostart", bool, True, "Configure and activate on startup (plain runs); false: wait for lifecycle "
              "transitions."),
    ParamSpec("model", str, "", "'' to load checkpoint_path; 'toy': the package's default model (pi0.5 trained on "
              "the tabletop world, see oxygen_ros.ros.sim_node); or 'random_tiny': generate a tiny random pi0.5 and "
              "tokenizer into a temporary directory (demos, tests)."),
    ParamSpec("checkpoint_path", str, "", "Checkpoint directory as LeRobot (config.json + policy_*processor.json) "
              "or openpi (model.safetensors + assets/<asset_id>/) save it, or this package's layout."),
    ParamSpec("tokenizer_path", str, "", "SentencePiece model file or directory; '' = the checkpoint's own (ours), "
              "its recorded tokenizer name (LeRobot), required for openpi."),
    ParamSpec("asset_id", str, "", "openpi: which assets/<asset_id>/norm_stats.json; '' = the only one present."),
    ParamSpec("openpi_config", str, "", "openpi: the train config whose data transforms apply (pi05_libero | "
              "pi05_droid | pi05_aloha | generic); '' = known from the asset id, else generic."),
    ParamSpec("norm_stats_path", str, "", "openpi / ours: an openpi-format norm_stats.json to use instead of the "
              "checkpoint's (not for LeRobot checkpoints, whose processor files are read)."),
    ParamSpec("normalization", str, "auto", "auto (the checkpoint's normalisation) | none (run unnormalised on "
              "purpose) | quantile | mean_std (override, openpi / ours only)."),
    ParamSpec("device", str, "auto", "auto (cuda if available) | cpu | cuda | cuda:N | mps."),
    ParamSpec("dtype", str, "auto", "auto (bfloat16 on cuda, float32 otherwise) | float32 | bfloat16 | float16."),
    ParamSpec("torch_threads", int, 0, "torch CPU threads; 0 keeps torch's default."),
    ParamSpec("seed", int, 0, "torch seed for the flow-matching noise (reproducible runs)."),
    # --- engine
    ParamSpec("mode", str, "oxygen", "Engine: oxygen (shared prefill + cross-frame batched decoding) | shared_kv "
              "(shared prefill, decode to completion) | isolated (openpi-style second prefill)."),
    ParamSpec("num_steps", int, 0, "S: flow-matching denoise steps per action chunk; 0 = the checkpoint's (LeRobot "
              "num_inference_steps, else 10)."),
    ParamSpec("action_horizon", int, 0, "H: the checkpoint decides the chunk length; 0 accepts it, any other value "
              "must equal it (a check, never an override)."),
    ParamSpec("actions_per_chunk", int, 0, "Actions of each chunk to publish for execution (LeRobot's "
              "n_action_steps); 0 = the checkpoint's n_action_steps (openpi / ours: the whole chunk)."),
    ParamSpec("max_new_tokens", int, 30, "N: tokens generated per language request."),
    ParamSpec("k", int, 5, "Per-frame decode budget (tokens per request per frame, oxygen mode)."),
    ParamSpec("k_auto", bool, False, "Pick k every frame so the frame fits the control period (deadline = "
              "1 / control_rate_hz)."),
    ParamSpec("request_every_n_frames", int, 1, "Start a language request every n-th processed frame; 0 disables "
              "language."),
    ParamSpec("request_task", str, "memory", "Language task: memory | narration | subtask | custom."),
    ParamSpec("request_prompt", str, "", "Prompt template fed after the shared prefix ({instruction} is replaced); "
              "'' uses the task's built-in prompt (required for custom)."),
    ParamSpec("max_prompt_tokens", int, 16, "Longest request prompt in tokens (longer prompts are cut)."),
    ParamSpec("max_inflight", int, 32, "Bound on unfinished language requests (KV slots)."),
    ParamSpec("overflow", str, "reject_newest", "When max_inflight is reached: reject_newest | drop_oldest."),
    # --- inputs
    ParamSpec("camera_names", "str[]", [], "Model camera slots fed by camera_topics (e.g. base_0_rgb, "
              "left_wrist_0_rgb); [] = all slots of the model. Slots not listed are masked out."),
    ParamSpec("camera_topics", "str[]", [], "One image topic per camera_names entry; [] = "
              "/cameras/<name>/image_raw (+ /compressed for compressed cameras)."),
    ParamSpec("camera_compressed", "bool[]", [], "Per camera: subscribe sensor_msgs/CompressedImage instead of "
              "Image; [] = all raw."),
    ParamSpec("camera_reliability", str, "best_effort", "Camera QoS reliability: best_effort (sensor data) | "
              "reliable. History is KEEP_LAST depth 1."),
    ParamSpec("max_image_age_s", float, 0.5, "Skip the frame when a camera's newest image is older than this, or "
              "stamped this far in the future (node clock)."),
    ParamSpec("max_image_pixels", int, 4096 * 4096, "Reject images with more pixels than this."),
    ParamSpec("joint_names", "str[]", [], "Joints read from /joint_states, in model state order (required)."),
    ParamSpec("action_names", "str[]", [], "Names of the robot's action dimensions (ActionChunk.joint_names, "
              "JointTrajectory joints); [] = joint_names. Its length is the published action dim."),
    ParamSpec("delta_action_mask", "bool[]", [], "Per action dim: true = the model predicts a delta added to the "
              "state; [] = the checkpoint's rule (LeRobot relative actions, openpi's data config). Only for "
              "checkpoints that define none."),
    ParamSpec("instruction", str, "", "Instruction used until one arrives on /instruction ('' = wait)."),
    ParamSpec("max_instruction_chars", int, 1000, "Longer instructions are truncated (counted, warned)."),
    # --- timing and outputs
    ParamSpec("control_rate_hz", float, 10.0, "Control frames per second (one engine step per frame)."),
    ParamSpec("action_rate_hz", float, 0.0, "Rate the robot executes chunk actions at (ActionChunk.dt = "
              "1 / rate); 0 = action_horizon * control_rate_hz."),
    ParamSpec("publish_trajectory", bool, False, "Also publish each chunk as trajectory_msgs/JointTrajectory on "
              "~/trajectory (remap to /<controller>/joint_trajectory)."),
)

_SPECS = {p.name: p for p in PARAMS}


@dataclass(frozen=True)
class NodeParams:
    """Validated parameter values (names as in :data:`PARAMS`)."""

    autostart: bool = True
    model: str = ""
    checkpoint_path: str = ""
    tokenizer_path: str = ""
    norm_stats_path: str = ""
    asset_id: str = ""
    openpi_config: str = ""
    normalization: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    torch_threads: int = 0
    seed: int = 0
    mode: str = "oxygen"
    num_steps: int = 0
    action_horizon: int = 0
    actions_per_chunk: int = 0
    max_new_tokens: int = 30
    k: int = 5
    k_auto: bool = False
    request_every_n_frames: int = 1
    request_task: str = "memory"
    request_prompt: str = ""
    max_prompt_tokens: int = 16
    max_inflight: int = 32
    overflow: str = "reject_newest"
    camera_names: tuple[str, ...] = ()
    camera_topics: tuple[str, ...] = ()
    camera_compressed: tuple[bool, ...] = ()
    camera_reliability: str = "best_effort"
    max_image_age_s: float = 0.5
    max_image_pixels: int = 4096 * 4096
    joint_names: tuple[str, ...] = ()
    action_names: tuple[str, ...] = ()
    delta_action_mask: tuple[bool, ...] = ()
    instruction: str = ""
    max_instruction_chars: int = 1000
    control_rate_hz: float = 10.0
    action_rate_hz: float = 0.0
    publish_trajectory: bool = False
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def period_s(self) -> float:
        """Control period (the frame deadline)."""
        return 1.0 / self.control_rate_hz

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

    def with_cameras(self, names: Iterable[str]) -> NodeParams:
        """A copy with ``camera_names`` filled in (from the model's slots)."""
        return dataclasses.replace(self, camera_names=tuple(names))


def _coerce(spec: ParamSpec, value: Any) -> tuple[Any, str | None]:
    """(value converted to the spec's type, None) or (None, problem)."""
    kind = spec.kind
    got = f"got {type(value).__name__} {value!r}"[:160]
    if kind is bool:
        return (value, None) if isinstance(value, bool) else (None, f"{spec.name}: expected true/false, {got}")
    if kind is int:
        if isinstance(value, bool):
            return None, f"{spec.name}: expected an integer, {got}"
        if isinstance(value, int):
            return value, None
        if isinstance(value, float) and value.is_integer():
            return int(value), None
        return None, f"{spec.name}: expected an integer, {got}"
    if kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), None
        return None, f"{spec.name}: expected a number, {got}"
    if kind is str:
        return (value, None) if isinstance(value, str) else (None, f"{spec.name}: expected a string, {got}")
    item = str if kind == "str[]" else bool
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        items = list(value.tolist() if hasattr(value, "tolist") else value)
        if all(isinstance(v, item) for v in items):
            return tuple(items), None
    what = "strings" if item is str else "booleans"
    return None, f"{spec.name}: expected a list of {what}, {got}"


def _choice(problems: list[str], name: str, value: str, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if value not in choices:
        problems.append(f"{name}: must be one of {', '.join(choices)}; got {value!r}")


def _template_problem(template: str) -> str | None:
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        return f"request_prompt: malformed template ({e}); escape literal braces as {{{{ }}}}"
    unknown = sorted({f for f in fields if f != "instruction"})
    return f"request_prompt: unknown placeholder(s) {unknown}; only {{instruction}} is supported" if unknown else None


def validate(values: Mapping[str, Any]) -> NodeParams:
    """Type-check and cross-check parameter values (missing names take their defaults).

    Raises:
        ParamError: listing every problem, each starting with the parameter's name.
    """
    problems: list[str] = []
    out: dict[str, Any] = {}
    for spec in PARAMS:
        raw = values.get(spec.name, spec.default)
        value, problem = _coerce(spec, raw)
        if problem:
            problems.append(problem)
            value = _coerce(spec, spec.default)[0]
        out[spec.name] = value
    p = out

    _choice(problems, "mode", p["mode"], ENGINE_MODES)
    _choice(problems, "overflow", p["overflow"], OVERFLOW_POLICIES)
    _choice(problems, "camera_reliability", p["camera_reliability"], RELIABILITIES)
    _choice(problems, "normalization", p["normalization"], NORMALIZATIONS)
    _choice(problems, "dtype", p["dtype"], DTYPES)
    _choice(problems, "request_task", p["request_task"], REQUEST_TASKS)
    if not _DEVICE_RE.match(p["device"]):
        problems.append(f"device: expected auto, cpu, mps, cuda or cuda:N; got {p['device']!r}")
    if p["model"] and p["model"] not in EMBEDDED_MODELS:
        problems.append(f"model: must be '' (load checkpoint_path) or one of {', '.join(EMBEDDED_MODELS)}; "
                        f"got {p['model']!r}")
    if not p["model"] and not p["checkpoint_path"]:
        problems.append("checkpoint_path: required (or set model:=toy for the embedded tabletop model)")

    for name, low in (("num_steps", 0), ("actions_per_chunk", 0), ("max_new_tokens", 1), ("k", 1),
                      ("max_prompt_tokens", 1), ("max_inflight", 1), ("max_instruction_chars", 1),
                      ("max_image_pixels", 1), ("action_horizon", 0), ("request_every_n_frames", 0),
                      ("torch_threads", 0), ("seed", 0)):
        if p[name] < low:
            problems.append(f"{name}: must be >= {low}; got {p[name]}")
    for name in ("control_rate_hz", "max_image_age_s"):
        if not p[name] > 0:
            problems.append(f"{name}: must be > 0; got {p[name]}")
    if not p["action_rate_hz"] >= 0:
        problems.append(f"action_rate_hz: must be >= 0 (0 = horizon * control rate); got {p['action_rate_hz']}")

    if p["request_task"] == CUSTOM_TASK and not p["request_prompt"]:
        problems.append("request_prompt: required when request_task is custom")
    if p["request_prompt"] and (problem := _template_problem(p["request_prompt"])):
        problems.append(problem)

    cams = p["camera_names"]
    if len(set(cams)) != len(cams):
        problems.append(f"camera_names: duplicates in {list(cams)}")
    if any(not c for c in cams):
        problems.append("camera_names: empty name")
    if p["camera_topics"] and len(p["camera_topics"]) != len(cams):
        problems.append(f"camera_topics: {len(p['camera_topics'])} topics for {len(cams)} camera_names "
                        "(give one topic per camera, or none for the default pattern; camera_names must be set)")
    if p["camera_compressed"] and len(p["camera_compressed"]) != len(cams):
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
    deltas = [i for i, d in enumerate(p["delta_action_mask"]) if d]
    if deltas and max(deltas) >= len(p["joint_names"]):
        problems.append("delta_action_mask: delta dims need a matching state dim (joint_names is shorter)")

    if problems:
        raise ParamError(problems)
    extra = {k: v for k, v in values.items() if k not in _SPECS}
    return NodeParams(**p, extra=extra)


def markdown_table(specs: Iterable[ParamSpec] = PARAMS) -> str:
    """The parameter table for the README."""
    rows = ["| name | type | default | description |", "|---|---|---|---|"]
    for s in specs:
        default = repr(s.default) if isinstance(s.default, str) else str(s.default).lower() \
            if isinstance(s.default, bool) else str(s.default)
        description = s.description.replace("|", "\\|")  # a bare | would split the table cell
        rows.append(f"| `{s.name}` | {s.type_name} | `{default}` | {description} |")
    return "\n".join(rows)
