"""A node a humanoid can trust: output limits from the robot's URDF and parameters (clamp / reject, velocity between
actions and from the present joint state, non-finite actions), the enable gate and the halt input, the watchdog, and
repeated faults that end in the lifecycle's error processing.

Unit tests of the pure parts first (limit math, URDF parsing, gate, counters, the test-only fault injection), then
one node process over real DDS driven through every check in turn (the tests share it and run in file order: a
URDF on /robot_description clamps chunks; parameters override it; a first action far from the present joint state
is caught; enable and disable through ~/enable; ~/halt stops chunks within one control period while language flows;
NaN chunks are never published; a frame that raises once recovers; a hanging frame trips the watchdog and its chunk
is dropped; faults in every frame reach the error state, after which configure works again, now under reject; and
SIGINT during a hang exits 0 within 5 s).
"""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import require_ros, ros_domain

from oxygen_ros.policy.hooks import RUNNER_HOOK_ENV, install_runner_hook
from oxygen_ros.robot.faults import FaultCounter
from oxygen_ros.robot.gate import ActionGate
from oxygen_ros.robot.limiter import ActionLimiter
from oxygen_ros.robot.limits import JointLimit, merge_limits
from oxygen_ros.robot.newest import NewestPerPublisher
from oxygen_ros.robot.urdf import UrdfError, urdf_limits
from oxygen_ros.robot.watchdog import FrameWatchdog
from oxygen_ros.runtime.params import ParamError, validate
from oxygen_ros.testing.fault_injection import FaultInjector, fault_env, parse_program

REPO = Path(__file__).resolve().parents[1]
URDF = REPO / "test" / "fixtures" / "urdf" / "safety_arm.urdf"
JOINTS = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
SEC = 1_000_000_000
MS = 1_000_000


# ---------------------------------------------------------------------------------------------- URDF
def test_urdf_limits_follow_the_joint_types() -> None:
    robot, limits, notes = urdf_limits(URDF.read_text())
    assert robot == "safety_arm" and notes == []
    assert limits["joint_1"] == JointLimit(-1.0, 1.0, 50.0, "urdf")
    assert limits["joint_3"] == JointLimit(0.0, 0.3, 5.0, "urdf"), "prismatic: a range and a velocity"
    assert limits["joint_4"] == JointLimit(None, None, 1.0, "urdf"), "continuous: a velocity, no range"
    assert "joint_7" not in limits, "fixed joints have no limits"
    assert limits["gripper_mimic"].upper == 0.04


@pytest.mark.parametrize("text", ["", "<robot", "<robot/>", "<notarobot name='x'/>",
                                  '<robot name="r"><joint name="j" type="revolute"><parent link="a"/><child link="b"/>'
                                  '<limit lower="low" upper="1" effort="1" velocity="1"/></joint></robot>'])
def test_a_bad_robot_description_is_an_error(text: str) -> None:
    with pytest.raises(UrdfError):
        urdf_limits(text)


def test_odd_urdf_limits_are_noted_not_taken() -> None:
    xml = ('<robot name="r"><link name="a"/><link name="b"/><link name="c"/>'
           '<joint name="flipped" type="revolute"><parent link="a"/><child link="b"/>'
           '<limit lower="1" upper="-1" effort="1" velocity="0"/></joint>'
           '<joint name="bare" type="revolute"><parent link="b"/><child link="c"/></joint></robot>')
    _, limits, notes = urdf_limits(xml)
    assert limits["flipped"].empty, "lower > upper: no range; velocity 0: no velocity limit"
    assert "bare" not in limits and any("bare" in n for n in notes) and any("flipped" in n for n in notes)


def test_parameters_override_the_urdf_field_by_field() -> None:
    _, urdf, _ = urdf_limits(URDF.read_text())
    merged = merge_limits(urdf, {"joint_1": {"max": 0.25}, "joint_7": {"min": -0.2, "max": 0.2}})
    assert merged["joint_1"] == JointLimit(-1.0, 0.25, 50.0, "urdf+param")
    assert merged["joint_7"] == JointLimit(-0.2, 0.2, None, "param")
    assert merged["joint_2"] == urdf["joint_2"]


