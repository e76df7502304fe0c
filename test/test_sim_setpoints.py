"""The tabletop simulator's setpoint-stream input over real DDS: with ``setpoint_topic`` set it
follows a stream of joint setpoints (what the chunk executor streams) instead of action chunks: a scripted expert
streaming its next action as a JointState command (joints in another order) completes tasks; malformed setpoints
are counted, not executed; chunks are not executed in that mode; Float64MultiArray commands in joint order work."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from conftest import require_ros, ros_context, ros_domain

require_ros()

import rclpy  # noqa: E402
from oxygen_ros.msg import ActionChunk  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402
from std_msgs.msg import Float64MultiArray, String  # noqa: E402

from oxygen_ros.ros.publishers import make_action_chunk  # noqa: E402
from oxygen_ros.ros.stamps import time_msg  # noqa: E402
from oxygen_ros.toy.sim import TabletopSimNode, setpoint_from_array, setpoint_from_joint_state  # noqa: E402
from oxygen_ros.toy.world import JOINT_NAMES, expert_action  # noqa: E402

pytestmark = [pytest.mark.ros]

DOMAIN = ros_domain()
SEED = 1_000_000
TOPIC = "/executor/joint_commands"


def test_setpoint_parsing() -> None:
    names = list(JOINT_NAMES)[::-1] + ["extra"]
    sp = setpoint_from_joint_state(names, [4.0, 3.0, 2.0, 1.0, 9.0], JOINT_NAMES)
    assert np.array_equal(sp, [1.0, 2.0, 3.0, 4.0])
    assert "missing" in setpoint_from_joint_state(names[1:], [3.0, 2.0, 1.0, 9.0], JOINT_NAMES)
    assert "names for" in setpoint_from_joint_state(names, [1.0], JOINT_NAMES)
    assert "non-finite" in setpoint_from_joint_state(JOINT_NAMES, [1.0, np.nan, 1.0, 1.0], JOINT_NAMES)
    assert np.array_equal(setpoint_from_array([1, 2, 3, 4], JOINT_NAMES), [1, 2, 3, 4])
    assert "values for" in setpoint_from_array([1, 2, 3], JOINT_NAMES)


class SetpointWorld:
    """The simulator in setpoint mode plus a streaming test node, one context, spun in a background thread."""

    def __init__(self, setpoint_type: str = "joint_state") -> None:
        self.context = Context()
        rclpy.init(context=self.context, domain_id=DOMAIN)
        params = {"seed": SEED, "step_rate_hz": 40.0, "reset_pause_s": 0.2, "autostart": False,
                  "setpoint_topic": TOPIC, "setpoint_type": setpoint_type}
        self.sim = TabletopSimNode(context=self.context,
                                   parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
        self.node = Node("setpoint_streamer", context=self.context)
        kind = JointState if setpoint_type == "joint_state" else Float64MultiArray
        self.pub = self.node.create_publisher(kind, TOPIC, 10)
        self.chunk_pub = self.node.create_publisher(ActionChunk, "/oxygen/action_chunk", 10)
        self.lock = threading.Lock()
        self.events: list[dict] = []
        self.node.create_subscription(String, "/tabletop_sim/events", self._on_event, 10)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.sim)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _on_event(self, msg: String) -> None:
        with self.lock:
            self.events.append(json.loads(msg.data))

    def episodes(self) -> list[dict]:
        with self.lock:
            return [e for e in self.events if e["event"] == "episode"]

    def wait_for(self, predicate, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return True
            time.sleep(0.02)
        return bool(predicate())

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2.0)
        self.sim.destroy_node()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)
        self.thread.join(timeout=2.0)


def _command(values, now_ns: int, names=None) -> JointState:
    names = list(JOINT_NAMES)[::-1] if names is None else names  # the streamer's order differs: mapped by name
    index = {n: i for i, n in enumerate(JOINT_NAMES)}
    msg = JointState(name=names, position=[float(values[index[n]]) for n in names])
    msg.header.stamp = time_msg(now_ns)
    return msg


def test_a_setpoint_stream_drives_the_arm_and_completes_tasks() -> None:
    w = SetpointWorld()
    try:
        assert w.wait_for(lambda: w.pub.get_subscription_count() > 0, 20), "discovery failed"
        w.sim.start()
        # a chunk is not executed in setpoint mode (nobody subscribes to chunks)
        assert w.chunk_pub.get_subscription_count() == 0
        # malformed setpoints are counted, not executed
        now = w.sim.get_clock().now().nanoseconds
        w.pub.publish(_command([0.5, 0.5, np.nan, 0.0], now))
        w.pub.publish(_command([0.5, 0.5, 0.5, 0.0], now, names=["ee_x", "ee_y", "ee_z"]))
        w.pub.publish(_command([0.5, 0.5, 0.5, 0.0], now - 60 * 10**9))  # commanded before the episode
        assert w.wait_for(lambda: w.sim.counters.rejected_setpoints == 2 and w.sim.counters.stale_setpoints == 1,
                          10), w.sim.counters
        assert w.sim.world.steps == 0 and w.sim.counters.setpoints == 0

        def stream() -> None:  # the expert's next action at 100 Hz, a setpoint stream like the executor's
            if not w.sim.world.done:
                w.pub.publish(_command(expert_action(w.sim.world.clone()), w.sim.get_clock().now().nanoseconds))

        w.node.create_timer(0.01, stream)
        assert w.wait_for(lambda: len(w.episodes()) >= 2, 40), (w.events, w.sim.counters)
        episodes = w.episodes()
        assert all(e["success"] and e["chunks"] == 0 for e in episodes[:2]), episodes
        assert w.sim.counters.setpoints > 0 and w.sim.counters.chunks == 0
    finally:
        w.close()


def test_float64_multi_array_setpoints_in_joint_order() -> None:
    w = SetpointWorld("float64_multi_array")
    try:
        assert w.wait_for(lambda: w.pub.get_subscription_count() > 0, 20), "discovery failed"
        w.sim.start()
        w.pub.publish(Float64MultiArray(data=[0.5, 0.5, 0.5]))  # too few values
        assert w.wait_for(lambda: w.sim.counters.rejected_setpoints == 1, 10), w.sim.counters
        target = np.array([0.9, 0.1, 0.8, 0.0])
        w.pub.publish(Float64MultiArray(data=target.tolist()))
        assert w.wait_for(lambda: np.allclose(w.sim.world.state.ee, target[:3], atol=1e-6), 20), \
            w.sim.world.state.ee  # moved toward the newest setpoint within the speed limits, then there
        assert w.sim.counters.setpoints == 1
    finally:
        w.close()


def test_chunks_still_drive_the_default_simulator() -> None:
    """Without setpoint_topic the chunk input is unchanged (make demo's path)."""
    with ros_context(DOMAIN) as context:
        sim = TabletopSimNode(context=context, parameter_overrides=[Parameter("autostart", value=False)])
        assert sim.setpoint_topic == "" and "/oxygen/action_chunk" in [s.topic_name for s in sim.subscriptions]
        good = np.tile(np.array([0.5, 0.5, 1.0, 0.0], np.float32), (8, 1))
        sim.start()
        sim._on_chunk(make_action_chunk(good, sim.get_clock().now().nanoseconds, 1, JOINT_NAMES, 0.025, 0.0))
        assert sim.counters.chunks == 1
        sim.destroy_node()
