"""A helper node that drives a running oxygen node over real DDS (:class:`Probe`): it publishes the synthetic scene
(:mod:`oxygen_ros.testing.synthetic_scene`: cameras, joint states, instruction) and records the node's action chunks,
language outputs, trajectories and diagnostics. Used by the demo and the tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.msg import ActionChunk, LanguageOutput
from oxygen_ros.ros import qos
from oxygen_ros.ros.image_conversion import array_to_image_msg
from oxygen_ros.ros.stamps import stamp_to_ns, time_msg
from oxygen_ros.testing.synthetic_scene import joint_state, render_scene

from .spun_node import SpunNode

__all__ = ["Probe", "Received", "chunk_array", "header_ns", "joint_state_msg", "wait_for"]


def joint_state_msg(names: Sequence[str], positions: Sequence[float], stamp_ns: int) -> JointState:
    """A ``sensor_msgs/JointState`` with ``positions`` (as floats) for ``names``, stamped ``stamp_ns``."""
    msg = JointState(name=list(names))
    msg.header.stamp = time_msg(stamp_ns)
    msg.position = [float(p) for p in positions]
    return msg


@dataclass
class Received:
    """Everything the probe recorded (monotonic receive time, message)."""

    chunks: list[tuple[float, ActionChunk]] = field(default_factory=list)
    language: list[tuple[float, LanguageOutput]] = field(default_factory=list)
    trajectories: list[tuple[float, JointTrajectory]] = field(default_factory=list)
    diagnostics: dict[str, str] = field(default_factory=dict)  # newest values of the node's status
    diagnostic_level: int = -1
    diagnostic_message: str = ""


def wait_for(predicate: Callable[[], bool], timeout: float, poll: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(poll)
    return bool(predicate())


class Probe(SpunNode):
    """A helper node: publishes the synthetic scene (cameras, joint states, instruction) and records the
    oxygen node's action chunks, language outputs, trajectories and diagnostics.

    Args:
        cameras: (camera name, topic) pairs; the name picks the scene viewpoint.
        joint_names: joints published on ``joint_states``.
        node: fully qualified name of the oxygen node (its output topics live under it).
        image_size: side of the published square images.
        best_effort: camera publishers' reliability (sensor-data style by default).
        compressed: cameras published as jpeg ``sensor_msgs/CompressedImage``.
        inputs_ns: namespace of the node's relative inputs (``<ns>/joint_states``, ``<ns>/instruction``).
        trajectory_topic: where to listen for JointTrajectory (default ``<node>/trajectory``).
        domain_id: ROS domain of the probe's own context.
    """

    def __init__(self, cameras: Sequence[tuple[str, str]], joint_names: Sequence[str], node: str = "/oxygen",
                 image_size: int = 64, best_effort: bool = True, trajectory_topic: str | None = None,
                 domain_id: int | None = None, name: str = "oxygen_probe", compressed: Iterable[str] = (),
                 inputs_ns: str = "") -> None:
        self.cameras = list(cameras)
        self.compressed = set(compressed)
        self.joint_names = list(joint_names)
        self.image_size = image_size
        super().__init__(name, domain_id)
        self.received = Received()
        self._lock = threading.Lock()
        cam_qos = qos.camera(best_effort)
        n = self.node
        self.camera_pubs = {cam: n.create_publisher(CompressedImage if cam in self.compressed else Image, topic,
                                                    cam_qos) for cam, topic in self.cameras}
        ns = "/" + inputs_ns.strip("/") if inputs_ns.strip("/") else ""
        self.joint_pub = n.create_publisher(JointState, f"{ns}/joint_states", 10)
        self.instruction_pub = n.create_publisher(String, f"{ns}/instruction", qos.latched())
        n.create_subscription(ActionChunk, f"{node}/action_chunk", self._record("chunks"), 100)
        n.create_subscription(LanguageOutput, f"{node}/language_output", self._record("language"), 100)
        n.create_subscription(JointTrajectory, trajectory_topic or f"{node}/trajectory",
                              self._record("trajectories"), 100)
        self._diag_name = f"{node.rsplit('/', 1)[-1]}: inference"
        n.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self.start_spinning("probe-spin")
        self._stream_timer = None
        self._stream_cameras: set[str] | None = None
        self.stream_joints: list[str] | None = None  # joints each frame publishes (None = all, [] = none)
        self._t0 = time.monotonic()
        self.sent_stamps: list[int] = []

    def close(self) -> None:
        """Stop the stream, the executor and the node; shut the probe's context down."""
        self.stop_stream()
        super().close()

    def __enter__(self) -> Probe:
        return self

    # ------------------------------------------------------------------------------------------ recording
    def _record(self, what: str) -> Callable[[Any], None]:
        def callback(msg: Any) -> None:
            with self._lock:
                getattr(self.received, what).append((time.monotonic(), msg))
        return callback

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name == self._diag_name:
                with self._lock:
                    self.received.diagnostics = {kv.key: kv.value for kv in status.values}
                    self.received.diagnostic_level = int.from_bytes(status.level, "little") \
                        if isinstance(status.level, bytes) else int(status.level)
                    self.received.diagnostic_message = status.message

    def chunks(self, since: float = 0.0) -> list[ActionChunk]:
        """Action chunks received at or after monotonic time ``since``."""
        with self._lock:
            return [m for t, m in self.received.chunks if t >= since]

    def language(self, since: float = 0.0) -> list[LanguageOutput]:
        """Language outputs received at or after monotonic time ``since``."""
        with self._lock:
            return [m for t, m in self.received.language if t >= since]

    def trajectories(self, since: float = 0.0) -> list[JointTrajectory]:
        """Trajectories received at or after monotonic time ``since``."""
        with self._lock:
            return [m for t, m in self.received.trajectories if t >= since]

    def diagnostics(self) -> dict[str, str]:
        """The newest key/values of the node's inference diagnostics status."""
        with self._lock:
            return dict(self.received.diagnostics)

    def diagnostic_count(self, key: str) -> int:
        """An integer diagnostics value (0 when absent)."""
        value = self.diagnostics().get(key, "0")
        try:
            return int(float(value))
        except ValueError:
            return 0

    def wait_for(self, predicate: Callable[[], bool], timeout: float, poll: float = 0.05) -> bool:
        """Poll ``predicate`` until it is true or ``timeout`` seconds pass (:func:`wait_for`)."""
        return wait_for(predicate, timeout, poll)

    def wait_for_subscribers(self, timeout: float = 10.0) -> bool:
        """Wait until the node subscribes to every camera topic (discovery done)."""
        pubs = list(self.camera_pubs.values())
        return self.wait_for(lambda: all(p.get_subscription_count() > 0 for p in pubs), timeout)

    # ------------------------------------------------------------------------------------------ publishing
    def now_ns(self) -> int:
        """The probe node's clock (nanoseconds)."""
        return self.node.get_clock().now().nanoseconds

    def publish_instruction(self, text: str) -> None:
        """Publish ``text`` on ``instruction`` (transient local: late joiners get it too)."""
        self.instruction_pub.publish(String(data=text))

    def publish_joints(self, t: float, names: Iterable[str] | None = None,
                       positions: Sequence[float] | None = None, stamp_ns: int | None = None) -> None:
        """Publish ``positions`` (default: the synthetic scene's at time ``t``) for ``names`` (default: the probe's
        joints), stamped ``stamp_ns`` (default: now)."""
        names = list(names if names is not None else self.joint_names)
        positions = positions if positions is not None else joint_state(t, names)
        self.joint_pub.publish(joint_state_msg(names, positions, self.now_ns() if stamp_ns is None else stamp_ns))

    def publish_frame(self, t: float | None = None, cameras: Iterable[str] | None = None,
                      stamp_ns: int | None = None) -> int:
        """One synthetic frame: every (or the given) camera with one shared stamp, plus joint states.
        Returns the stamp (nanoseconds, probe clock unless given)."""
        t = time.monotonic() - self._t0 if t is None else t
        stamp = self.now_ns() if stamp_ns is None else stamp_ns
        wanted = set(cameras) if cameras is not None else None
        for cam, _ in self.cameras:
            if wanted is None or cam in wanted:
                rgb = render_scene(t, cam, self.image_size)
                if cam in self.compressed:
                    msg = CompressedImage(format="jpeg")
                    msg.header.stamp, msg.header.frame_id = time_msg(stamp), cam
                    msg.data = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))[1].tobytes()
                else:
                    msg = array_to_image_msg(rgb, stamp, frame_id=cam)
                self.camera_pubs[cam].publish(msg)
        joints = self.joint_names if self.stream_joints is None else self.stream_joints
        if joints:
            self.publish_joints(t, names=joints, stamp_ns=stamp)
        with self._lock:
            self.sent_stamps.append(stamp)
        return stamp

    def start_stream(self, rate_hz: float, cameras: Iterable[str] | None = None) -> None:
        """Publish frames at ``rate_hz`` from the probe's executor until :meth:`stop_stream`."""
        self.stop_stream()
        self._stream_cameras = None if cameras is None else set(cameras)
        self._stream_timer = self.node.create_timer(
            1.0 / rate_hz, lambda: self.publish_frame(cameras=self._stream_cameras))

    def set_stream_cameras(self, cameras: Iterable[str] | None) -> None:
        """Change which cameras the stream publishes (None = all)."""
        self._stream_cameras = None if cameras is None else set(cameras)

    def stop_stream(self) -> None:
        """Stop the frame stream of :meth:`start_stream` (no-op when none runs)."""
        if self._stream_timer is not None:
            self.node.destroy_timer(self._stream_timer)
            self._stream_timer = None

    def stamps_sent(self) -> set[int]:
        """Stamps of every frame published so far."""
        with self._lock:
            return set(self.sent_stamps)


def chunk_array(chunk: ActionChunk) -> np.ndarray:
    """An ActionChunk's actions as [horizon, action_dim]."""
    return np.asarray(chunk.actions, dtype=np.float32).reshape(chunk.horizon, chunk.action_dim)


def header_ns(msg: Any) -> int:
    """A message's header stamp in nanoseconds."""
    return stamp_to_ns(msg.header.stamp)