# ---------------------------------------------------------------------------------------------- limit math
def limiter(policy: str = "clamp", **kw) -> ActionLimiter:
    lim = ActionLimiter(["a", "b", "c"], policy, **kw)
    lim.set_urdf({"a": JointLimit(-1.0, 1.0, 10.0, "urdf"), "b": JointLimit(None, None, 2.0, "urdf")}, "r")
    return lim


DT = 0.1
STAMP = 100 * SEC


def test_a_chunk_within_the_limits_passes_unchanged() -> None:
    actions = np.array([[0.1, 0.0, 5.0], [0.5, 0.1, -50.0], [0.9, 0.3, 1e6]], np.float32)
    out = limiter("reject").check(actions, DT, STAMP, STAMP)
    assert out.reason == "" and out.actions is actions and not out.clamped


def test_clamp_keeps_the_range_and_the_steps() -> None:
    lim = limiter()
    rng = np.random.default_rng(0)
    actions = (rng.standard_normal((10, 3)) * 3).astype(np.float32)
    out = lim.check(actions, DT, STAMP, STAMP)
    a = out.actions
    assert a.dtype == np.float32 and a.shape == (10, 3) and set(out.clamped) == {"a", "b"}
    assert a[:, 0].min() >= -1.0 and a[:, 0].max() <= 1.0
    assert np.abs(np.diff(a[:, 0])).max() <= 10.0 * DT + 1e-6 and np.abs(np.diff(a[:, 1])).max() <= 2.0 * DT + 1e-6
    np.testing.assert_array_equal(a[:, 2], actions[:, 2]), "a joint without limits is left alone"
    assert lim.check(a, DT, STAMP, STAMP).clamped == [], "a clamped chunk passes the check"
    assert out.notes and lim.check(actions, DT, STAMP, STAMP).notes == [], "logged the first time only"
    diag = lim.diagnostics()
    assert float(diag["limits.a.position_margin"]) < 0 and float(diag["limits.b.velocity_use"]) > 1
    assert diag["limits.clamped_chunks"] == 2 and diag["limits.a.clamped"] == 2 and "limits.c" not in diag


def test_the_first_action_ahead_is_bounded_by_the_present_position() -> None:
    """Actions 0-2 of the chunk are due at or before now; action 3 is the first ahead, due 0.1 s after the joint
    positions arrived: b (max 2 /s) may then be at most 0.2 from where it is (5.0), and each later action 0.2 on."""
    actions = np.zeros((6, 3), np.float32)
    now = STAMP + 300 * MS
    present, present_ns = np.array([0.0, 5.0, np.nan]), np.full(3, now)
    out = limiter().check(actions, DT, STAMP, now, present, present_ns)
    np.testing.assert_allclose(out.actions[3:, 1], [4.8, 4.6, 4.4], atol=1e-5)
    np.testing.assert_array_equal(out.actions[:3, 1], 0.0), "actions already due are not dragged along"
    assert out.clamped == ["b"]
    shifted = limiter().check(actions[3:], DT, STAMP, now, present, present_ns, first_step=3)  # rows from action 3
    np.testing.assert_allclose(shifted.actions[:, 1], [4.8, 4.6, 4.4], atol=1e-5)
    rejected = limiter("reject").check(actions, DT, STAMP, now, present, present_ns)
    assert rejected.actions is None and rejected.reason == "jump_from_present" and "b" in rejected.detail
    far_past = limiter("reject").check(actions, DT, STAMP, STAMP + SEC, present, present_ns)
    assert far_past.actions is not None, "no action ahead: nothing to bound (the age limit handles it)"


@pytest.mark.parametrize("actions, reason", [
    ([[0.0, 0.0, 0.0], [1.5, 0.0, 0.0]], "position_limit"),
    ([[0.0, 0.0, 0.0], [0.0, 0.5, 0.0]], "velocity_limit"),
    ([[0.0, 0.0, 0.0], [0.0, 0.0, np.nan]], "non_finite"),
    ([[0.0, 0.0, 0.0], [0.0, np.inf, 0.0]], "non_finite"),
])
def test_reject_names_the_rule(actions, reason: str) -> None:
    out = limiter("reject").check(np.array(actions, np.float32), DT, STAMP, STAMP)
    assert out.actions is None and out.reason == reason


