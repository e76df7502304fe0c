"""A node a humanoid can trust: one node process over real DDS driven through every safety check in turn (the tests
share it and run in file order: a URDF on /robot_description clamps chunks; parameters override it; a first action far
from the present joint state is caught; enable and disable through ~/enable; ~/halt stops chunks within one control
period while language flows; NaN chunks are never published; a frame that raises once recovers; a hanging frame trips
the watchdog and its chunk is dropped; faults in every frame reach the error state, after which configure works
again, now under reject; and SIGINT during a hang exits 0 within 5 s). The pure parts (limit math, URDF parsing,
gate, counters, the test-only fault injection) are tested in test_safety_parts.py.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import require_ros, ros_domain

from oxygen_ros.testing.fault_injection import fault_env

REPO = Path(__file__).resolve().parents[1]
URDF = REPO / "test" / "fixtures" / "urdf" / "safety_arm.urdf"
JOINTS = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
SEC = 1_000_000_000





# ---------------------------------------------------------------------------------------------- one node over DDS
require_ros()
pytest.importorskip("std_srvs", reason="std_srvs is not installed (run `make setup`)")

from lifecycle_msgs.msg import TransitionEvent  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetState  # noqa: E402
from oxygen_ros.msg import ActionChunk  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from std_msgs.msg import Bool, String  # noqa: E402
from std_srvs.srv import SetBool  # noqa: E402

from oxygen_ros.testing import NodeProcess, Probe, chunk_array, header_ns  # noqa: E402
from oxygen_ros.testing.services import call, change_state  # noqa: E402

SYNTHETIC = REPO / "config" / "synthetic.yaml"
CAMERAS = [(c, f"/cameras/{c}/image_raw") for c in ("base_0_rgb", "left_wrist_0_rgb")]
INSTRUCTION = "put the red block on the blue plate"
RATE_HZ = 5.0
PERIOD_S = 1.0 / RATE_HZ
DT_S = PERIOD_S / 10  # random_tiny: H = 10 actions per control period
WATCHDOG_S = 0.5
DOMAIN = ros_domain()
OVERRIDES = {"limits.joint_1.max": 0.25, "limits.joint_7.min": -0.2, "limits.joint_7.max": 0.2,
             "limits.joint_2.max_velocity": 10.0}
# what the URDF and the overrides allow, per joint of config/synthetic.yaml: (min, max, max_velocity)
LIMITS = {"joint_1": (-1.0, 0.25, 50.0), "joint_2": (-0.5, 2.0, 10.0), "joint_3": (0.0, 0.3, 5.0),
          "joint_4": (-np.inf, np.inf, 1.0), "joint_5": (-2.0, 2.0, 30.0), "joint_6": (-0.1, 0.1, 2.0),
          "joint_7": (-0.2, 0.2, np.inf), "gripper": (0.0, 0.04, 0.2)}
# the robot holds still here; joint_4 (continuous, 1 rad/s) sits far from where the random model's actions go
PRESENT = {"joint_1": 0.0, "joint_2": 0.5, "joint_3": 0.15, "joint_4": 10.0, "joint_5": 0.0, "joint_6": 0.0,
           "joint_7": 0.0, "gripper": 0.02}
LOOSE_URDF = "<robot name='loose_arm'><link name='base'/>" + "".join(
    f"<link name='l{i}'/><joint name='{j}' type='revolute'><parent link='base'/><child link='l{i}'/>"
    f"<limit lower='-1000' upper='1000' effort='1' velocity='100000'/></joint>" for i, j in enumerate(JOINTS)) + \
    "</robot>"


class Robot:
    """The probe plus what a robot integration adds: the URDF (latched), ~/halt publishers, joint states held at
    ``present``, the ~/enable, lifecycle and parameter clients, and chunks recorded with their receive time."""

    def __init__(self, probe: Probe) -> None:
        self.probe, n = probe, probe.node
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.description = n.create_publisher(String, "/robot_description", latched)
        self.halt_volatile = n.create_publisher(Bool, "/oxygen/halt", 10)
        self.halt_latched = n.create_publisher(Bool, "/oxygen/halt", latched)
        self.enable_client = n.create_client(SetBool, "/oxygen/enable")
        self.change = n.create_client(ChangeState, "/oxygen/change_state")
        self.get = n.create_client(GetState, "/oxygen/get_state")
        self.set_params = n.create_client(SetParameters, "/oxygen/set_parameters")
        self.present = dict(PRESENT)
        self.chunks: list[tuple[int, ActionChunk]] = []  # (receive time on the ROS clock, chunk)
        self.transitions: list[str] = []
        n.create_subscription(ActionChunk, "/oxygen/action_chunk", lambda m: self.chunks.append((probe.now_ns(), m)),
                              100)
        n.create_subscription(TransitionEvent, "/oxygen/transition_event",
                              lambda m: self.transitions.append(m.goal_state.label), 10)
        self._joint_timer = None

    def hold_joints(self) -> None:
        """Joint states at ``present`` at 20 Hz instead of the synthetic motion."""
        self.probe.stream_joints = []
        self._joint_timer = self.probe.node.create_timer(
            0.05, lambda: self.probe.publish_joints(0.0, JOINTS, [self.present[j] for j in JOINTS]))

    def enable(self, on: bool) -> SetBool.Response:
        return call(self.enable_client, SetBool.Request(data=on), 10.0)

    def transition(self, transition_id: int) -> bool:
        return change_state(self.change, self.get, transition_id, 60.0)

    def state(self) -> str:
        return call(self.get, GetState.Request(), 10.0).current_state.label

    def set_parameters(self, values: dict) -> None:
        request = SetParameters.Request(parameters=[Parameter(k, value=v).to_parameter_msg()
                                                    for k, v in values.items()])
        assert all(r.successful for r in call(self.set_params, request, 10.0).results)

    def chunks_since(self, t_ns: int) -> list[tuple[int, ActionChunk]]:
        return [(t, c) for t, c in list(self.chunks) if t >= t_ns]

    def count(self, key: str) -> int:
        return self.probe.diagnostic_count(key)

    def wait_chunks(self, n: int = 2, timeout: float = 8.0) -> int:
        """Wait for ``n`` chunks received from now on; returns the time waiting began (ROS clock)."""
        t0 = self.probe.now_ns()
        assert self.probe.wait_for(lambda: len(self.chunks_since(t0)) >= n, timeout), self.probe.diagnostics()
        return t0

    def quiet_for(self, seconds: float, after_s: float = PERIOD_S + 0.05) -> list:
        """Chunks received between ``after_s`` and ``after_s + seconds`` from now (the first control period is
        the allowed reaction time)."""
        t0 = self.probe.now_ns()
        time.sleep(after_s + seconds)
        return [c for t, c in self.chunks_since(t0 + int(after_s * SEC))]


@pytest.fixture(scope="module")
def faults(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("faults") / "program"
    path.write_text("")
    return path


@pytest.fixture(scope="module")
def node(faults: Path):
    proc = NodeProcess(SYNTHETIC, {
        "control_rate_hz": RATE_HZ, "max_new_tokens": 4, "k": 2, "publish_trajectory": True, "start_enabled": False,
        "watchdog_s": WATCHDOG_S, "max_consecutive_faults": 3, **OVERRIDES,
    }, domain_id=DOMAIN, env=fault_env(f"@{faults}")).start()
    yield proc
    proc.stop(signal.SIGKILL if proc.alive else signal.SIGINT, timeout=5)


@pytest.fixture(scope="module")
def robot(node):
    probe = Probe(CAMERAS, JOINTS, image_size=48, domain_id=DOMAIN, name="safety_probe")
    try:
        assert probe.wait_for_subscribers(60), f"the node never subscribed:\n{node.output()}"
        r = Robot(probe)
        r.hold_joints()
        probe.start_stream(10.0)
        probe.publish_instruction(INSTRUCTION)
        yield r
    finally:
        probe.close()


def within_limits(chunk: ActionChunk, limits: dict) -> None:
    a = chunk_array(chunk)
    for j, name in enumerate(chunk.joint_names):
        lo, hi, _ = limits[name]
        assert lo - 1e-5 <= a[:, j].min() and a[:, j].max() <= hi + 1e-5, (name, a[:, j], lo, hi)


@pytest.mark.ros
@pytest.mark.slow
def test_disabled_at_start_language_flows_and_nothing_moves(node, robot) -> None:
    probe = robot.probe
    assert probe.wait_for(lambda: len(probe.language()) >= 2, 20), node.output()[-3000:]
    assert probe.wait_for(lambda: probe.diagnostics().get("actions", "").startswith("withheld: disabled"), 5)
    assert "no chunk published: disabled" in probe.received.diagnostic_message
    # /diagnostics is periodic (1 Hz): wait for a status that counts a checked chunk instead of racing it
    assert probe.wait_for(lambda: robot.count("limits.checked_chunks") > 0, 5), \
        ("a dry run still computes and checks the chunks", probe.diagnostics())
    assert robot.chunks == [] and probe.trajectories() == []
    # an image already older than max_image_age_s on arrival: rejected with its own reason
    probe.publish_frame(cameras=["base_0_rgb"], stamp_ns=probe.now_ns() - 2 * SEC)
    assert probe.wait_for(lambda: robot.count("rejected.image_too_old") == 1, 5), probe.diagnostics()


@pytest.mark.ros
@pytest.mark.slow
def test_enable_through_the_service_publishes_only_new_chunks(node, robot) -> None:
    t_call = robot.probe.now_ns()
    response = robot.enable(True)
    assert response.success and response.message == "enabled"
    robot.wait_chunks(3)
    assert all(header_ns(c) >= t_call for _, c in robot.chunks), "a chunk observed before enabling was published"
    assert robot.enable(True).message == "enabled (already)"


@pytest.mark.ros
@pytest.mark.slow
def test_a_urdf_on_robot_description_clamps_the_chunks(node, robot) -> None:
    """Every published chunk lies in the URDF's ranges (joint_1's upper and joint_7's range from parameters), every
    step ahead of its arrival within max_velocity * dt, and every action ahead within reach of the present
    position: joint_4 sits at 10 rad, moves at most 1 rad/s, and the model's actions are near 0."""
    probe = robot.probe
    robot.description.publish(String(data=URDF.read_text()))
    assert probe.wait_for(lambda: probe.diagnostics().get("limits.robot") == "safety_arm", 5), probe.diagnostics()
    t0 = robot.wait_chunks(5)
    time.sleep(0.5)
    checked = 0
    for t_recv, chunk in robot.chunks_since(t0):
        within_limits(chunk, LIMITS)
        a = chunk_array(chunk)
        due = header_ns(chunk) + (chunk.first_step + np.arange(len(a)) + 1) * round(DT_S * SEC)
        ahead = np.flatnonzero(due > t_recv)
        for j, name in enumerate(JOINTS):
            vel = LIMITS[name][2]
            if ahead.size > 1:
                steps = np.abs(np.diff(a[ahead, j]))
                assert steps.max() <= vel * DT_S + 1e-4, (name, steps, vel)
            # the joint state's time lies at most 0.5 s before this chunk's arrival (20 Hz joints, transport)
            reach = vel * ((due[ahead] - t_recv) / SEC + 0.5) + 1e-4
            assert np.all(np.abs(a[ahead, j] - PRESENT[name]) <= reach), (name, a[ahead, j], reach)
        checked += ahead.size > 0
    assert checked >= 3
    for trajectory in probe.trajectories(since=time.monotonic() - 0.5):
        positions = np.array([p.positions for p in trajectory.points])
        for j, name in enumerate(trajectory.joint_names):
            assert LIMITS[name][0] - 1e-5 <= positions[:, j].min() and positions[:, j].max() <= LIMITS[name][1] + 1e-5
    assert probe.wait_for(lambda: robot.count("limits.clamped_chunks") > 0 and robot.count("limits.joint_1.clamped") > 0
                          and "limits.joint_4.velocity_use" in probe.diagnostics(), 5), probe.diagnostics()
    diag = probe.diagnostics()
    assert diag["limits.joint_1"] == "[-1, 0.25], 50 /s (urdf+param)" and diag["limits.joint_7"].endswith("(param)")
    assert float(diag["limits.joint_1.position_margin"]) < 0, "the raw chunks went beyond joint_1's limit"
    assert float(diag["limits.joint_4.velocity_use"]) > 1
    assert "clamping joint_1" in node.output(), "the first clamp of a joint is logged"


