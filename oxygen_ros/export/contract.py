"""The export contract: which bag topics become which LeRobot dataset features, at what frame rate, with which
tolerances (``oxygen-export-lerobot --contract contract.yaml``), or generated from a node preset
(``--preset config/libero.yaml``).

A contract file (every key but ``cameras``, ``state`` and ``action`` has a default)::

    fps: 10                       # the dataset's frame clock, sampled from the bag's time
    robot_type: oxygen            # info.json robot_type
    cameras:                      # observation.images.<name> (video): Image or CompressedImage topics
      base_0_rgb: /cameras/base_0_rgb/image_raw
    state: {topic: /joint_states, names: [joint_1, ...]}    # observation.state, named and ordered
    action:                       # action: the command in force at each frame
      source: action_chunk        # action_chunk (~/action_chunk's step in force) | setpoints | command
      topic: /oxygen/action_chunk
      names: []                   # [] = the chunk's joint_names / the first message's names
    instruction_topic: /instruction             # std_msgs/String: the task (task_aug when it changes)
    language_topic: /oxygen/language_output     # LanguageOutput: memory, subtask, narration, ask answers
    ask_stream: ask               # the LanguageOutput stream of ~/ask answers (vqa events)
    ask_action: /oxygen/ask       # ~/ask's goals and results as rosbag2 records actions ('' = answers only)
    ask_camera: base_0_rgb        # the camera a question was asked about ('' = the first camera)
    episode_topic: ''             # a topic whose every message starts a new episode ('' = one episode a bag)
    tolerance: {image_s: 0.15, state_s: 0.15, action_s: 0.5, language_s: 0.05}
    video: {codec: auto, pix_fmt: yuv420p, g: 2, crf: 30}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ACTION_SOURCES", "Contract", "ContractError", "Tolerances", "VideoSettings", "contract_from_preset",
           "load_contract"]

ACTION_SOURCES = ("action_chunk", "setpoints", "command")


class ContractError(ValueError):
    """A contract file (or preset) that cannot describe a dataset: unknown keys, bad values, missing parts."""


@dataclass(frozen=True)
class Tolerances:
    """How old (seconds of bag time) the newest message of each stream may be at a frame; older: the frame is
    dropped and counted. ``language_s``: how far an output's observation stamp may be from its frame."""

    image_s: float = 0.15
    state_s: float = 0.15
    action_s: float = 0.5
    language_s: float = 0.05


@dataclass(frozen=True)
class VideoSettings:
    """PyAV encoder settings (LeRobot's ``VideoEncoderConfig`` fields). ``codec: auto``: libsvtav1 (LeRobot's
    default) where this PyAV has it, else h264."""

    codec: str = "auto"
    pix_fmt: str = "yuv420p"
    g: int = 2
    crf: int = 30
    preset: int | str | None = None


