"""A helper node that drives a running chunk executor over real DDS (:class:`ExecutorProbe`): it publishes action
chunks, joint states, the halt flag and a URDF, and records the executor's setpoints, ``~/executed`` and its
diagnostics. Used by the tests and the benchmarks.
"""

from __future__ import annotations

import array
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool, Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.msg import ActionChunk, ExecutedPlan
from oxygen_ros.ros import qos
from oxygen_ros.ros.stamps import duration_msg, time_msg

from .probe import joint_state_msg, wait_for
from .spun_node import SpunNode

__all__ = ["OUTPUT_TYPES", "ExecutorProbe", "make_chunk"]

OUTPUT_TYPES = {"float64_array": Float64MultiArray, "joint_state": JointState, "trajectory": JointTrajectory}


def make_chunk(actions: np.ndarray, stamp_ns: int, dt_s: float, names: Sequence[str] = (), frame_index: int = 0,
               first_step: int = 0) -> ActionChunk:
    """An ActionChunk of ``actions`` [H, D] stamped ``stamp_ns``."""
    a = np.asarray(actions, dtype=np.float32)
    msg = ActionChunk(joint_names=list(names), horizon=a.shape[0], action_dim=a.shape[1],
                      frame_index=int(frame_index), first_step=int(first_step))
    msg.header.stamp = time_msg(stamp_ns)
    msg.actions = array.array("f", np.ascontiguousarray(a).tobytes())
    msg.dt = duration_msg(dt_s)
    return msg


