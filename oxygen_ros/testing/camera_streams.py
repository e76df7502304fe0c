"""Camera streams at robot sizes, published the way a camera driver publishes them (:class:`CameraStreamer`):
raw ``sensor_msgs/Image`` (rgb8) or JPEG ``CompressedImage`` at a fixed rate, sensor-data QoS (BEST_EFFORT,
KEEP_LAST 1), stamped with the publisher's clock (plus an optional offset, to simulate a lagging camera).

Images are generated and encoded once (a few distinct frames per stream), so publishing costs what a driver's
publish costs. Used by the camera tests, the camera benchmark and, as a separate process, by hand::

    python -m oxygen_ros.testing.camera_streams /cam/a:640x480:rgb8 /cam/b:1280x720:jpeg --rate 30 --duration 10
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
import rclpy
from rclpy.context import Context
from rclpy.node import Node
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String

from oxygen_ros.ros import qos
from oxygen_ros.ros.image_conversion import array_to_image_msg
from oxygen_ros.ros.stamps import time_msg

__all__ = ["CameraStreamer", "JointStreamer", "StreamSpec", "main", "make_frames", "parse_stream"]

ENCODINGS = ("rgb8", "jpeg")


@dataclass(frozen=True)
class StreamSpec:
    """One camera stream: topic, size, ``rgb8`` (Image) or ``jpeg`` (CompressedImage), rate, stamp offset."""

    topic: str
    width: int = 640
    height: int = 480
    encoding: str = "rgb8"
    rate_hz: float = 30.0
    stamp_offset_s: float = 0.0  # added to the stamp (negative: the camera's stamps lag behind)

    @property
    def compressed(self) -> bool:
        return self.encoding == "jpeg"


def parse_stream(text: str, rate_hz: float = 30.0) -> StreamSpec:
    """``topic[:WxH[:rgb8|jpeg]]`` -> :class:`StreamSpec`."""
    topic, *rest = text.split(":")
    width, height = (int(v) for v in rest[0].lower().split("x")) if rest else (640, 480)
    encoding = rest[1] if len(rest) > 1 else "rgb8"
    if encoding not in ENCODINGS:
        raise ValueError(f"{text}: encoding must be one of {ENCODINGS}")
    return StreamSpec(topic, width, height, encoding, rate_hz)


def make_frames(spec: StreamSpec, n: int, seed: int) -> list[Image | CompressedImage]:
    """``n`` distinct textured frames (gradients + noise: JPEG sizes like a real scene's, not a flat image's)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:spec.height, 0:spec.width]
    out: list[Image | CompressedImage] = []
    for i in range(n):
        base = np.stack([(xx + 8 * i) % 256, (yy + 5 * i) % 256, (xx + yy) // 4 % 256], axis=-1)
        rgb = np.clip(base + rng.integers(-12, 13, base.shape), 0, 255).astype(np.uint8)
        if spec.compressed:
            msg = CompressedImage(format="jpeg")
            msg.data = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])[1] \
                .tobytes()
        else:
            msg = array_to_image_msg(rgb)
        msg.header.frame_id = spec.topic.strip("/").replace("/", "_")
        out.append(msg)
    return out