@dataclass(frozen=True)
class Contract:
    """Topics -> features, the frame clock and its tolerances (see the module docstring for the YAML)."""

    cameras: dict[str, str]
    state_topic: str
    action_topic: str
    fps: int = 10
    robot_type: str = "oxygen"
    state_names: tuple[str, ...] = ()
    action_source: str = "action_chunk"
    action_names: tuple[str, ...] = ()
    instruction_topic: str = "/instruction"
    language_topic: str = ""
    ask_stream: str = "ask"
    ask_action: str = ""
    ask_camera: str = ""
    episode_topic: str = ""
    tolerance: Tolerances = field(default_factory=Tolerances)
    video: VideoSettings = field(default_factory=VideoSettings)

    def __post_init__(self) -> None:
        if not isinstance(self.fps, int) or self.fps <= 0:
            raise ContractError(f"fps must be a positive integer (LeRobot's info.json fps), got {self.fps!r}")
        if not self.cameras:
            raise ContractError("cameras: at least one camera (name: topic) is needed")
        for name, topic in self.cameras.items():
            if not name or "/" in name or not str(topic).startswith("/"):
                raise ContractError(f"cameras: {name!r}: {topic!r} must be a plain name and an absolute topic")
        if self.action_source not in ACTION_SOURCES:
            raise ContractError(f"action.source must be one of {ACTION_SOURCES}, got {self.action_source!r}")
        for what in ("state_topic", "action_topic"):
            if not str(getattr(self, what)).startswith("/"):
                raise ContractError(f"{what} must be an absolute topic, got {getattr(self, what)!r}")
        if self.ask_camera and self.ask_camera not in self.cameras:
            raise ContractError(f"ask_camera {self.ask_camera!r} is not one of the cameras {sorted(self.cameras)}")
        t = self.tolerance
        if min(t.image_s, t.state_s, t.action_s, t.language_s) <= 0:
            raise ContractError(f"tolerances must be positive, got {t}")

    @property
    def camera_keys(self) -> dict[str, str]:
        """Feature key (``observation.images.<name>``) -> topic, in the contract's order."""
        return {f"observation.images.{n}": t for n, t in self.cameras.items()}

    @property
    def vqa_camera(self) -> str:
        """The feature key vqa rows name: ``ask_camera``'s, else the first camera's."""
        return f"observation.images.{self.ask_camera or next(iter(self.cameras))}"

    def to_dict(self) -> dict[str, Any]:
        """The YAML form (``load_contract`` reads it back)."""
        return {
            "fps": self.fps, "robot_type": self.robot_type, "cameras": dict(self.cameras),
            "state": {"topic": self.state_topic, "names": list(self.state_names)},
            "action": {"source": self.action_source, "topic": self.action_topic, "names": list(self.action_names)},
            "instruction_topic": self.instruction_topic, "language_topic": self.language_topic,
            "ask_stream": self.ask_stream, "ask_action": self.ask_action, "ask_camera": self.ask_camera,
            "episode_topic": self.episode_topic,
            "tolerance": dataclasses.asdict(self.tolerance), "video": dataclasses.asdict(self.video),
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


_TOP = {"fps", "robot_type", "cameras", "state", "action", "instruction_topic", "language_topic", "ask_stream",
        "ask_action", "ask_camera", "episode_topic", "tolerance", "video"}


def _only(section: str, value: Any, allowed: set[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ContractError(f"{section} must be a mapping, got {type(value).__name__}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ContractError(f"{section}: unknown keys {unknown} (known: {sorted(allowed)})")
    return dict(value)


def contract_from_dict(data: Mapping[str, Any]) -> Contract:
    """A :class:`Contract` from its YAML form; unknown keys and bad values raise :class:`ContractError`."""
    d = _only("contract", data, _TOP)
    state = _only("state", d.get("state"), {"topic", "names"})
    action = _only("action", d.get("action"), {"source", "topic", "names"})
    if "topic" not in state or "topic" not in action:
        raise ContractError("state.topic and action.topic are required")
    cams = d.get("cameras") or {}
    if not isinstance(cams, Mapping):
        raise ContractError("cameras must map names to topics")
    try:
        return Contract(
            cameras={str(k): str(v) for k, v in cams.items()}, state_topic=str(state["topic"]),
            action_topic=str(action["topic"]), fps=d.get("fps", 10), robot_type=str(d.get("robot_type", "oxygen")),
            state_names=tuple(map(str, state.get("names") or ())),
            action_source=str(action.get("source", "action_chunk")),
            action_names=tuple(map(str, action.get("names") or ())),
            instruction_topic=str(d.get("instruction_topic") or ""), language_topic=str(d.get("language_topic") or ""),
            ask_stream=str(d.get("ask_stream", "ask")), ask_action=str(d.get("ask_action") or ""),
            ask_camera=str(d.get("ask_camera") or ""),
            episode_topic=str(d.get("episode_topic") or ""),
            tolerance=Tolerances(**{k: float(v) for k, v in _only(
                "tolerance", d.get("tolerance"), {f.name for f in dataclasses.fields(Tolerances)}).items()}),
            video=VideoSettings(**_only("video", d.get("video"), {f.name for f in dataclasses.fields(VideoSettings)})),
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ContractError):
            raise
        raise ContractError(str(exc)) from exc


def load_contract(path: Path | str) -> Contract:
    """Read a contract YAML file."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ContractError(f"{path}: cannot read the contract: {exc}") from exc
    try:
        return contract_from_dict(data or {})
    except ContractError as exc:
        raise ContractError(f"{path}: {exc}") from exc


def _camera_name(topic: str) -> str:
    """``/cameras/base_0_rgb/image_raw`` -> ``base_0_rgb``: the topic's last part that is not an image suffix."""
    parts = [p for p in topic.split("/") if p and p not in ("image_raw", "image", "compressed", "image_color")]
    return parts[-1] if parts else "camera"


def contract_from_preset(preset: Path | str, node: str = "/oxygen", fps: int | None = None) -> Contract:
    """The contract for bags recorded around a node run with the preset ``preset`` (a params file): its
    ``camera_topics`` (``camera_names`` or the topics' names; ``/compressed`` where ``camera_compressed``),
    ``joint_names`` on ``/joint_states``, ``action_names``, ``control_rate_hz`` as fps (unless ``fps``), and the
    node's own outputs: ``<node>/action_chunk`` (the step in force), ``<node>/language_output`` and the
    ``<node>/ask`` action's recorded goals and results."""
    try:
        doc = yaml.safe_load(Path(preset).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ContractError(f"{preset}: cannot read the preset: {exc}") from exc
    section = next((doc[k] for k in ("/**", node.strip("/"), node) if k in doc), None)
    params = (section or {}).get("ros__parameters") if isinstance(section, Mapping) else None
    if not isinstance(params, Mapping):
        raise ContractError(f"{preset}: no '/**' or '{node.strip('/')}' section with ros__parameters")
    topics = list(params.get("camera_topics") or [])
    if not topics:
        raise ContractError(f"{preset}: camera_topics is empty; write a contract naming the camera topics")
    names = list(params.get("camera_names") or []) or [_camera_name(t) for t in topics]
    compressed = list(params.get("camera_compressed") or []) + [False] * len(topics)
    if len(names) != len(topics) or len(set(names)) != len(names):
        raise ContractError(f"{preset}: camera_names {names} do not name the camera_topics {topics} one to one")
    cams = {n: t + ("/compressed" if c and not t.endswith("/compressed") else "")
            for n, t, c in zip(names, topics, compressed, strict=False)}
    rate = fps if fps is not None else max(1, round(float(params.get("control_rate_hz", 10.0))))
    node = "/" + node.strip("/")
    return Contract(cameras=cams, state_topic="/joint_states", action_topic=f"{node}/action_chunk", fps=int(rate),
                    robot_type=Path(preset).stem, state_names=tuple(params.get("joint_names") or ()),
                    action_source="action_chunk", action_names=tuple(params.get("action_names") or ()),
                    language_topic=f"{node}/language_output", ask_action=f"{node}/ask")