class ExecutorProbe(SpunNode):
    """Publishes to an executor (``chunk_topic``, ``joint_states``, ``halt_topic``, ``robot_description``) and
    records its output (``output_topic`` of type ``output``), ``<executor>/executed`` and its diagnostics."""

    def __init__(self, domain_id: int, output: str = "joint_state", output_topic: str = "/oxygen_executor/command",
                 executor: str = "/oxygen_executor", chunk_topic: str = "/oxygen/action_chunk",
                 halt_topic: str = "/oxygen/halt", name: str = "executor_probe") -> None:
        super().__init__(name, domain_id)
        n = self.node
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # notified on every recorded message
        self.outputs: list[tuple[float, Any]] = []
        self.executed: list[tuple[float, ExecutedPlan]] = []
        self.diagnostics: dict[str, str] = {}
        self.diagnostic_message = ""
        keep_all = qos.keep_all()
        self.chunk_pub = n.create_publisher(ActionChunk, chunk_topic, 10)
        self.joint_pub = n.create_publisher(JointState, "/joint_states", 10)
        latched = qos.latched()
        self.halt_pub = n.create_publisher(Bool, halt_topic, latched)  # matches both of the executor's
        self.urdf_pub = n.create_publisher(String, "/robot_description", latched)
        n.create_subscription(OUTPUT_TYPES[output], output_topic, self._record(self.outputs), keep_all)
        n.create_subscription(ExecutedPlan, f"{executor}/executed", self._record(self.executed), keep_all)
        self._diag_name = f"{executor.rsplit('/', 1)[-1]}: executor"
        n.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self.start_spinning("executor-probe")
        self._joint_timer = None
        self._clock_pub = None
        self._clock_timer = None
        self.sim_ns = 0

    def __enter__(self) -> ExecutorProbe:
        return self

    def _record(self, into: list) -> Callable[[Any], None]:
        def callback(msg: Any) -> None:
            with self._arrived:
                into.append((time.monotonic(), msg))
                self._arrived.notify_all()
        return callback

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name == self._diag_name:
                with self._lock:
                    self.diagnostics = {kv.key: kv.value for kv in status.values}
                    self.diagnostic_message = status.message

    # ------------------------------------------------------------------------------------------ access
    def now_ns(self) -> int:
        return self.node.get_clock().now().nanoseconds

    def got_outputs(self, since: float = 0.0) -> list[Any]:
        with self._lock:
            return [m for t, m in self.outputs if t >= since]

    def got_executed(self, since: float = 0.0) -> list[ExecutedPlan]:
        with self._lock:
            return [m for t, m in self.executed if t >= since]

    def diagnostic(self, key: str, default: str = "") -> str:
        with self._lock:
            return self.diagnostics.get(key, default)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        return wait_for(predicate, timeout, 0.01)

    def wait_for_executor(self, timeout: float = 20.0, active: bool = True) -> bool:
        """Discovery done: the executor subscribes to the chunks, joint states and halt; with ``active``, it also
        reports (/diagnostics) that it is active (a lifecycle node uses no chunk before)."""
        pubs = (self.chunk_pub, self.joint_pub, self.halt_pub)
        return self.wait_for(lambda: all(p.get_subscription_count() > 0 for p in pubs)
                             and (not active or self.diagnostic("lifecycle") == "active"), timeout)

    # ------------------------------------------------------------------------------------------ publishing
    def publish_chunk(self, actions: np.ndarray, stamp_ns: int, dt_s: float, names: Sequence[str] = (),
                      frame_index: int = 0, first_step: int = 0) -> ActionChunk:
        msg = make_chunk(actions, stamp_ns, dt_s, names, frame_index, first_step)
        self.chunk_pub.publish(msg)
        return msg

    def publish_joints(self, names: Sequence[str], positions: Sequence[float]) -> None:
        self.joint_pub.publish(joint_state_msg(names, positions, self.now_ns()))

    def stream_joints(self, names: Sequence[str], positions: Callable[[], Sequence[float]] | Sequence[float],
                      rate_hz: float = 50.0) -> None:
        """Publish joint states at ``rate_hz`` (``positions``: fixed, or a function called each time)."""
        self.stop_joints()
        get = positions if callable(positions) else (lambda: positions)
        self._joint_timer = self.node.create_timer(1.0 / rate_hz, lambda: self.publish_joints(names, get()))

    def stop_joints(self) -> None:
        if self._joint_timer is not None:
            self.node.destroy_timer(self._joint_timer)
            self._joint_timer = None

    # ------------------------------------------------------------------------------------------ simulated time
    def use_sim_clock(self, start_ns: int) -> None:
        """Drive /clock for an executor started with ``use_sim_time``: time stands at ``start_ns`` until
        :meth:`step` moves it, so what the executor does no longer depends on how busy the machine is. The current
        time is re-sent every 50 ms (/clock is best effort; the same time starts no tick)."""
        self._clock_pub = self.node.create_publisher(Clock, "/clock", 10)
        self.sim_ns = int(start_ns)
        self._send_clock()
        self._clock_timer = self.node.create_timer(0.05, self._send_clock)

    def _send_clock(self) -> None:
        with self._lock:  # one writer at a time: time never goes back
            self._clock_pub.publish(Clock(clock=time_msg(self.sim_ns)))

    def step(self, period_ns: int, n: int = 1, timeout: float = 30.0) -> list[ExecutedPlan]:
        """Advance the simulated time ``n`` command periods, one at a time, each time waiting for the executor's
        tick at that time (its ``~/executed``); returns those ticks' ExecutedPlan messages.

        Raises:
            TimeoutError: the executor did not tick within ``timeout`` seconds.
        """
        ticks = []
        for _ in range(n):
            with self._lock:
                self.sim_ns += int(period_ns)
                t = self.sim_ns
                self._clock_pub.publish(Clock(clock=time_msg(t)))
            with self._arrived:
                if not self._arrived.wait_for(lambda t=t: self._tick_at(t) is not None, timeout):
                    raise TimeoutError(f"no executor tick at simulated time {t} ns within {timeout} s")
                ticks.append(self._tick_at(t))
        return ticks

    def _tick_at(self, t_ns: int) -> ExecutedPlan | None:  # under the lock
        for _, e in reversed(self.executed[-50:]):
            if e.header.stamp.sec * 1_000_000_000 + e.header.stamp.nanosec == t_ns:
                return e
        return None

    def wait_diagnostic(self, key: str, value: str, timeout: float = 10.0) -> bool:
        """Wait for ``key`` on the executor's /diagnostics (1 Hz on the wall clock, also under simulated time) to
        read ``value``: how a test learns that an input arrived while the simulated time stands still."""
        return self.wait_for(lambda: self.diagnostic(key) == value, timeout)

    def halt(self, on: bool) -> None:
        self.halt_pub.publish(Bool(data=bool(on)))

    def publish_urdf(self, xml: str) -> None:
        self.urdf_pub.publish(String(data=xml))
