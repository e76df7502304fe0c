"""Drive a running oxygen node from outside, over real DDS: start it as a child process (:class:`NodeProcess`),
feed it the synthetic scene and record what it publishes (:class:`Probe`). Used by the demo and the tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.msg import ActionChunk, LanguageOutput
from oxygen_ros.tools.demo_scene import joint_state, render_scene

from .image_conversion import array_to_image_msg
from .observation_builder import stamp_to_ns
from .publishers import time_msg

__all__ = ["NodeProcess", "Probe", "Received", "chunk_array", "header_ns", "ros_env", "yaml_value"]

REPO_ROOT = Path(__file__).resolve().parents[2]


def yaml_value(value: Any) -> str:
    """A parameter value as the YAML text ``-p name:=<text>`` expects (strings single-quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    raise TypeError(f"unsupported parameter value {value!r}")


def ros_env(domain_id: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a child ROS process on an isolated domain, discovering on localhost only."""
    env = dict(os.environ if base is None else base)
    env.update(ROS_DOMAIN_ID=str(domain_id), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", PYTHONUNBUFFERED="1",
               RCUTILS_COLORIZED_OUTPUT="0")
    return env


class NodeProcess:
    """``python -m oxygen_ros.ros.node`` (or another node ``module``) as a child process; its output goes to a log
    file.

    Args:
        params_file: a ROS params YAML (``--params-file``), or None.
        overrides: ``-p name:=value`` overrides.
        remaps: ``-r from:=to`` remappings.
        domain_id: ROS_DOMAIN_ID of the child.
        log_path: where stdout+stderr go (default: a temporary file).
        module: the node's module (``python -m <module> --ros-args ...``).
    """

    def __init__(self, params_file: str | Path | None = None, overrides: Mapping[str, Any] | None = None,
                 remaps: Mapping[str, str] | None = None, domain_id: int = 0, log_path: str | Path | None = None,
                 python: str = sys.executable, module: str = "oxygen_ros.ros.node") -> None:
        self.cmd = [python, "-m", module, "--ros-args"]
        if params_file is not None:
            self.cmd += ["--params-file", str(params_file)]
        for name, value in (overrides or {}).items():
            self.cmd += ["-p", f"{name}:={yaml_value(value)}"]
        for src, dst in (remaps or {}).items():
            self.cmd += ["-r", f"{src}:={dst}"]
        self.env = ros_env(domain_id)
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="oxygen_node_", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None

    def start(self) -> NodeProcess:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         cwd=REPO_ROOT, start_new_session=True)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        """Everything the node printed so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for_output(self, text: str, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if text in self.output():
                return True
            if not self.alive:
                return text in self.output()
            time.sleep(0.05)
        return False

    def stop(self, sig: int = signal.SIGINT, timeout: float = 15.0) -> int | None:
        """Send ``sig`` (default SIGINT, like Ctrl-C) and wait; kill after ``timeout``. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def __enter__(self) -> NodeProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class Received:
    """Everything the probe recorded (monotonic receive time, message)."""

    chunks: list[tuple[float, ActionChunk]] = field(default_factory=list)
    language: list[tuple[float, LanguageOutput]] = field(default_factory=list)
    trajectories: list[tuple[float, JointTrajectory]] = field(default_factory=list)
    diagnostics: dict[str, str] = field(default_factory=dict)  # newest values of the node's status
    diagnostic_level: int = -1
    diagnostic_message: str = ""


class Probe:
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
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = Node(name, context=self.context)
        self.received = Received()
        self._lock = threading.Lock()
        cam_qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT if best_effort
                             else ReliabilityPolicy.RELIABLE)
        n = self.node
        self.camera_pubs = {cam: n.create_publisher(CompressedImage if cam in self.compressed else Image, topic,
                                                    cam_qos) for cam, topic in self.cameras}
        ns = "/" + inputs_ns.strip("/") if inputs_ns.strip("/") else ""
        self.joint_pub = n.create_publisher(JointState, f"{ns}/joint_states", 10)
        self.instruction_pub = n.create_publisher(String, f"{ns}/instruction", QoSProfile(
            depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL))
        n.create_subscription(ActionChunk, f"{node}/action_chunk", self._record("chunks"), 100)
        n.create_subscription(LanguageOutput, f"{node}/language_output", self._record("language"), 100)
        n.create_subscription(JointTrajectory, trajectory_topic or f"{node}/trajectory",
                              self._record("trajectories"), 100)
        self._diag_name = f"{node.rsplit('/', 1)[-1]}: inference"
        n.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(n)
        self._spin_thread = threading.Thread(target=self._spin, daemon=True, name="probe-spin")
        self._spin_thread.start()
        self._stream_timer = None
        self._stream_cameras: set[str] | None = None
        self._t0 = time.monotonic()
        self.sent_stamps: list[int] = []

    # ------------------------------------------------------------------------------------------ spinning
    def _spin(self) -> None:
        with contextlib.suppress(Exception):  # the context was shut down
            self.executor.spin()

    def close(self) -> None:
        self.stop_stream()
        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)
        self._spin_thread.join(timeout=2.0)

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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
        with self._lock:
            return [m for t, m in self.received.chunks if t >= since]

    def language(self, since: float = 0.0) -> list[LanguageOutput]:
        with self._lock:
            return [m for t, m in self.received.language if t >= since]

    def trajectories(self, since: float = 0.0) -> list[JointTrajectory]:
        with self._lock:
            return [m for t, m in self.received.trajectories if t >= since]

    def diagnostics(self) -> dict[str, str]:
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
        """Poll ``predicate`` until it is true or ``timeout`` seconds pass."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return True
            time.sleep(poll)
        return bool(predicate())

    def wait_for_subscribers(self, timeout: float = 10.0) -> bool:
        """Wait until the node subscribes to every camera topic (discovery done)."""
        pubs = list(self.camera_pubs.values())
        return self.wait_for(lambda: all(p.get_subscription_count() > 0 for p in pubs), timeout)

    # ------------------------------------------------------------------------------------------ publishing
    def now_ns(self) -> int:
        return self.node.get_clock().now().nanoseconds

    def publish_instruction(self, text: str) -> None:
        self.instruction_pub.publish(String(data=text))

    def publish_joints(self, t: float, names: Iterable[str] | None = None,
                       positions: Sequence[float] | None = None, stamp_ns: int | None = None) -> None:
        names = list(names if names is not None else self.joint_names)
        msg = JointState(name=names)
        msg.header.stamp = time_msg(self.now_ns() if stamp_ns is None else stamp_ns)
        msg.position = list(map(float, positions if positions is not None else joint_state(t, names)))
        self.joint_pub.publish(msg)

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
        self.publish_joints(t, stamp_ns=stamp)
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
        if self._stream_timer is not None:
            self.node.destroy_timer(self._stream_timer)
            self._stream_timer = None

    def stamps_sent(self) -> set[int]:
        with self._lock:
            return set(self.sent_stamps)


def chunk_array(chunk: ActionChunk) -> np.ndarray:
    """An ActionChunk's actions as [horizon, action_dim]."""
    return np.asarray(chunk.actions, dtype=np.float32).reshape(chunk.horizon, chunk.action_dim)


def header_ns(msg: Any) -> int:
    """A message's header stamp in nanoseconds."""
    return stamp_to_ns(msg.header.stamp)