@pytest.mark.ros
@pytest.mark.slow
def test_halt_stops_chunks_within_a_control_period_and_language_flows(node, robot) -> None:
    probe = robot.probe
    for publisher in (robot.halt_volatile, robot.halt_latched):  # volatile and latched publishers both work
        assert probe.wait_for(lambda p=publisher: p.get_subscription_count() >= 1, 5)
        robot.wait_chunks(2)
        language_before = len(probe.language())
        publisher.publish(Bool(data=True))
        assert robot.quiet_for(1.2) == [], "a chunk was published more than one control period after the halt"
        assert len(probe.language()) > language_before, "language stopped with the actions"
        assert probe.wait_for(lambda: probe.diagnostics().get("halted") == "True"
                              and probe.diagnostics().get("actions", "").startswith("withheld: halted"), 6), \
            probe.diagnostics()
        assert probe.received.diagnostic_level == 1 and "halted" in probe.received.diagnostic_message
        t_release = probe.now_ns()
        publisher.publish(Bool(data=False))
        robot.wait_chunks(2)
        assert all(header_ns(c) >= t_release for _, c in robot.chunks_since(t_release)), "a stale chunk"


@pytest.mark.ros
@pytest.mark.slow
def test_disable_and_enable_again_never_replays_a_stale_chunk(node, robot) -> None:
    assert robot.enable(False).message == "disabled"
    assert robot.quiet_for(1.0) == []
    assert robot.probe.wait_for(lambda: robot.probe.diagnostics().get("enabled") == "False", 6)
    t_enable = robot.probe.now_ns()
    robot.enable(True)
    t0 = robot.wait_chunks(2)
    assert all(header_ns(c) >= t_enable for _, c in robot.chunks_since(t0))
    assert robot.probe.wait_for(
        lambda: robot.count("withheld.observed_before_enable") + robot.count("withheld.disabled") > 0, 6), \
        robot.probe.diagnostics()


