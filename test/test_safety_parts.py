"""The safety parts a node a humanoid can trust is built from, without a node: output limits from the robot's URDF
and parameters (limit math: clamp / reject, velocity between actions and from the present joint state, non-finite
actions; URDF parsing), the enable gate, the fault counter, the watchdog, the test-only fault injection and an image
too old on arrival. test_safety.py drives one node process through every check over real DDS.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import require_ros

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
    require_ros(messages=False)
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
