"""ROS messages -> one prepared policy observation per control frame.

:class:`InputStore` keeps the newest valid camera image, joint positions and instruction; subscription callbacks
call its ``on_*`` methods, which validate and decode each message (off the control thread) and count every
rejected message by reason. :class:`ObservationBuilder` turns the store's contents into the policy's model input at
each control tick (:meth:`oxygen_ros.policy.Policy.prepare`: the checkpoint's own resize, normalisation and
prompt), or says why the frame must be skipped (missing or stale camera, missing or non-finite state, no
instruction): no action is computed from stale data.

Nothing here needs a running node; the classes are unit-tested with plain messages.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from oxygen_ros.policy import Policy, PreparedObservation, RawObservation

from .diagnostics import ReasonCounter
from .image_conversion import SUPPORTED_ENCODINGS, ImageError, compressed_msg_to_array, image_msg_to_array
from .stamps import stamp_to_ns

__all__ = ["BuiltObservation", "CameraImage", "InputStore", "ObservationBuilder", "Skip"]


@dataclass
class CameraImage:
    """A decoded, validated camera image. The conversion to model input happens once, when a control frame first
    uses it: cameras usually publish faster than the control rate, and most images are never used."""

    rgb: np.ndarray  # uint8 [H, W, 3]
    stamp_ns: int  # header stamp
    received: float  # monotonic arrival time (for latency)
    _pixels: np.ndarray | None = None

    def pixels(self, convert: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """float32 [3, S, S] in [-1, 1], converted by ``convert`` on first use."""
        if self._pixels is None:
            self._pixels = convert(self.rgb)
        return self._pixels


@dataclass(frozen=True)
class Skip:
    """Why a control frame produced no observation."""

    reason: str
    detail: str = ""


@dataclass(frozen=True)
class BuiltObservation:
    """Model input of one frame and what it was built from."""

    prepared: PreparedObservation
    stamp_ns: int  # observation time = newest camera stamp used
    received: float  # monotonic arrival of that newest image
    instruction: str
    state: np.ndarray  # robot-unit state in joint_names order (float64)
    prompt_truncated: bool


class InputStore:
    """Newest valid inputs, thread-safe. Every rejected message is counted in ``rejected`` by reason.

    Args:
        camera_names: configured cameras (index i = the i-th camera subscription).
        joint_names: joints to pick from JointState messages, in state order.
        rejected: counter of rejected inputs (logs are throttled per reason).
        max_image_pixels: larger images are rejected before decoding.
        max_instruction_chars: longer instructions are truncated (counted).
        instruction: initial instruction ('' = none until one arrives).
    """

    def __init__(self, camera_names: Sequence[str], joint_names: Sequence[str],
                 rejected: ReasonCounter, max_image_pixels: int = 4096 * 4096, max_instruction_chars: int = 1000,
                 instruction: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self.camera_names = tuple(camera_names)
        self.joint_names = tuple(joint_names)
        self._joint_index = {n: i for i, n in enumerate(self.joint_names)}
        self.rejected = rejected
        self.max_image_pixels = int(max_image_pixels)
        self.max_instruction_chars = int(max_instruction_chars)
        self._clock = clock
        self._lock = threading.Lock()
        self._images: list[CameraImage | None] = [None] * len(self.camera_names)
        self._positions = np.full(len(self.joint_names), np.nan)
        self._seen = np.zeros(len(self.joint_names), dtype=bool)
        self._instruction: str | None = None
        if instruction:
            self._set_instruction(instruction)

    # ------------------------------------------------------------------------------------------ cameras
    def on_image(self, index: int, msg) -> bool:
        """A ``sensor_msgs/Image`` for camera ``index``; returns whether it was accepted."""
        cam = self.camera_names[index]
        h, w, enc = int(msg.height), int(msg.width), str(msg.encoding)
        if h <= 0 or w <= 0:
            return self._reject("image_zero_size", f"{cam}: {w}x{h}")
        if h * w > self.max_image_pixels:
            return self._reject("image_too_large", f"{cam}: {w}x{h} > max_image_pixels={self.max_image_pixels}")
        if enc not in SUPPORTED_ENCODINGS:
            return self._reject("image_bad_encoding", f"{cam}: {enc[:40]!r} (supported: "
                                f"{', '.join(SUPPORTED_ENCODINGS)})")
        try:
            rgb = image_msg_to_array(msg)
        except ImageError as e:
            return self._reject("image_bad_data", f"{cam}: {e}")
        return self._store(index, rgb, msg.header.stamp)

    def on_compressed(self, index: int, msg) -> bool:
        """A ``sensor_msgs/CompressedImage`` for camera ``index``; returns whether it was accepted."""
        cam = self.camera_names[index]
        size = len(msg.data)
        if size == 0:
            return self._reject("image_empty", f"{cam}: compressed image without data")
        if size > 3 * self.max_image_pixels:
            return self._reject("image_too_large", f"{cam}: {size} compressed bytes")
        try:
            rgb = compressed_msg_to_array(msg)
        except ImageError as e:
            return self._reject("image_undecodable", f"{cam}: {e}")
        if rgb.shape[0] * rgb.shape[1] > self.max_image_pixels:
            return self._reject("image_too_large", f"{cam}: {rgb.shape[1]}x{rgb.shape[0]}")
        return self._store(index, rgb, msg.header.stamp)

    def _store(self, index: int, rgb: np.ndarray, stamp) -> bool:
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8 or 0 in rgb.shape:
            return self._reject("image_bad_data", f"{self.camera_names[index]}: not an RGB uint8 image")
        image = CameraImage(rgb, stamp_to_ns(stamp), self._clock())
        with self._lock:
            self._images[index] = image
        return True

    # ------------------------------------------------------------------------------------------ state
    def on_joint_state(self, msg) -> bool:
        """A ``sensor_msgs/JointState``: configured joints are picked by name; others are ignored. Messages
        may carry a subset of the joints (several drivers): the newest value of each joint is kept."""
        names, positions = list(msg.name), np.asarray(msg.position, dtype=np.float64).reshape(-1)
        if not names or len(names) != positions.shape[0]:
            return self._reject("joint_state_malformed", f"{len(names)} names, {positions.shape[0]} positions")
        picks = [(self._joint_index[n], j) for j, n in enumerate(names) if n in self._joint_index]
        if not picks:
            shown = ", ".join(n[:40] for n in names[:5])
            return self._reject("joint_state_unknown_joints", f"none of joint_names in [{shown}]")
        dst, src = (np.array(x, dtype=np.intp) for x in zip(*picks, strict=True))
        values = positions[src]
        finite = bool(np.all(np.isfinite(values)))
        with self._lock:
            self._positions[dst] = values  # non-finite values are stored: the state is invalid until fixed
            self._seen[dst] = True
        if not finite:
            bad = [self.joint_names[i] for i, v in zip(dst, values, strict=True) if not math.isfinite(v)]
            return self._reject("state_not_finite", f"non-finite position for {', '.join(bad[:5])}")
        return True

    # ------------------------------------------------------------------------------------------ instruction
    def on_instruction(self, msg) -> bool:
        """A ``std_msgs/String`` instruction (stripped; too long ones are truncated and counted)."""
        return self._set_instruction(str(msg.data))

    def _set_instruction(self, text: str) -> bool:
        if len(text) > self.max_instruction_chars:
            self._reject("instruction_truncated", f"{len(text)} chars > max_instruction_chars="
                         f"{self.max_instruction_chars}")
            text = text[: self.max_instruction_chars]
        text = text.strip()
        if not text:
            return self._reject("instruction_empty", "empty instruction ignored")
        with self._lock:
            self._instruction = text
        return True

    # ------------------------------------------------------------------------------------------ access
    def _reject(self, reason: str, detail: str) -> bool:
        self.rejected.add(reason, detail)
        return False

    def snapshot(self) -> tuple[list[CameraImage | None], np.ndarray, np.ndarray, str | None]:
        """(images per camera, positions, seen mask, instruction), consistent with each other."""
        with self._lock:
            return list(self._images), self._positions.copy(), self._seen.copy(), self._instruction


class ObservationBuilder:
    """Builds the policy input for a control tick from an :class:`InputStore`.

    Args:
        store: the inputs (its camera names are the policy's camera slots they feed).
        policy: the checkpoint's contract (image conversion, normalisation, prompt).
        max_age_s: images older than this (node clock) make the frame stale.
    """

    def __init__(self, store: InputStore, policy: Policy, max_age_s: float) -> None:
        unknown = [c for c in store.camera_names if c not in policy.spec.camera_slots]
        if unknown:
            raise ValueError(f"camera_names {unknown} are not camera slots of the model "
                             f"{list(policy.spec.camera_slots)}")
        self.store = store
        self.policy = policy
        self.max_age_ns = int(max_age_s * 1e9)

    def build(self, now_ns: int) -> BuiltObservation | Skip:
        """The observation for a tick at node time ``now_ns``, or why the tick is skipped."""
        images, positions, seen, instruction = self.store.snapshot()
        for name, image in zip(self.store.camera_names, images, strict=True):
            if image is None:
                return Skip("missing_camera", f"no image from {name} yet")
            age = now_ns - image.stamp_ns
            if abs(age) > self.max_age_ns:
                return Skip("stale_camera", f"{name} image is {age / 1e9:.3f} s old (max {self.max_age_ns / 1e9:g} s)")
        if not seen.all():
            missing = [n for n, s in zip(self.store.joint_names, seen, strict=True) if not s]
            return Skip("no_state", f"no position yet for {', '.join(missing[:5])}")
        if not np.all(np.isfinite(positions)):
            return Skip("invalid_state", "joint state has NaN/Inf")
        if instruction is None:
            return Skip("no_instruction", "waiting for /instruction")

        names = self.store.camera_names
        raw = RawObservation({n: im.rgb for n, im in zip(names, images, strict=True)}, positions, instruction)
        converted = {n: im.pixels(self.policy.convert_image) for n, im in zip(names, images, strict=True)}
        try:
            prepared = self.policy.prepare(raw, converted)
        except ValueError as e:
            return Skip("bad_input", str(e))
        newest = max(images, key=lambda im: im.stamp_ns)
        return BuiltObservation(prepared, newest.stamp_ns, newest.received, instruction, positions,
                                prepared.prompt_truncated)