class CameraStreamer:
    """Publishes ``specs`` from one thread until :meth:`stop` (each stream on its own schedule).

    Args:
        specs: the streams.
        node: an rclpy node to create the publishers on; None creates one in its own context.
        domain_id: ROS domain of the own context (when ``node`` is None).
        best_effort: publishers' reliability (camera drivers: BEST_EFFORT).
        frames: distinct frames generated per stream.
    """

    def __init__(self, specs: Sequence[StreamSpec], node: Node | None = None, domain_id: int | None = None,
                 best_effort: bool = True, frames: int = 6, name: str = "camera_streamer") -> None:
        self.specs = list(specs)
        self._context: Context | None = None
        if node is None:
            self._context = Context()
            rclpy.init(context=self._context, domain_id=domain_id)
            node = Node(name, context=self._context)
        self.node = node
        profile = qos.camera(best_effort)
        self._pubs = [node.create_publisher(CompressedImage if s.compressed else Image, s.topic, profile)
                      for s in self.specs]
        self._frames = [make_frames(s, frames, seed=i) for i, s in enumerate(self.specs)]
        self.sent = [0] * len(self.specs)
        self.bytes = [len(f[0].data) for f in self._frames]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def subscribed(self) -> bool:
        """Every stream's topic has a subscription (discovery done)."""
        return all(p.get_subscription_count() > 0 for p in self._pubs)

    def start(self) -> CameraStreamer:
        """Start publishing (a no-op when running); returns self."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="camera-streamer", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop publishing (the publishers stay)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def close(self) -> None:
        """Stop, destroy the own node and context (a node passed in is left to its owner)."""
        self.stop()
        if self._context is not None:
            self.node.destroy_node()
            rclpy.try_shutdown(context=self._context)
            self._context = None

    def __enter__(self) -> CameraStreamer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        t0 = time.monotonic()
        due = [t0 + i * 0.002 for i in range(len(self.specs))]  # streams slightly apart, like real drivers
        clock = self.node.get_clock()
        while not self._stop.is_set():
            i = min(range(len(due)), key=due.__getitem__)
            wait = due[i] - time.monotonic()
            if wait > 0 and self._stop.wait(wait):
                break
            spec = self.specs[i]
            msg = self._frames[i][self.sent[i] % len(self._frames[i])]
            msg.header.stamp = time_msg(clock.now().nanoseconds + round(spec.stamp_offset_s * 1e9))
            try:
                self._pubs[i].publish(msg)
            except Exception:  # the context is shutting down
                break
            self.sent[i] += 1
            due[i] += 1.0 / spec.rate_hz
            if due[i] < time.monotonic() - 1.0:  # far behind (a stalled host): resynchronise, no burst
                due[i] = time.monotonic()


class JointStreamer:
    """Publishes ``joint_states`` (slowly moving positions, stamped now) at ``rate_hz`` on ``node`` until
    :meth:`stop`, and the ``instruction`` (latched) once, as a robot's drivers and task layer would."""

    def __init__(self, node: Node, names: Sequence[str], rate_hz: float, instruction: str = "") -> None:
        self.node, self.names = node, list(names)
        self._pub = node.create_publisher(JointState, "joint_states", qos.reliable())
        if instruction:
            node.create_publisher(String, "instruction", qos.latched()).publish(String(data=instruction))
        self.sent = 0
        self._period = 1.0 / rate_hz
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="joint-streamer", daemon=True)

    def start(self) -> JointStreamer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        due, clock = time.monotonic(), self.node.get_clock()
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            now = clock.now().nanoseconds
            msg = JointState(name=self.names, position=[0.1 * np.sin(now / 1e9 + i) for i in range(len(self.names))])
            msg.header.stamp = time_msg(now)
            try:
                self._pub.publish(msg)
            except Exception:  # the context is shutting down
                break
            self.sent += 1
            due = max(due + self._period, time.monotonic() - 1.0)  # far behind: resynchronise, no burst


def main(argv: Sequence[str] | None = None) -> None:
    """Publish camera streams (``topic:WxH:rgb8|jpeg``) for ``--duration`` seconds, then print what was sent;
    with ``--joints``, also ``joint_states`` at ``--joint-rate`` (and ``--instruction``, latched)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("streams", nargs="+", help="topic[:WxH[:rgb8|jpeg]]")
    ap.add_argument("--rate", type=float, default=30.0)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--reliable", action="store_true", help="RELIABLE publishers (default BEST_EFFORT)")
    ap.add_argument("--wait", type=float, default=10.0,
                    help="seconds to wait for every topic's subscriber before publishing (0: start at once)")
    ap.add_argument("--joints", default="", help="comma-separated joint names to publish on joint_states")
    ap.add_argument("--joint-rate", type=float, default=50.0)
    ap.add_argument("--instruction", default="", help="an instruction to publish (latched) on instruction")
    args = ap.parse_args(argv)
    streamer = CameraStreamer([parse_stream(s, args.rate) for s in args.streams], best_effort=not args.reliable)
    joints = None
    try:
        end = time.monotonic() + args.wait
        while not streamer.subscribed() and time.monotonic() < end:  # discovery first: nothing is lost to it
            time.sleep(0.05)
        if args.joints:
            joints = JointStreamer(streamer.node, args.joints.split(","), args.joint_rate, args.instruction).start()
        streamer.start()
        print(f"streaming {len(streamer.specs)} camera(s) for {args.duration:g} s", flush=True)
        time.sleep(args.duration)
    finally:
        if joints is not None:
            joints.stop()
        streamer.close()
    if joints is not None:
        print(f"joint_states: {joints.sent} sent", flush=True)
    for spec, n, size in zip(streamer.specs, streamer.sent, streamer.bytes, strict=True):
        print(f"{spec.topic}: {n} sent ({spec.width}x{spec.height} {spec.encoding}, {size} bytes)", flush=True)


if __name__ == "__main__":
    main()
