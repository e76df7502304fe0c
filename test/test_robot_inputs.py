"""What a robot's inputs do to the node: a joint stream that stops or loses one joint, an instruction latched before
the node started or sent by a volatile publisher, an instruction too long for the prompt, and the time line of the
published trajectory. Unit tests of the store and the builder first, then the node as a process over real DDS.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import random_policy, require_ros, ros_domain

require_ros()

from rcl_interfaces.msg import Log  # noqa: E402
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from oxygen_ros.policy import Policy, RawObservation  # noqa: E402
from oxygen_ros.ros.diagnostics import ReasonCounter  # noqa: E402
from oxygen_ros.ros.image_conversion import array_to_image_msg  # noqa: E402
from oxygen_ros.ros.input_store import InputStore  # noqa: E402
from oxygen_ros.ros.observation_builder import ObservationBuilder, Skip  # noqa: E402
from oxygen_ros.ros.publishers import make_trajectory  # noqa: E402
from oxygen_ros.testing import NodeProcess, Probe, header_ns  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SYNTHETIC = REPO / "config" / "synthetic.yaml"
CAMS = ["base_0_rgb", "left_wrist_0_rgb"]
CAMERAS = [(c, f"/cameras/{c}/image_raw") for c in CAMS]
JOINTS = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
INSTRUCTION = "put the red block on the blue plate"
SEC = 1_000_000_000
MS = 1_000_000


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Policy:
    """A generated tiny checkpoint with a test tokenizer (our layout, identity normalisation)."""
    return random_policy(tmp_path_factory, max_token_len=128, std=None)


class FakeClock:
    """Node time the test moves by hand (nanoseconds)."""

    def __init__(self, ns: int = 10 * SEC) -> None:
        self.ns = ns

    def __call__(self) -> int:
        return self.ns


def fed_store(clock: FakeClock) -> InputStore:
    store = InputStore(CAMS, JOINTS, ReasonCounter(None, "rejected"), instruction=INSTRUCTION, node_clock_ns=clock)
    for i in range(len(CAMS)):
        assert store.on_image(i, array_to_image_msg(np.full((32, 32, 3), 90, np.uint8), clock.ns))
    assert store.on_joint_state(JointState(name=JOINTS, position=[0.1] * len(JOINTS)))
    return store


# ---------------------------------------------------------------------------------------------- joint ages
def test_stale_joints_skip_the_frame_per_joint_and_resume(policy) -> None:
    clock = FakeClock()
    store = fed_store(clock)
    def build(now_ns: int):  # a builder per tick: the same images may serve again (only the joints age here)
        return ObservationBuilder(store, policy, max_age_s=10.0, max_joint_age_s=0.25).build(now_ns)

    assert not isinstance(build(clock.ns + 200 * MS), Skip), "fresh joints serve"
    skip = build(clock.ns + 300 * MS)
    assert isinstance(skip, Skip) and skip.reason == "stale_joint_state" and "8 joint(s)" in skip.detail

    clock.ns += 300 * MS  # every joint but the gripper is published again
    store.on_joint_state(JointState(name=JOINTS[:-1], position=[0.2] * 7))
    skip = build(clock.ns + 10 * MS)
    assert isinstance(skip, Skip) and skip.reason == "stale_joint_state"
    assert "1 joint(s)" in skip.detail and "gripper" in skip.detail, skip.detail

    store.on_joint_state(JointState(name=["gripper"], position=[0.0]))
    built = build(clock.ns + 10 * MS)
    assert not isinstance(built, Skip), built
    assert built.state.tolist() == [0.2] * 7 + [0.0]


def test_no_joint_age_limit_when_zero(policy) -> None:
    clock = FakeClock()
    store = fed_store(clock)
    assert not isinstance(ObservationBuilder(store, policy, 100.0, 0.0).build(clock.ns + 50 * SEC), Skip)


def test_an_unstamped_image_is_rejected_with_its_own_reason() -> None:
    store = InputStore(CAMS, JOINTS, ReasonCounter(None, "rejected"))
    assert not store.on_image(0, array_to_image_msg(np.zeros((8, 8, 3), np.uint8), 0))
    assert store.rejected.snapshot() == {"image_unstamped": 1} and store.camera_buffers()[0] == []


# ---------------------------------------------------------------------------------------------- instructions
def test_a_too_long_instruction_is_cut_so_the_state_stays_in_the_prompt(policy) -> None:
    images = {c: np.zeros((32, 32, 3), np.uint8) for c in CAMS}
    state = np.linspace(-0.9, 0.9, len(JOINTS))
    long = " ".join(["pick up the red block and place it"] * 40)
    upstream = policy.tokenizer.tokenize_action_prompt(long, state, keep_state=False)
    assert upstream.truncated, "as openpi / LeRobot do it, the prompt's end (the state) would be lost"

    prepared = policy.prepare(RawObservation(images, state, long))
    assert prepared.instruction_cut and not prepared.prompt_truncated
    text = policy.tokenizer.decode(prepared.observation.tokens[0].tolist())
    state_part = policy.tokenizer.decode(policy.tokenizer.encode(text.split("State:")[1]))
    assert text.rstrip().endswith("Action:") and len(state_part.split(";")[0].split()) == len(JOINTS), text
    assert long.startswith(text.split(", State:")[0].removeprefix("Task: ")), "the instruction's start is kept"
    assert prepared.prompt_tokens <= policy.spec.max_token_len

    # a prompt that fits is tokenised exactly as upstream
    short = policy.prepare(RawObservation(images, state, INSTRUCTION))
    exact = policy.tokenizer.tokenize_action_prompt(INSTRUCTION, state, keep_state=False)
    assert not short.instruction_cut and short.observation.tokens[0].tolist() == exact.ids[:exact.num_tokens].tolist()


def test_the_store_caps_instruction_characters() -> None:
    store = InputStore(CAMS, JOINTS, ReasonCounter(None, "rejected"), max_instruction_chars=64)
    assert store.on_instruction(String(data="x" * 10_000))
    assert store.instruction == "x" * 64 and store.rejected.get("instruction_truncated") == 1


def test_an_instruction_received_twice_from_one_publisher_is_taken_once() -> None:
    store = InputStore(CAMS, JOINTS, ReasonCounter(None, "rejected"))
    gid = {"implementation_identifier": "rmw_fastrtps_cpp", "data": [1, 2, 3]}
    other = {"implementation_identifier": "rmw_fastrtps_cpp", "data": [9, 9, 9]}
    assert store.on_instruction(String(data="first"), {"publisher_gid": gid, "publication_sequence_number": 1})
    assert store.on_instruction(String(data="second"), {"publisher_gid": gid, "publication_sequence_number": 2})
    # the latched subscription delivers the first message again, late: ignored, the newer one stays
    assert not store.on_instruction(String(data="first"), {"publisher_gid": gid, "publication_sequence_number": 1})
    assert store.instruction == "second" and store.rejected.total == 0
    assert store.on_instruction(String(data="third"), {"publisher_gid": other, "publication_sequence_number": 1})
    assert store.instruction == "third"
    assert store.on_instruction(String(data="no info"))  # bag replay: no message info, always taken
    assert store.instruction == "no info"


# ---------------------------------------------------------------------------------------------- trajectory
def test_trajectory_is_on_the_observation_time_line_and_drops_past_points() -> None:
    actions = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
    stamp, dt = 100 * SEC, 0.05
    traj = make_trajectory(actions, ["a", "b", "c"], dt, stamp, now_ns=stamp + 120 * MS)
    assert (traj.header.stamp.sec, traj.header.stamp.nanosec) == (100, 0)
    times = [p.time_from_start.sec * SEC + p.time_from_start.nanosec for p in traj.points]
    # actions 0 and 1 were meant for +50 ms and +100 ms: passed; action 2 (+150 ms) is the first kept
    assert times == [(i + 1) * 50 * MS for i in range(2, 10)]
    np.testing.assert_allclose([p.positions for p in traj.points], actions[2:])
    assert len(make_trajectory(actions, ["a", "b", "c"], dt, stamp, now_ns=stamp + 100 * MS).points) == 8, \
        "a point due exactly now has passed"
    assert make_trajectory(actions, ["a", "b", "c"], dt, stamp, now_ns=stamp + SEC) is None, "all in the past"
    assert len(make_trajectory(actions, ["a", "b", "c"], dt).points) == 10, "stamp 0: start on receipt, all kept"


# ---------------------------------------------------------------------------------------------- over DDS
RATE_HZ = 5.0
JOINT_AGE_S = 0.3
DOMAIN = ros_domain()
LATE_DOMAIN = ros_domain()


@pytest.fixture(scope="module")
def node():
    proc = NodeProcess(SYNTHETIC, {"control_rate_hz": RATE_HZ, "max_joint_age_s": JOINT_AGE_S, "max_new_tokens": 4,
                                   "k": 2}, domain_id=DOMAIN).start()
    yield proc
    proc.stop(signal.SIGKILL if proc.alive else signal.SIGINT, timeout=5)


@pytest.fixture(scope="module")
def probe(node):
    p = Probe(CAMERAS, JOINTS, image_size=48, domain_id=DOMAIN)
    assert p.wait_for_subscribers(60), f"the node never subscribed:\n{node.output()}"
    p.start_stream(10.0)
    p.publish_instruction(INSTRUCTION)
    assert p.wait_for(lambda: len(p.chunks()) >= 2, 20), node.output()
    yield p
    p.close()


def chunks_stop_within(probe: Probe, limit_s: float, before: int) -> tuple[int, int]:
    """Chunks whose observation is more than ``limit_s`` after now, over the 1.5 s after the node counted a skip
    as stale_joint_state (more than ``before``), and that count. Judged on the chunks' stamps, not on when a busy
    host delivered them: a chunk observed later than the last joint state + max_joint_age_s acted on a stale one."""
    t0 = probe.now_ns()
    assert probe.wait_for(lambda: probe.diagnostic_count("skipped.stale_joint_state") > before, 10), probe.diagnostics()
    time.sleep(1.5)
    late = [c for c in probe.chunks() if header_ns(c) > t0 + int(limit_s * 1e9)]
    return len(late), probe.diagnostic_count("skipped.stale_joint_state")


@pytest.mark.ros
@pytest.mark.slow
def test_chunks_stop_when_joint_states_stop_and_resume_after(node, probe) -> None:
    before = probe.diagnostic_count("skipped.stale_joint_state")
    probe.stream_joints = []  # cameras go on, /joint_states stops
    late, stale = chunks_stop_within(probe, JOINT_AGE_S + 2 / RATE_HZ + 0.2, before)
    assert late == 0, "acted on joint positions older than max_joint_age_s"
    assert stale > before
    probe.stream_joints = None
    t1 = time.monotonic()
    assert probe.wait_for(lambda: len(probe.chunks(since=t1)) >= 2, 5), node.output()[-2000:]


@pytest.mark.ros
@pytest.mark.slow
def test_a_joint_never_published_again_stops_chunks(node, probe) -> None:
    before = probe.diagnostic_count("skipped.stale_joint_state")
    probe.stream_joints = JOINTS[:-1]  # the gripper driver died
    late, stale = chunks_stop_within(probe, JOINT_AGE_S + 2 / RATE_HZ + 0.2, before)
    assert late == 0
    assert stale > before
    named = re.compile(r"stale_joint_state\]: 1 joint\(s\) [^\n]*: gripper \d")
    assert probe.wait_for(lambda: named.search(node.output()) is not None, 7), "the log names the stale joint"
    probe.stream_joints = None
    t1 = time.monotonic()
    assert probe.wait_for(lambda: len(probe.chunks(since=t1)) >= 2, 5)


@pytest.mark.ros
@pytest.mark.slow
def test_a_volatile_instruction_publisher_is_heard(node, probe) -> None:
    volatile = probe.node.create_publisher(String, "/instruction", QoSProfile(
        depth=10, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE))
    try:
        assert probe.wait_for(lambda: volatile.get_subscription_count() >= 1, 10)
        volatile.publish(String(data="stack the green block on the yellow plate"))
        assert probe.wait_for(lambda: probe.diagnostics().get("instruction")
                              == "stack the green block on the yellow plate", 5), probe.diagnostics()
        assert "incompatible" not in node.output().lower(), "the latched subscription complains about it"
    finally:
        probe.node.destroy_publisher(volatile)
        probe.publish_instruction(INSTRUCTION)


@pytest.mark.ros
@pytest.mark.slow
def test_a_too_long_instruction_is_cut_and_warned_on_rosout(node, probe) -> None:
    logs: list[Log] = []
    sub = probe.node.create_subscription(Log, "/rosout", logs.append, QoSProfile(
        depth=100, reliability=ReliabilityPolicy.RELIABLE))
    try:
        time.sleep(1.0)  # discovery of the new subscription
        long = " ".join([INSTRUCTION] * 60)
        probe.publish_instruction(long)
        assert probe.wait_for(lambda: any("instruction_truncated" in m.msg and m.name.endswith("oxygen")
                                          for m in logs), 8), [m.msg for m in logs]
        warning = next(m for m in logs if "instruction_truncated" in m.msg)
        assert warning.level == Log.WARN
        kept = probe.diagnostics().get("instruction", "")
        assert probe.wait_for(lambda: long.startswith(probe.diagnostics().get("instruction", "?")), 6), kept
        t0 = time.monotonic()
        assert probe.wait_for(lambda: len(probe.chunks(since=t0)) >= 2, 5), "the cut instruction still serves"
        assert probe.diagnostic_count("rejected.prompt_truncated") == 0, "the state was cut from a prompt"
    finally:
        probe.node.destroy_subscription(sub)
        probe.publish_instruction(INSTRUCTION)


@pytest.mark.ros
@pytest.mark.slow
def test_a_node_started_late_receives_the_latched_instruction() -> None:
    """The instruction was published once, before the node existed (transient local): the node acts on it."""
    probe = Probe(CAMERAS, JOINTS, image_size=48, domain_id=LATE_DOMAIN, name="late_probe")
    node = None
    try:
        probe.publish_instruction(INSTRUCTION)  # once, and never again
        node = NodeProcess(SYNTHETIC, {"control_rate_hz": RATE_HZ}, domain_id=LATE_DOMAIN).start()
        assert probe.wait_for_subscribers(60), node.output()
        probe.start_stream(10.0)
        assert probe.wait_for(lambda: len(probe.chunks()) >= 2, 20), probe.diagnostics()
        assert probe.wait_for(lambda: probe.diagnostics().get("instruction") == INSTRUCTION, 6), probe.diagnostics()
    finally:
        probe.close()
        if node is not None:
            assert node.stop() == 0