@pytest.mark.ros
@pytest.mark.slow
def test_nan_chunks_are_never_published(node, robot, faults: Path) -> None:
    before = robot.count("dropped.non_finite")
    t0 = robot.probe.now_ns()
    faults.write_text("nan:3")
    assert robot.probe.wait_for(lambda: robot.count("dropped.non_finite") >= before + 3, 8), robot.probe.diagnostics()
    robot.wait_chunks(2)
    assert all(np.isfinite(chunk_array(c)).all() for _, c in robot.chunks_since(t0))


@pytest.mark.ros
@pytest.mark.slow
def test_a_frame_that_raises_once_is_survived(node, robot, faults: Path) -> None:
    probe = robot.probe
    faults.write_text("raise:1")
    assert probe.wait_for(lambda: robot.count("error.RuntimeError") == 1, 8), probe.diagnostics()
    robot.wait_chunks(2)
    assert probe.wait_for(lambda: probe.diagnostics().get("faults.consecutive") == "0", 6)
    assert robot.state() == "active" and probe.diagnostics()["faults.total"] == "1"


@pytest.mark.ros
@pytest.mark.slow
def test_a_hanging_frame_trips_the_watchdog_and_its_chunk_is_dropped(node, robot, faults: Path) -> None:
    probe = robot.probe
    before = robot.count("dropped.chunk_too_old")
    faults.write_text("hang:1:2.0")  # one frame stalls 2 s; max_chunk_age_s = max_image_age_s + watchdog_s = 1 s
    assert probe.wait_for(lambda: probe.received.diagnostic_level == 2
                          and "watchdog" in probe.received.diagnostic_message, 5), probe.diagnostics()
    assert robot.count("watchdog.trips") == 1 and node.wait_for_output("watchdog: a frame has run", 5)
    assert probe.wait_for(lambda: robot.count("dropped.chunk_too_old") == before + 1, 5), probe.diagnostics()
    robot.wait_chunks(2)


