"""openpi clients' observation keys -> :class:`~oxygen_ros.policy.RawObservation`, as openpi's data transforms map
them to the checkpoint's camera slots and state (``LiberoInputs``, ``DroidInputs``, ``AlohaInputs``).

- libero: ``observation/image`` -> base_0_rgb, ``observation/wrist_image`` -> left_wrist_0_rgb; state
  ``observation/state``;
- droid: ``observation/exterior_image_1_left`` -> base_0_rgb, ``observation/wrist_image_left`` -> left_wrist_0_rgb;
  state ``observation/joint_position`` + ``observation/gripper_position``;
- aloha: ``images`` {``cam_high`` -> base_0_rgb (required), ``cam_left_wrist`` -> left_wrist_0_rgb,
  ``cam_right_wrist`` -> right_wrist_0_rgb; ``cam_low`` accepted, unused}; state ``state``;
- generic: ``images`` {checkpoint camera slot -> image}; state ``state``;
- all: the instruction in ``prompt``.

Images are HWC or CHW, uint8 or float in [0, 1]. A slot the checkpoint does not have is taken by position (base,
left wrist, right wrist -> its cameras in order), so LeRobot checkpoints serve these clients too. A missing or
malformed key raises :class:`ObservationError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from oxygen_ros.policy import RawObservation
from oxygen_ros.policy.images import as_hwc_uint8
from oxygen_ros.policy.spec import PolicySpec

__all__ = ["KEY_MAPS", "KeyMap", "ObservationError", "key_map_for"]

OPENPI_SLOTS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")


class ObservationError(ValueError):
    """A missing or malformed observation key (the message names it)."""


@dataclass(frozen=True)
class KeyMap:
    """How one kind of client names its cameras, state and prompt (see the module docstring).

    cameras: (key, openpi slot) pairs; with ``images_key`` the keys are names inside that map.
    required: camera keys that must be present (the others may be absent: their slot is masked).
    ignored: camera names accepted and not used.
    open_cameras: the generic map: any camera named by a checkpoint slot.
    metadata: what the server sends on connect (openpi's train config's ``policy_metadata``).
    """

    name: str
    cameras: tuple[tuple[str, str], ...] = ()
    required: tuple[str, ...] = ()
    state: tuple[str, ...] = ("state",)
    images_key: str = ""
    ignored: tuple[str, ...] = ()
    open_cameras: bool = False
    metadata: dict = field(default_factory=dict, compare=False)

    def read(self, obs: Mapping, spec: PolicySpec, default_prompt: str = "") -> RawObservation:
        """The raw observation a request holds.

        Raises:
            ObservationError: a missing key, a camera the map does not know, or a malformed image or state.
        """
        if not isinstance(obs, Mapping):
            raise ObservationError(f"an observation is a map of keys, got {type(obs).__name__}")
        images = self._images(obs, spec)
        state = np.concatenate([np.atleast_1d(_array(obs, key)).astype(np.float64, copy=False)
                                for key in self.state])
        if state.ndim != 1:
            raise ObservationError(f"'{self.state[0]}': the state must be 1-D, got shape {state.shape}")
        if spec.state_dim is not None and state.shape[0] != spec.state_dim:
            raise ObservationError(f"'{'+'.join(self.state)}': {state.shape[0]} state dims; the checkpoint expects "
                                   f"{spec.state_dim}")
        if not np.all(np.isfinite(state)):
            raise ObservationError(f"'{'+'.join(self.state)}': the state contains NaN or Inf")
        prompt = obs.get("prompt", default_prompt)
        if isinstance(prompt, bytes | np.bytes_):
            prompt = bytes(prompt).decode("utf-8", "replace")
        if not isinstance(prompt, str | np.str_):
            raise ObservationError(f"'prompt': expected a string, got {type(prompt).__name__}")
        if "prompt" not in obs and not default_prompt:
            raise ObservationError("missing key 'prompt' (and the server has no --default-prompt)")
        return RawObservation(images, state, str(prompt))

    def _images(self, obs: Mapping, spec: PolicySpec) -> dict[str, np.ndarray]:
        source, where = obs, ""
        if self.images_key:
            source = obs.get(self.images_key)
            if source is None:
                raise ObservationError(f"missing key '{self.images_key}'")
            if not isinstance(source, Mapping):
                raise ObservationError(f"'{self.images_key}': expected a map of camera name -> image")
            where = f"{self.images_key}/"
        images: dict[str, np.ndarray] = {}
        if self.open_cameras:
            for name, image in source.items():
                if name not in spec.camera_slots:
                    raise ObservationError(f"'{where}{name}': not a camera slot of the checkpoint "
                                           f"{list(spec.camera_slots)}")
                images[name] = _image(image, f"{where}{name}")
            if not images:
                raise ObservationError(f"'{self.images_key}': no camera image")
            return images
        known = {key for key, _ in self.cameras} | set(self.ignored)
        if self.images_key:
            unknown = sorted(str(k) for k in source if k not in known)
            if unknown:
                raise ObservationError(f"'{where}{unknown[0]}': unknown camera (expected "
                                       f"{sorted(k for k, _ in self.cameras)})")
        for key in self.required:
            if key not in source:
                raise ObservationError(f"missing key '{where}{key}'")
        for key, slot in self.cameras:
            if key in source:
                images[_slot(slot, spec)] = _image(source[key], f"{where}{key}")
        return images


def _slot(openpi_slot: str, spec: PolicySpec) -> str:
    """The checkpoint's slot for an openpi slot: the same name, else the same position among its cameras."""
    if openpi_slot in spec.camera_slots:
        return openpi_slot
    cameras = spec.default_cameras or spec.camera_slots
    i = OPENPI_SLOTS.index(openpi_slot)
    if i >= len(cameras):
        raise ObservationError(f"the checkpoint has no camera for openpi's {openpi_slot} (cameras {list(cameras)})")
    return cameras[i]


