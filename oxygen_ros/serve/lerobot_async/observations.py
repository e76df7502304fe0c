"""LeRobot's observations as the policy reads them (LeRobot's ``raw_observation_to_observation``), checked field by
field so that a bad one is refused to its sender, never failing the batch it would have joined; and the checks of
a client's ``lerobot_features`` and the checkpoint's camera shapes they are read against."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from oxygen_ros.policy import Policy, RawObservation

from .payloads import RemotePolicyConfig, TimedObservation

__all__ = ["IMAGES", "STATE", "Pending", "camera_image", "check_features", "image_shapes", "number",
           "read_observation"]

IMAGES = "observation.images."
STATE = "observation.state"


@dataclass
class Pending:
    """An observation read and waiting for its client's next ``GetActions``."""

    observation: TimedObservation
    raw: RawObservation
    state: np.ndarray
    arrived_ns: int = field(default_factory=time.monotonic_ns)


def read_observation(obs: TimedObservation, config: RemotePolicyConfig, policy: Policy,
                     image_shapes: dict[str, tuple[int, ...]]) -> Pending:
    """The observation as ``policy`` reads it, its cameras resized to ``image_shapes`` (:func:`camera_image`).

    Raises:
        ValueError: why it cannot be used.
    """
    if isinstance(obs.timestep, bool) or not isinstance(obs.timestep, int) or obs.timestep < 0:
        raise ValueError(f"timestep must be a non-negative int, got {obs.timestep!r}")
    if not isinstance(obs.timestamp, int | float) or not math.isfinite(obs.timestamp):
        raise ValueError(f"timestamp must be a finite number, got {obs.timestamp!r}")
    if not isinstance(obs.must_go, bool) or not isinstance(obs.observation, dict):
        raise ValueError("must_go must be a bool and observation a dict")
    values, features = obs.observation, config.lerobot_features
    spec = policy.spec
    state = np.zeros(0, dtype=np.float32)
    images: dict[str, np.ndarray] = {}
    for key, ft in features.items():
        if key == STATE:
            missing = [n for n in ft["names"] if n not in values]
            if missing:
                raise ValueError(f"missing state value(s) {missing[:3]}")
            try:
                state = np.array([number(values[n], n) for n in ft["names"]], dtype=np.float32)
            except (TypeError, ValueError) as e:
                raise ValueError(f"state: {e}") from None
        elif key.startswith(IMAGES) and ft.get("dtype") in ("image", "video"):
            name = key.removeprefix(IMAGES)
            if name not in values:
                raise ValueError(f"missing camera {name!r}")
            renamed = config.rename_map.get(key, key)
            if policy.slot_of(renamed) not in spec.camera_slots:
                raise ValueError(f"camera {renamed!r} is not a camera of the checkpoint {list(spec.camera_slots)}")
            images[renamed] = camera_image(values[name], renamed, image_shapes)
    if spec.state_dim is not None and state.shape[0] != spec.state_dim:
        raise ValueError(f"{state.shape[0]} state dims; the checkpoint expects {spec.state_dim}")
    if not np.all(np.isfinite(state)):
        raise ValueError("the state contains NaN or Inf")
    if not images:
        raise ValueError("no camera image")
    task = values.get("task", "")
    if not isinstance(task, str):
        raise ValueError(f"'task' must be a string, got {type(task).__name__}")
    return Pending(obs, RawObservation(images, state, task), state)


def camera_image(image: object, key: str, shapes: dict[str, tuple[int, ...]]) -> np.ndarray:
    """A camera image [H, W, 3] uint8, resized as LeRobot's ``resize_robot_observation_image`` does to the
    checkpoint's feature shape (bilinear, on the uint8 tensor) when it differs."""
    if isinstance(image, torch.Tensor):
        image = image.numpy()
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"camera {key!r}: expected an [H, W, 3] uint8 image, got "
                         f"{getattr(image, 'dtype', type(image).__name__)} {getattr(image, 'shape', '')}")
    shape = shapes.get(key)
    if shape is not None and tuple(image.shape[:2]) != tuple(shape[1:]):
        t = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None]
        t = torch.nn.functional.interpolate(t, size=tuple(shape[1:]), mode="bilinear", align_corners=False)
        image = t[0].permute(1, 2, 0).contiguous().numpy()
    return image


def number(value: object, name: str) -> float:
    """A motor value (a number, or a one-element array or tensor) as a float."""
    if isinstance(value, bool | int | float | np.integer | np.floating):
        return float(value)
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "biuf":
        return float(value.reshape(-1)[0])
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.reshape(-1)[0])
    raise TypeError(f"{name!r}: expected a number, got {type(value).__name__}")


def check_features(features: object, rename_map: object) -> str:
    """Why ``lerobot_features`` / ``rename_map`` cannot be used ('' = they can)."""
    if not isinstance(rename_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in rename_map.items()):
        return "rename_map must be a dict of strings"
    if not isinstance(features, dict) or not features:
        return "lerobot_features must be a non-empty dict"
    for key, ft in features.items():
        if not isinstance(key, str) or not isinstance(ft, dict):
            return f"lerobot_features[{key!r}]: expected a dict (LeRobot's hw_to_dataset_features)"
        if key == STATE and (not isinstance(ft.get("names"), list) or not all(isinstance(n, str)
                                                                             for n in ft["names"])):
            return f"lerobot_features[{STATE!r}]: 'names' must be a list of strings"
    if STATE not in features:
        return f"lerobot_features: no {STATE!r}"
    return ""


def image_shapes(checkpoint: Path) -> dict[str, tuple[int, ...]]:
    """A LeRobot checkpoint's camera feature shapes [C, H, W] (config.json ``input_features``); {} otherwise."""
    try:
        cfg = json.loads((Path(checkpoint) / "config.json").read_text())
        return {k: tuple(int(x) for x in v["shape"]) for k, v in cfg.get("input_features", {}).items()
                if isinstance(v, dict) and v.get("type") == "VISUAL" and len(v.get("shape", ())) == 3}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}