def test_non_finite_actions_are_rejected_under_clamp_too() -> None:
    out = limiter("clamp").check(np.array([[np.nan, 0, 0]], np.float32), DT, STAMP, STAMP)
    assert out.actions is None and out.reason == "non_finite"


def test_required_limits_block_unlimited_joints() -> None:
    lim = ActionLimiter(["a", "b"], required=True)
    assert lim.check(np.zeros((2, 2), np.float32), DT, STAMP, STAMP).reason == "limits_missing"
    assert lim.set_urdf({"a": JointLimit(-1, 1, None, "urdf")}) == ["b"]
    assert lim.check(np.zeros((2, 2), np.float32), DT, STAMP, STAMP).reason == "limits_missing"
    lim.set_urdf({"a": JointLimit(-1, 1, None, "urdf"), "b": JointLimit(None, None, 1.0, "urdf")})
    assert lim.check(np.zeros((2, 2), np.float32), DT, STAMP, STAMP).reason == ""


def test_limit_parameters_are_validated_by_name() -> None:
    base = {"model": "random_tiny", "joint_names": JOINTS}
    p = validate({**base, "limits.joint_1.max": 0.25, "limits": {"policy": "reject", "joint_2": {"max_velocity": 3}}})
    assert p.limits_policy == "reject"
    assert p.joint_limits == {"joint_1": {"max": 0.25}, "joint_2": {"max_velocity": 3.0}}
    assert not p.extra
    with pytest.raises(ParamError) as e:
        validate({**base, "limits.joint_1.maximum": 1.0, "limits.joint_2.min": "low", "limits.joint_3.max_velocity": 0,
                  "limits.joint_4.min": 1.0, "limits.joint_4.max": -1.0, "limits.policy": "ignore"})
    names = sorted(problem.split(":")[0] for problem in e.value.problems)
    assert names == ["limits.joint_1.maximum", "limits.joint_2.min", "limits.joint_3.max_velocity",
                     "limits.joint_4.min", "limits.policy"], e.value.problems


# ---------------------------------------------------------------------------------------------- gate, counters
def test_the_gate_never_replays_a_chunk_from_before_it_opened() -> None:
    gate = ActionGate(enabled=False, now_ns=0)
    assert gate.why_closed(5 * SEC) == "disabled"
    gate.set_enabled(True, 10 * SEC)
    assert gate.why_closed(9 * SEC) == "observed_before_enable" and gate.why_closed(10 * SEC) is None
    gate.set_halted(True, 11 * SEC)
    assert gate.why_closed(12 * SEC) == "halted"
    assert not gate.set_halted(True, 12 * SEC), "a repeated halt changes nothing"
    gate.set_halted(False, 13 * SEC)
    assert gate.why_closed(12 * SEC) == "observed_before_enable" and gate.why_closed(13 * SEC) is None
    assert gate.withheld == {"disabled": 1, "observed_before_enable": 2, "halted": 1}
    assert gate.diagnostics()["actions"] == "published"


def test_a_latched_message_seen_twice_is_taken_once() -> None:
    newest = NewestPerPublisher()
    info = lambda seq: {"publisher_gid": {"data": [1, 2]}, "publication_sequence_number": seq}  # noqa: E731
    assert newest.is_new(info(1)) and newest.is_new(info(2))
    assert not newest.is_new(info(1)), "the late duplicate of an older message"
    assert newest.is_new(None) and newest.is_new({})


def test_the_fault_counter_trips_once_after_consecutive_failures() -> None:
    faults = FaultCounter(3)
    assert [faults.failure(RuntimeError("x")) for _ in range(2)] == [False, False]
    faults.success()
    assert [faults.failure(RuntimeError(str(i))) for i in range(4)] == [False, False, True, False]
    assert faults.tripped and faults.consecutive == 4 and faults.last == "RuntimeError: 3"
    faults.reset()
    assert not faults.tripped and faults.total == 0
    never = FaultCounter(0)
    assert not any(never.failure(RuntimeError()) for _ in range(100))


def test_the_watchdog_reports_each_long_frame_once() -> None:
    now = [0.0]
    dog = FrameWatchdog(0.5, clock=lambda: now[0])
    dog.begin()
    now[0] = 0.4
    assert dog.check() is None and not dog.tripped
    now[0] = 0.6
    assert dog.check() == pytest.approx(0.6) and dog.tripped and dog.check() is None
    now[0] = 2.0
    assert dog.end() == pytest.approx(2.0) and not dog.tripped and dog.trips == 1
    dog.begin()
    now[0] = 2.1
    assert dog.end() is None


