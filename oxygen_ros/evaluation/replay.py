"""Replay a rosbag2 (sqlite3 or mcap) onto ROS 2 topics without ros2cli/rosbag2, using rosbags + rclpy
(``oxygen-replay-bag``).

The bag's raw CDR payloads are published as they are (rclpy ``publish`` accepts serialized bytes), paced by
the bag timestamps divided by ``rate``. With ``clock`` the bag time is published on /clock (rosgraph_msgs/Clock)
before every message and at ``clock_hz`` in between, so nodes with ``use_sim_time`` follow the bag; on
``loop`` the clock jumps back to the bag start, as ``ros2 bag play --loop`` does.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import rclpy
from rclpy.context import Context
from rclpy.node import Node
from rclpy.publisher import Publisher
from rosbags.highlevel import AnyReader
from rosgraph_msgs.msg import Clock

from oxygen_ros.ros import qos
from oxygen_ros.ros.stamps import time_msg

__all__ = ["CLOCK_TOPIC", "DEFAULT_LATCHED", "BagReplayer", "ReplayStats", "message_class"]

CLOCK_TOPIC = "/clock"
DEFAULT_LATCHED: tuple[str, ...] = ("/instruction",)
_POLL_S = 0.1  # longest sleep between checks of stop() / context shutdown


def message_class(msgtype: str) -> type:
    """The rclpy message class for a type name such as ``sensor_msgs/msg/Image`` (or ``sensor_msgs/Image``)."""
    parts = msgtype.split("/")
    if len(parts) == 2:
        parts = [parts[0], "msg", parts[1]]
    if len(parts) != 3 or parts[1] != "msg" or not all(parts):
        raise LookupError(f"not a message type name: {msgtype!r}")
    pkg, _, name = parts
    try:
        return getattr(importlib.import_module(f"{pkg}.msg"), name)
    except (ImportError, AttributeError) as exc:
        raise LookupError(f"message type {msgtype} is not importable as {pkg}.msg.{name}: {exc}") from exc


@dataclass
class ReplayStats:
    """What one :meth:`BagReplayer.run` published."""

    published: dict[str, int] = field(default_factory=dict)  # topic -> messages
    clock_published: int = 0
    passes: int = 0  # complete passes through the bag
    wall_s: float = 0.0
    interrupted: bool = False  # stopped by stop(), max_duration or ROS shutdown before the end

    @property
    def total(self) -> int:
        return sum(self.published.values())


class BagReplayer:
    """Publishes a bag's messages in (scaled) real time from an rclpy node of its own.

    rclpy must be initialised (``context`` or the default one). The node needs no spinning. Use as a context
    manager or call :meth:`close`; :meth:`run` blocks (call :meth:`stop` from another thread to end it early).
    """

    def __init__(
        self,
        bag: Path | str,
        *,
        node_name: str = "oxygen_replay",
        rate: float = 1.0,
        loop: bool = False,
        topics: Iterable[str] | None = None,
        clock: bool = False,
        clock_hz: float = 40.0,
        start_delay: float = 0.0,
        qos_best_effort: bool = False,
        qos_depth: int = 10,
        latched_topics: Iterable[str] = DEFAULT_LATCHED,
        wait_for_subscribers: float = 0.0,
        context: Context | None = None,
    ) -> None:
        """Open ``bag`` and create one publisher per replayed topic.

        Args:
            rate: playback speed factor (2.0 = twice as fast).
            topics: replay only these topics (default: all whose message type is importable).
            clock: publish the bag time on /clock (a /clock recorded in the bag is then skipped).
            qos_best_effort: BEST_EFFORT publishers instead of RELIABLE (latched topics stay RELIABLE).
            latched_topics: topics published TRANSIENT_LOCAL, so late subscribers get the last message.
            wait_for_subscribers: before playing, wait up to this many seconds for every topic (and /clock)
                to have a subscriber.
        """
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.rate, self.loop, self.clock_hz = float(rate), loop, float(clock_hz)
        self.start_delay, self.wait_for_subscribers = float(start_delay), float(wait_for_subscribers)
        self._stop = threading.Event()
        self._reader = AnyReader([Path(bag)])
        self._reader.open()
        try:
            if not self._reader.is2:
                raise ValueError(f"{bag} is a ROS 1 bag; only rosbag2 (sqlite3/mcap) payloads are CDR")
            self._context = context or rclpy.get_default_context()
            self.node: Node = rclpy.create_node(node_name, context=self._context)
            self._setup_publishers(topics, clock, qos_best_effort, qos_depth, set(latched_topics))
        except BaseException:
            self.close()
            raise

    def _setup_publishers(self, topics, clock: bool, best_effort: bool, depth: int, latched: set[str]) -> None:
        log = self.node.get_logger()
        wanted = None if topics is None else set(topics)
        by_topic: dict[str, list] = {}
        for conn in self._reader.connections:
            if (wanted is None or conn.topic in wanted) and not (clock and conn.topic == CLOCK_TOPIC):
                by_topic.setdefault(conn.topic, []).append(conn)
        for missing in sorted((wanted or set()) - set(by_topic)):
            log.warning(f"topic {missing} is not in the bag")
        self._publishers: dict[str, Publisher] = {}
        self._connections = []
        for topic, conns in sorted(by_topic.items()):
            types = {c.msgtype for c in conns}
            if len(types) > 1:
                log.warning(f"skipping {topic}: several message types in the bag {sorted(types)}")
                continue
            try:
                cls = message_class(types.pop())
            except LookupError as exc:
                log.warning(f"skipping {topic}: {exc}")
                continue
            profile = qos.latched(depth) if topic in latched else \
                qos.best_effort(depth) if best_effort else qos.reliable(depth)
            self._publishers[topic] = self.node.create_publisher(cls, topic, profile)
            self._connections.extend(conns)
        if not self._publishers:
            raise ValueError("nothing to replay: no selected topic has an importable message type")
        self._clock_pub = (
            self.node.create_publisher(Clock, CLOCK_TOPIC, qos.reliable(depth))
            if clock else None
        )

    @property
    def topics(self) -> list[str]:
        """The topics being replayed."""
        return sorted(self._publishers)

    @property
    def bag_start_ns(self) -> int:
        return int(self._reader.start_time)

    @property
    def bag_duration_s(self) -> float:
        return (self._reader.end_time - self._reader.start_time) / 1e9

    def stop(self) -> None:
        """Ask the current (or next) :meth:`run` to return soon (thread-safe)."""
        self._stop.set()

    def _running(self, deadline: float | None) -> bool:
        return not self._stop.is_set() and self._context.ok() and (deadline is None or time.monotonic() < deadline)

    def _publish_clock(self, stamp_ns: int, stats: ReplayStats) -> None:
        msg = Clock(clock=time_msg(stamp_ns))
        self._clock_pub.publish(msg)
        stats.clock_published += 1

    def _wait_until(self, target: float, bag_time: Callable[[float], int], stats: ReplayStats,
                    deadline: float | None) -> bool:
        """Sleep until monotonic time ``target``, publishing /clock = bag_time(now) at clock_hz; False if stopped."""
        while self._running(deadline):
            now = time.monotonic()
            if now >= target:
                return True
            step = min(target - now, _POLL_S)
            if self._clock_pub is not None and self.clock_hz > 0:
                if now >= self._next_clock:
                    stamp = bag_time(now)
                    if stamp > self._last_clock:
                        self._publish_clock(stamp, stats)
                        self._last_clock = stamp
                    self._next_clock = now + 1.0 / self.clock_hz
                step = min(step, max(0.0, self._next_clock - now))
            if deadline is not None:
                step = min(step, max(0.0, deadline - now))
            self._stop.wait(step)
        return False

    def _wait_for_subscribers(self, deadline: float | None) -> bool:
        pubs = list(self._publishers.values()) + ([self._clock_pub] if self._clock_pub else [])
        until = time.monotonic() + self.wait_for_subscribers
        while self._running(deadline) and time.monotonic() < until:
            if all(p.get_subscription_count() > 0 for p in pubs):
                return True
            self._stop.wait(0.02)
        lonely = [p.topic_name for p in pubs if p.get_subscription_count() == 0]
        if lonely:
            self.node.get_logger().warning(f"no subscriber yet on {', '.join(lonely)}; playing anyway")
        return not lonely

    def run(self, max_duration: float | None = None) -> ReplayStats:
        """Play the bag (once, or until stopped with ``loop``); ``max_duration`` caps the wall time in seconds.

        Returns early after :meth:`stop` (also when called just before), ``max_duration`` or ROS shutdown.
        """
        stats = ReplayStats(published=dict.fromkeys(self._publishers, 0))
        t0 = time.monotonic()
        deadline = None if max_duration is None else t0 + max_duration
        start_ns = self.bag_start_ns
        self._last_clock, self._next_clock = -1, t0
        interrupted = False
        try:
            if self.wait_for_subscribers > 0:
                self._wait_for_subscribers(deadline)
            if self.start_delay > 0:
                self._wait_until(time.monotonic() + self.start_delay, lambda now: start_ns, stats, deadline)
            while True:
                if not self._running(deadline):
                    interrupted = True
                    break
                pass_t0 = time.monotonic()
                self._last_clock = -1  # a new pass may jump the clock back
                for conn, stamp, raw in self._reader.messages(connections=self._connections):
                    target = pass_t0 + (stamp - start_ns) / 1e9 / self.rate

                    def bag_time(now: float, cap: int = stamp, p0: float = pass_t0) -> int:
                        return min(cap, start_ns + int((now - p0) * self.rate * 1e9))

                    if not self._wait_until(target, bag_time, stats, deadline):
                        interrupted = True
                        break
                    if self._clock_pub is not None and stamp > self._last_clock:
                        self._publish_clock(stamp, stats)
                        self._last_clock = stamp
                    self._publishers[conn.topic].publish(raw if isinstance(raw, bytes) else bytes(raw))
                    stats.published[conn.topic] += 1
                if interrupted:
                    break
                stats.passes += 1
                if not self.loop:
                    break
        finally:
            stats.wall_s = time.monotonic() - t0
            stats.interrupted = interrupted
            self._stop.clear()  # the next run() plays again
        return stats

    def close(self) -> None:
        """Destroy the node and close the bag (safe to call twice, and after ROS shutdown)."""
        node = getattr(self, "node", None)
        if node is not None:
            with contextlib.suppress(Exception):  # the context may already be shut down
                node.destroy_node()
            self.node = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __enter__(self) -> BagReplayer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
