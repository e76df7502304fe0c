"""The node's newest valid inputs (:class:`InputStore`): per camera its last few images, the joint positions and
the instruction. Subscription callbacks call its ``on_*`` methods, which validate each message cheaply (off the
control thread; images are decoded only when a frame uses them, :mod:`.camera_image`) and count every rejected
message by reason. Nothing here needs a running node; it is unit-tested with plain messages.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from oxygen_ros.robot.newest import NewestPerPublisher

from .camera_image import CAMERA_BUFFER_DEPTH, FUTURE_TOLERANCE_NS, RATE_WINDOW_S, CameraImage, CameraStatus
from .diagnostics import ReasonCounter
from .image_conversion import SUPPORTED_ENCODINGS, ImageError, check_image_msg, compressed_image_size
from .stamps import stamp_to_ns

__all__ = ["InputStore"]


class InputStore:
    """Newest valid inputs, thread-safe: per camera its last CAMERA_BUFFER_DEPTH images (checked, not decoded),
    the joint positions and the instruction. Every rejected message is counted in ``rejected`` by reason.

    Args:
        camera_names: configured cameras (index i = the i-th camera subscription).
        joint_names: joints to pick from JointState messages, in state order.
        rejected: counter of rejected inputs (logs are throttled per reason).
        max_image_pixels: larger images are rejected before decoding.
        max_instruction_chars: longer instructions are cut to this many characters (counted); 0 = no cap. The
            exact limit is the prompt's: a frame whose prompt would overflow cuts the instruction at a token
            boundary so that the state fits (:class:`oxygen_ros.policy.PreparedObservation`.instruction_cut).
        instruction: initial instruction ('' = none until one arrives).
        clock: monotonic seconds, for arrival times (latency).
        node_clock_ns: node time in nanoseconds, for joint ages (follows /clock in bag replay); None = ``clock``.
            When given, camera stamps more than FUTURE_TOLERANCE_S ahead of it are rejected on arrival
            (``image_from_future``); without it the builder drops them at the tick.
        max_image_age_s: with ``node_clock_ns``, an image already older than this on arrival is rejected
            (``image_too_old``): no frame could use it. 0 = no check.
    """

    def __init__(self, camera_names: Sequence[str], joint_names: Sequence[str],
                 rejected: ReasonCounter, max_image_pixels: int = 4096 * 4096, max_instruction_chars: int = 0,
                 instruction: str = "", clock: Callable[[], float] = time.monotonic,
                 node_clock_ns: Callable[[], int] | None = None, max_image_age_s: float = 0.0) -> None:
        self.camera_names = tuple(camera_names)
        self.max_image_age_ns = int(max_image_age_s * 1e9)
        self.joint_names = tuple(joint_names)
        self._joint_index = {n: i for i, n in enumerate(self.joint_names)}
        self.rejected = rejected
        self.max_image_pixels = int(max_image_pixels)
        self.max_instruction_chars = int(max_instruction_chars)
        self._clock = clock
        self._node_clock_ns = node_clock_ns or (lambda: int(clock() * 1e9))
        self._lock = threading.Lock()
        n_cams = len(self.camera_names)
        self._buffers: list[deque[CameraImage]] = [deque(maxlen=CAMERA_BUFFER_DEPTH) for _ in range(n_cams)]
        self._arrivals: list[deque[float]] = [deque(maxlen=512) for _ in range(n_cams)]  # monotonic, all messages
        self._received = [0] * n_cams  # messages that reached the store (accepted or not)
        self._stamp_clock_ns = node_clock_ns  # header stamps are compared with the node clock only when given
        self._positions = np.full(len(self.joint_names), np.nan)
        self._seen = np.zeros(len(self.joint_names), dtype=bool)
        self._joint_arrival_ns = np.zeros(len(self.joint_names), dtype=np.int64)  # node clock, per joint
        self._instruction: str | None = None
        self._instruction_new = NewestPerPublisher()  # each publisher's newest instruction only
        self._instruction_owned = False  # a ~/run goal owns the instruction: the topic's messages are ignored
        self.instructions_ignored = 0  # topic instructions ignored while a ~/run goal owned the instruction
        if instruction:
            self._set_instruction(instruction)

    # ------------------------------------------------------------------------------------------ cameras
    def on_image(self, index: int, msg) -> bool:
        """A ``sensor_msgs/Image`` for camera ``index``: cheap checks now, decoding when a frame uses it; returns
        whether it was accepted."""
        cam = self._arrived(index)
        h, w, enc = int(msg.height), int(msg.width), str(msg.encoding)
        if h <= 0 or w <= 0:
            return self._reject("image_zero_size", f"{cam}: {w}x{h}")
        if h * w > self.max_image_pixels:
            return self._reject("image_too_large", f"{cam}: {w}x{h} > max_image_pixels={self.max_image_pixels}")
        if enc not in SUPPORTED_ENCODINGS:
            return self._reject("image_bad_encoding", f"{cam}: {enc[:40]!r} (supported: "
                                f"{', '.join(SUPPORTED_ENCODINGS)})")
        try:
            check_image_msg(msg)
        except ImageError as e:
            return self._reject("image_bad_data", f"{cam}: {e}")
        return self._store(index, msg, False)

    def on_compressed(self, index: int, msg) -> bool:
        """A ``sensor_msgs/CompressedImage`` for camera ``index``: size and (JPEG / PNG) header checked now,
        decoded when a frame uses it; returns whether it was accepted."""
        cam = self._arrived(index)
        try:
            size = len(msg.data)
        except TypeError:
            return self._reject("image_undecodable", f"{cam}: data is not a byte sequence")
        if size == 0:
            return self._reject("image_empty", f"{cam}: compressed image without data")
        if size > 3 * self.max_image_pixels:
            return self._reject("image_too_large", f"{cam}: {size} compressed bytes")
        try:
            dims = compressed_image_size(msg.data)
        except ImageError as e:
            return self._reject("image_undecodable", f"{cam}: {e}")
        if dims is not None and dims[0] * dims[1] > self.max_image_pixels:
            return self._reject("image_too_large", f"{cam}: {dims[0]}x{dims[1]} > max_image_pixels="
                                f"{self.max_image_pixels}")
        return self._store(index, msg, True)

    def _arrived(self, index: int) -> str:
        now = self._clock()
        with self._lock:
            self._received[index] += 1
            self._arrivals[index].append(now)
        return self.camera_names[index]

    def _store(self, index: int, msg, compressed: bool) -> bool:
        stamp_ns = stamp_to_ns(msg.header.stamp)
        if stamp_ns <= 0:  # a driver that does not stamp: its age and the actions' time are unknown
            return self._reject("image_unstamped", f"{self.camera_names[index]}: header.stamp is 0 (the node needs "
                                "capture stamps to judge freshness, synchronise cameras and stamp the actions)")
        if self._stamp_clock_ns is not None:
            ahead = stamp_ns - self._stamp_clock_ns()
            if ahead > FUTURE_TOLERANCE_NS:
                return self._reject("image_from_future", f"{self.camera_names[index]}: stamped {ahead / 1e9:.3f} s "
                                    "ahead of the node clock (unsynchronised clocks, or use_sim_time without "
                                    "/clock?)")
            if self.max_image_age_ns and -ahead > self.max_image_age_ns:
                return self._reject("image_too_old", f"{self.camera_names[index]}: {-ahead / 1e9:.3f} s old on "
                                    f"arrival > max_image_age_s={self.max_image_age_ns / 1e9:g} (a slow transport, "
                                    "a late replay, or unsynchronised clocks)")
        image = CameraImage(msg, compressed, stamp_ns, self._clock(), self.camera_names[index])
        with self._lock:
            self._buffers[index].append(image)
        return True

    def camera_buffers(self) -> list[list[CameraImage]]:
        """Per camera its recent accepted images (oldest first, at most CAMERA_BUFFER_DEPTH)."""
        with self._lock:
            return [list(b) for b in self._buffers]

    def discard(self, index: int, image: CameraImage) -> None:
        """Drop ``image`` from camera ``index``'s buffer (it failed to decode, or is unusable)."""
        with self._lock:
            if image in self._buffers[index]:
                self._buffers[index].remove(image)

    def _newest(self, index: int) -> CameraImage | None:
        """Camera ``index``'s newest accepted image (call with the lock held)."""
        buffer = self._buffers[index]
        return buffer[-1] if buffer else None

    def camera_status(self, window_s: float = RATE_WINDOW_S) -> list[CameraStatus]:
        """Per camera: messages received, receive rate over the last ``window_s`` seconds, newest accepted image."""
        now = self._clock()
        with self._lock:
            out = []
            for i, name in enumerate(self.camera_names):
                arrivals = self._arrivals[i]
                recent = sum(1 for t in arrivals if now - t <= window_s)
                newest = self._newest(i)
                out.append(CameraStatus(name, self._received[i], recent / window_s,
                                        arrivals[-1] if arrivals else None,
                                        None if newest is None else newest.stamp_ns))
            return out

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
        arrival = self._node_clock_ns()
        with self._lock:
            self._positions[dst] = values  # non-finite values are stored: the state is invalid until fixed
            self._seen[dst] = True
            self._joint_arrival_ns[dst] = arrival
        if not finite:
            bad = [self.joint_names[i] for i, v in zip(dst, values, strict=True) if not math.isfinite(v)]
            return self._reject("state_not_finite", f"non-finite position for {', '.join(bad[:5])}")
        return True

    # ------------------------------------------------------------------------------------------ instruction
    def on_instruction(self, msg, info: Mapping[str, Any] | None = None) -> bool:
        """A ``std_msgs/String`` instruction (stripped; too long ones are cut and counted).

        ``info`` is rclpy's message info: the node subscribes twice (a transient-local subscription for latched
        instructions, a volatile one for volatile publishers), so a transient-local publisher's messages arrive
        twice; a message not newer than the last one taken from the same publisher is ignored (not counted).
        """
        if not self._instruction_new.is_new(info):
            return False
        with self._lock:
            if self._instruction_owned:
                self.instructions_ignored += 1
                return False
        return self._set_instruction(str(msg.data))

    def own_instruction(self, text: str) -> bool:
        """A ``~/run`` goal sets the instruction and owns it: until :meth:`release_instruction`, instructions from
        the topic are ignored (counted in :attr:`instructions_ignored`). False: the text is empty (not taken)."""
        if not self._set_instruction(text):
            return False
        with self._lock:
            self._instruction_owned = True
        return True

    def release_instruction(self) -> None:
        """The goal ended: its instruction stays until the topic sends a new one."""
        with self._lock:
            self._instruction_owned = False

    def _set_instruction(self, text: str) -> bool:
        cap = self.max_instruction_chars
        if cap and len(text) > cap:
            self._reject("instruction_truncated", f"{len(text)} chars > max_instruction_chars={cap}")
            text = text[:cap]
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

    @property
    def instruction(self) -> str | None:
        """The current instruction (None until one arrives)."""
        with self._lock:
            return self._instruction

    def joint_arrivals_ns(self) -> np.ndarray:
        """Node-clock arrival time of each joint's newest position (0 = never)."""
        with self._lock:
            return self._joint_arrival_ns.copy()

    def present_joints(self) -> tuple[np.ndarray, np.ndarray]:
        """(each joint's newest position (NaN = never received), its node-clock arrival time), consistent."""
        with self._lock:
            positions = np.where(self._seen, self._positions, np.nan)
            return positions, self._joint_arrival_ns.copy()

    def snapshot(self) -> tuple[list[CameraImage | None], np.ndarray, np.ndarray, str | None]:
        """(images per camera, positions, seen mask, instruction), consistent with each other."""
        with self._lock:
            images = [self._newest(i) for i in range(len(self.camera_names))]
            return images, self._positions.copy(), self._seen.copy(), self._instruction