# ---------------------------------------------------------------------------------------------- fault injection
class _Expert(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.action_out_proj = torch.nn.Linear(2, 2)


def test_the_fault_program_runs_frame_by_frame(tmp_path: Path) -> None:
    assert [(p.kind, p.frames, p.seconds) for p in parse_program("raise:2, nan:*,hang:1:0.5")] == \
        [("raise", 2, math.inf), ("nan", math.inf, math.inf), ("hang", 1, 0.5)]
    with pytest.raises(ValueError):
        parse_program("explode:1")
    model = _Expert()
    runner = SimpleNamespace(step=lambda: model.action_out_proj(torch.ones(1, 2)))
    program = tmp_path / "faults"
    program.write_text("pass:1,raise:1,nan:1")
    FaultInjector(f"@{program}").install(runner, model)
    assert torch.isfinite(runner.step()).all()
    with pytest.raises(RuntimeError, match="injected fault"):
        runner.step()
    assert torch.isnan(runner.step()).all()
    assert torch.isfinite(runner.step()).all(), "after the program: normal frames"
    program.write_text("hang:1:0.2")  # a new program from the changed file
    t0 = time.monotonic()
    assert torch.isfinite(runner.step()).all() and time.monotonic() - t0 >= 0.2


def test_the_runner_hook_installs_fault_injection_only_when_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Production code installs no fault injection of its own: only the module the hook's variable names."""
    model = _Expert()
    runner = SimpleNamespace(step=lambda: model.action_out_proj(torch.ones(1, 2)))
    logged: list[str] = []
    for name in fault_env(""):
        monkeypatch.delenv(name, raising=False)
    assert install_runner_hook(runner, model, logged.append) is None and not logged
    for name, value in fault_env("raise:1").items():
        monkeypatch.setenv(name, value)
    injector = install_runner_hook(runner, model, logged.append)
    assert injector is not None and "TEST-ONLY" in logged[0]
    with pytest.raises(RuntimeError, match="injected fault"):
        runner.step()
    injector.release()
    monkeypatch.setenv(RUNNER_HOOK_ENV, "oxygen_ros.no_such_hook")
    with pytest.raises(ImportError):
        install_runner_hook(runner, model, logged.append)


# ---------------------------------------------------------------------------------------------- inputs
def test_an_image_already_too_old_on_arrival_is_rejected_with_its_reason() -> None:
    pytest.importorskip("rclpy", reason="rclpy is not installed")
    from oxygen_ros.ros.diagnostics import ReasonCounter
    from oxygen_ros.ros.image_conversion import array_to_image_msg
    from oxygen_ros.ros.input_store import InputStore

    now = 50 * SEC
    store = InputStore(["cam"], JOINTS, ReasonCounter(None, "rejected"), node_clock_ns=lambda: now,
                       max_image_age_s=0.5)
    image = np.zeros((8, 8, 3), np.uint8)
    assert not store.on_image(0, array_to_image_msg(image, now - 600 * MS))
    assert store.on_image(0, array_to_image_msg(image, now - 400 * MS))
    assert store.rejected.snapshot() == {"image_too_old": 1} and len(store.camera_buffers()[0]) == 1


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

    def call(self, client, request, timeout: float = 10.0):
        assert client.wait_for_service(timeout_sec=timeout), client.srv_name
        future = client.call_async(request)
        assert self.probe.wait_for(future.done, timeout), f"{client.srv_name} did not answer"
        return future.result()

    def enable(self, on: bool) -> SetBool.Response:
        return self.call(self.enable_client, SetBool.Request(data=on))

    def transition(self, transition_id: int) -> bool:
        request = ChangeState.Request()
        request.transition.id = transition_id
        return self.call(self.change, request, 60.0).success

    def state(self) -> str:
        return self.call(self.get, GetState.Request()).current_state.label

    def set_parameters(self, values: dict) -> None:
        request = SetParameters.Request(parameters=[Parameter(k, value=v).to_parameter_msg()
                                                    for k, v in values.items()])
        assert all(r.successful for r in self.call(self.set_params, request).results)

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