def _array(obs: Mapping, key: str) -> np.ndarray:
    if key not in obs:
        raise ObservationError(f"missing key '{key}'")
    value = np.asarray(obs[key])
    if value.dtype.kind not in "biuf":
        raise ObservationError(f"'{key}': expected numbers, got dtype {value.dtype}")
    return value


def _image(image: object, key: str) -> np.ndarray:
    try:
        return as_hwc_uint8(np.asarray(image), key)
    except ValueError as e:
        raise ObservationError(f"'{key}': {e}".replace(f"{key}: ", "")) from e


LIBERO = KeyMap("libero", (("observation/image", "base_0_rgb"), ("observation/wrist_image", "left_wrist_0_rgb")),
                required=("observation/image", "observation/wrist_image"), state=("observation/state",))
DROID = KeyMap("droid", (("observation/exterior_image_1_left", "base_0_rgb"),
                         ("observation/wrist_image_left", "left_wrist_0_rgb")),
               required=("observation/exterior_image_1_left", "observation/wrist_image_left"),
               state=("observation/joint_position", "observation/gripper_position"))
ALOHA = KeyMap("aloha", (("cam_high", "base_0_rgb"), ("cam_left_wrist", "left_wrist_0_rgb"),
                         ("cam_right_wrist", "right_wrist_0_rgb")),
               required=("cam_high",), state=("state",), images_key="images", ignored=("cam_low",),
               metadata={"reset_pose": [0, -1.5, 1.5, 0, 0, 0]})
GENERIC = KeyMap("generic", images_key="images", open_cameras=True)
KEY_MAPS: dict[str, KeyMap] = {m.name: m for m in (LIBERO, DROID, ALOHA, GENERIC)}
_BY_OPENPI_CONFIG = {"pi05_libero": "libero", "pi05_droid": "droid", "pi05_aloha": "aloha"}


def key_map_for(name: str, spec: PolicySpec) -> KeyMap:
    """``name`` (a key of :data:`KEY_MAPS`), or ``auto``: the map of the checkpoint's openpi train config (LIBERO,
    DROID, ALOHA), else the generic one.

    Raises:
        ValueError: an unknown name.
    """
    if name == "auto":
        return KEY_MAPS[_BY_OPENPI_CONFIG.get(spec.openpi_config, "generic")]
    if name not in KEY_MAPS:
        raise ValueError(f"keys: unknown key map {name!r}; known: auto, {', '.join(KEY_MAPS)}")
    return KEY_MAPS[name]