@pytest.mark.ros
@pytest.mark.slow
def test_faults_in_every_frame_reach_the_error_state_and_configure_works_again(node, robot, faults: Path) -> None:
    probe = robot.probe
    faults.write_text("raise:*")
    # transition events arrive over DDS after the node changed state: wait for the last one
    assert probe.wait_for(lambda: "errorprocessing" in robot.transitions and robot.transitions[-1] == "unconfigured",
                          10), (robot.transitions, node.output()[-2000:])
    assert robot.state() == "unconfigured"
    assert probe.wait_for(lambda: probe.received.diagnostic_level == 2
                          and "max_consecutive_faults=3" in probe.received.diagnostic_message
                          and "injected fault" in probe.received.diagnostic_message
                          and probe.diagnostics().get("state") == "unconfigured", 5), \
        (probe.received.diagnostic_message, probe.diagnostics())
    assert robot.quiet_for(1.0) == [] and node.alive

    # configure again (the fault is gone), now rejecting chunks beyond the limits; the parameter overrides loosen
    faults.write_text("")
    robot.set_parameters({"limits.policy": "reject", "limits.joint_1.max": 100.0, "limits.joint_7.min": -100.0,
                          "limits.joint_7.max": 100.0, "limits.joint_2.max_velocity": 1e5})
    assert robot.transition(1) and robot.transition(3), node.output()[-2000:]  # configure, activate
    assert robot.state() == "active" and robot.enable(True).success
    assert probe.wait_for(lambda: probe.diagnostics().get("limits.policy") == "reject", 5)
    assert probe.received.diagnostic_level != 2, "the fault is forgotten once configured again"


