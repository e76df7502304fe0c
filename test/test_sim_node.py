"""The tabletop simulator node over real DDS: it publishes the world's sensors, executes action chunks from another
node (here the scripted expert, reading the simulator's own state), finishes and resets episodes, scores memories and
rejects malformed chunks without stopping. The closed loop with the trained model is in test_closed_loop_ros.py."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from conftest import require_ros, ros_context, ros_domain

require_ros()

import rclpy  # noqa: E402
from oxygen_ros.msg import ActionChunk, LanguageOutput  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from rosgraph_msgs.msg import Clock  # noqa: E402
from sensor_msgs.msg import Image, JointState  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from oxygen_ros.ros.image_conversion import image_msg_to_array  # noqa: E402
from oxygen_ros.ros.publishers import make_action_chunk  # noqa: E402
from oxygen_ros.ros.stamps import stamp_to_ns, time_msg  # noqa: E402
from oxygen_ros.toy.sim import TabletopSimNode, chunk_start_index  # noqa: E402
from oxygen_ros.toy.sim.node import SIM_CLOCK_START_NS  # noqa: E402
from oxygen_ros.toy.world import CAMERAS, JOINT_NAMES, expert_chunk  # noqa: E402

pytestmark = [pytest.mark.ros]

DOMAIN = ros_domain()
SEED = 1_000_000


def test_chunk_start_index_skips_actions_already_due() -> None:
    ms = 1_000_000
    assert chunk_start_index(0, 0, 50 * ms, 8) == 0
    assert chunk_start_index(0, 49 * ms, 50 * ms, 8) == 0  # action 0 is for t = 50 ms: still ahead
    assert chunk_start_index(0, 50 * ms, 50 * ms, 8) == 1
    assert chunk_start_index(0, 120 * ms, 50 * ms, 8) == 2
    assert chunk_start_index(0, 10_000 * ms, 50 * ms, 8) == 7  # never past the last action
    assert chunk_start_index(100 * ms, 0, 50 * ms, 8) == 0  # stamped in the future


class World:
    """The simulator plus a test node (expert policy and recorder) in one context, spun in a background thread."""

    def __init__(self, **params) -> None:
        self.context = Context()
        rclpy.init(context=self.context, domain_id=DOMAIN)
        overrides = [Parameter(k, value=v) for k, v in {"seed": SEED, "step_rate_hz": 40.0, "reset_pause_s": 0.2,
                                                         "autostart": False, **params}.items()]
        self.sim = TabletopSimNode(context=self.context, parameter_overrides=overrides)
        self.node = Node("sim_test_policy", context=self.context)
        self.lock = threading.Lock()
        self.images: dict[str, list[Image]] = {c: [] for c in CAMERAS}
        self.joints: list[JointState] = []
        self.instructions: list[str] = []
        self.events: list[dict] = []
        self.expert = False
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT)
        for cam in CAMERAS:
            self.node.create_subscription(Image, f"/cameras/{cam}/image_raw", self._keep(self.images[cam]), qos)
        self.node.create_subscription(JointState, "joint_states", self._on_joints, qos)
        self.node.create_subscription(String, "instruction", lambda m: self._append(self.instructions, m.data), 10)
        self.node.create_subscription(String, "/tabletop_sim/events",
                                      lambda m: self._append(self.events, json.loads(m.data)), 10)
        self.chunk_pub = self.node.create_publisher(ActionChunk, "/oxygen/action_chunk", 10)
        self.language_pub = self.node.create_publisher(LanguageOutput, "/oxygen/language_output", 10)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.sim)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _append(self, items: list, item) -> None:
        with self.lock:
            items.append(item)

    def _keep(self, items: list):
        return lambda msg: self._append(items, msg)

    def _on_joints(self, msg: JointState) -> None:
        self._append(self.joints, msg)
        if self.expert and not self.sim.world.done:  # a policy with privileged state: the scripted expert
            chunk = expert_chunk(self.sim.world, 8)
            self.chunk_pub.publish(make_action_chunk(chunk, stamp_to_ns(msg.header.stamp), len(self.joints),
                                                     JOINT_NAMES, 1.0 / 40.0, 0.0))

    def wait_for(self, predicate, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if predicate():
                    return True
            time.sleep(0.02)
        return False

    def connected(self) -> bool:
        pubs = [self.chunk_pub, self.language_pub]
        return self.wait_for(lambda: self.sim.cameras_connected() and all(p.get_subscription_count() > 0
                                                                           for p in pubs), 20)

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2.0)
        self.sim.destroy_node()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)
        self.thread.join(timeout=2.0)


@pytest.fixture
def world():
    w = World()
    assert w.connected(), "discovery failed"
    yield w
    w.close()


def test_expert_chunks_over_topics_complete_tasks(world: World) -> None:
    world.sim.start()
    first_instruction = world.sim.world.instruction
    world.expert = True
    assert world.wait_for(lambda: sum(e["event"] == "episode" for e in world.events) >= 2, 30), world.events
    episodes = [e for e in world.events if e["event"] == "episode"]
    assert [e["seed"] for e in episodes[:2]] == [SEED, SEED + 1]
    assert all(e["success"] and e["chunks"] > 0 and e["steps"] < world.sim.world.config.max_steps
               for e in episodes[:2]), episodes
    assert episodes[0]["instruction"] == first_instruction and first_instruction in world.instructions
    with world.lock:
        img = world.images[CAMERAS[0]][-1]
        joints = world.joints[-1]
    assert image_msg_to_array(img).shape == (64, 64, 3) and img.encoding == "rgb8"
    assert list(joints.name) == list(JOINT_NAMES) and len(joints.position) == 4
    assert stamp_to_ns(img.header.stamp) > 0
    assert world.sim.counters.rejected_chunks == 0 and world.sim.counters.chunks > 0


def test_language_is_scored_against_the_observation_it_came_from(world: World) -> None:
    world.sim.start()
    assert world.wait_for(lambda: len(world.joints) >= 3, 10)
    with world.lock:
        stamp = stamp_to_ns(world.joints[-1].header.stamp)
    scene = world.sim.truth.get(stamp)
    assert scene is not None
    truth = scene["memory"]
    for text in (truth, "The blue block is on the moon."):
        msg = LanguageOutput(task="memory", text=text, num_tokens=3, eos=True)
        msg.header.stamp = time_msg(stamp)
        world.language_pub.publish(msg)
    msg = LanguageOutput(task="memory", text=truth)
    msg.header.stamp = time_msg(12345)  # no such observation: counted as unscored
    world.language_pub.publish(msg)
    for task in ("narration", "subtask"):
        msg = LanguageOutput(task=task, stream=task, text=f" {scene[task]} ")
        msg.header.stamp = time_msg(stamp)
        world.language_pub.publish(msg)
    world.language_pub.publish(LanguageOutput(task="custom", text="not scored"))
    assert world.wait_for(lambda: world.sim.counters.memories == 3 and len(world.sim.counters.tasks) == 3, 10), \
        world.sim.counters
    c = world.sim.counters
    assert (c.memory_exact, c.memory_unscored) == (1, 1)
    assert {t: (v.scored, v.exact) for t, v in c.tasks.items()} == {"memory": (2, 1), "narration": (1, 1),
                                                                      "subtask": (1, 1)}
    scored = [e for e in world.events if e["event"] == "memory"]
    assert [e["exact"] for e in scored] == [True, False] and scored[0]["truth"] == truth
    question, answer = next(iter(scene["answers"].items()))
    assert world.sim.answer_truth(stamp, f"  {question.upper()} ") == answer
    assert world.sim.answer_truth(stamp, "what is the meaning of life?") is None


def test_malformed_and_stale_chunks_are_counted_not_executed(world: World) -> None:
    world.sim.start()
    assert world.wait_for(lambda: len(world.joints) >= 2, 10)
    now = world.sim.get_clock().now().nanoseconds
    good = np.tile(np.array([0.5, 0.5, 1.0, 0.0], np.float32), (8, 1))
    bad = [
        make_action_chunk(np.full((8, 4), np.nan, np.float32), now, 1, JOINT_NAMES, 0.025, 0.0),
        make_action_chunk(good[:, :3], now, 2, JOINT_NAMES[:3], 0.025, 0.0),  # too few dimensions
        make_action_chunk(good, now, 3, ["a", "b", "c", "d"], 0.025, 0.0),  # other joints
    ]
    bad[1].actions = bad[1].actions[:-1]  # and a length that does not match horizon x action_dim
    for msg in bad:
        world.chunk_pub.publish(msg)
    world.chunk_pub.publish(make_action_chunk(good, now - 60 * 10**9, 4, JOINT_NAMES, 0.025, 0.0))  # stale
    assert world.wait_for(lambda: world.sim.counters.rejected_chunks == 3 and world.sim.counters.stale_chunks == 1,
                          10), world.sim.counters
    steps = world.sim.world.steps
    assert steps == 0 and world.sim.counters.chunks == 0  # nothing executed
    world.chunk_pub.publish(make_action_chunk(good, world.sim.get_clock().now().nanoseconds, 5, JOINT_NAMES,
                                              0.025, 0.0))
    assert world.wait_for(lambda: world.sim.world.steps > 0, 10)  # still alive and executing


def test_publish_clock_owns_the_time() -> None:
    """publish_clock: a simulated clock on /clock, one step period per step from 1 s, stamping the observations."""
    w = World(publish_clock=True)
    clocks: list[int] = []
    w.node.create_subscription(Clock, "/clock", lambda m: w._append(clocks, stamp_to_ns(m.clock)), 50)
    try:
        assert w.connected(), "discovery failed"
        w.sim.start()
        assert w.wait_for(lambda: len(w.joints) >= 5 and len(clocks) >= 5, 10), (len(w.joints), clocks)
        period = w.sim.period_ns
        with w.lock:
            ticks, stamps = sorted(set(clocks)), [stamp_to_ns(j.header.stamp) for j in w.joints]
        grid = set(range(SIM_CLOCK_START_NS, ticks[-1] + period + 1, period))
        assert set(ticks) <= grid and set(stamps) <= grid, (ticks, stamps)
        assert max(stamps) < SIM_CLOCK_START_NS + 10**12  # simulated seconds, not the wall clock
    finally:
        w.close()


def test_publish_clock_refuses_sim_time() -> None:
    with ros_context(DOMAIN) as context, pytest.raises(ValueError, match="publish_clock and use_sim_time"):
        TabletopSimNode(context=context, parameter_overrides=[Parameter("publish_clock", value=True),
                                                              Parameter("use_sim_time", value=True)])