@pytest.mark.ros
@pytest.mark.slow
def test_reject_drops_chunks_beyond_the_urdf_and_far_from_the_present(node, robot) -> None:
    probe = robot.probe
    # the latched URDF (safety_arm) reached the reconfigured node: the random model's chunks break its ranges
    assert probe.wait_for(lambda: robot.count("dropped.position_limit") >= 2, 8), probe.diagnostics()
    assert robot.quiet_for(1.0) == []
    assert probe.wait_for(lambda: robot.count("limits.rejected_chunks") >= 2, 6), probe.diagnostics()
    robot.description.publish(String(data=LOOSE_URDF))  # a new description replaces it
    assert probe.wait_for(lambda: probe.diagnostics().get("limits.robot") == "loose_arm", 5)
    robot.wait_chunks(2)
    before = robot.count("dropped.jump_from_present")
    robot.present["joint_4"] = 1e5  # the arm is far from where the chunk starts: 1e5 rad/s would be needed
    assert probe.wait_for(lambda: robot.count("dropped.jump_from_present") >= before + 2, 5), probe.diagnostics()
    assert robot.quiet_for(1.0) == []
    robot.present["joint_4"] = PRESENT["joint_4"]
    robot.wait_chunks(2)


@pytest.mark.ros
@pytest.mark.slow
def test_sigint_during_a_hanging_frame_exits_cleanly(node, robot, faults: Path) -> None:
    probe = robot.probe
    faults.write_text("hang:*")  # the next frame never ends
    assert probe.wait_for(lambda: "watchdog" in probe.received.diagnostic_message, 5), probe.diagnostics()
    t0 = time.monotonic()
    assert node.stop(signal.SIGINT, timeout=10) == 0, node.output()[-3000:]
    assert time.monotonic() - t0 < 5.0
    assert "Traceback" not in node.output()
