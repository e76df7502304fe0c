"""The chunk executor as a separate process over real DDS (``python -m oxygen_ros.executor``), driven by a probe
node that publishes chunks, joint states, halt and a URDF and records the setpoints and ``~/executed``:

- setpoints follow the timing rule exactly, and ``~/executed`` carries the step and the plan;
- replace never uses a superseded chunk; aggregation equals LeRobot's weighted average over DDS;
- halt holds within one period and does not jump back when released;
- URDF and acceleration limits hold on every setpoint, and the first setpoint is rate-limited from the joint state;
- each output type carries the right joint order (at 100 and 500 Hz).

Each test starts its own executor on this module's ROS domain (localhost discovery) and waits for conditions,
never for a fixed snapshot of a periodic topic. The tests that judge *when* a setpoint is commanded run the executor
on simulated time (``use_sim_time``) and step /clock one command period at a time, waiting for each tick
(:meth:`ExecutorProbe.step`): an input arrives while time stands still, so a busy machine that delays DDS delivery
or the executor's timer by seconds changes nothing they check. The executor on the wall clock runs in
test_executor_launch.py and test_executor_rtc_loop.py (and the timing benchmark measures it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import require_ros, ros_domain

require_ros()

from oxygen_ros.executor.interpolation import Curve  # noqa: E402
from oxygen_ros.ros.stamps import stamp_to_ns  # noqa: E402
from oxygen_ros.testing import NodeProcess  # noqa: E402
from oxygen_ros.testing.executor_probe import ExecutorProbe  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

DOMAIN = ros_domain()
MS = 1_000_000
DT_S = 0.05
DT = 50 * MS
PERIOD = 10 * MS  # 100 Hz
T0 = 1000 * 10**9  # simulated time at the start

URDF = """<?xml version="1.0"?>
<robot name="executor_test_robot">
  <link name="base"/><link name="l1"/><link name="l2"/>
  <joint name="a" type="revolute"><parent link="base"/><child link="l1"/>
    <limit lower="-1.0" upper="1.0" velocity="0.5" effort="1"/></joint>
  <joint name="b" type="continuous"><parent link="l1"/><child link="l2"/>
    <limit velocity="1.0" effort="1"/></joint>
</robot>
"""


@contextlib.contextmanager
def executor(overrides: dict, output: str = "joint_state") -> Iterator[tuple[NodeProcess, ExecutorProbe]]:
    proc = NodeProcess(None, {"output": output, **overrides}, domain_id=DOMAIN, module="oxygen_ros.executor").start()
    probe = ExecutorProbe(DOMAIN, output=output)
    try:
        assert probe.wait_for_executor(40), proc.output()
        yield proc, probe
    finally:
        probe.close()
        proc.stop(timeout=10)


@contextlib.contextmanager
def sim_executor(overrides: dict, output: str = "joint_state") -> Iterator[tuple[NodeProcess, ExecutorProbe]]:
    """An executor on simulated time, standing at :data:`T0` until the test steps it."""
    with executor({"use_sim_time": True, **overrides}, output) as (proc, pr):
        pr.use_sim_clock(T0)
        yield proc, pr


def ns(stamp) -> int:
    return stamp_to_ns(stamp)


def outputs_through(pr: ExecutorProbe, t_ns: int) -> list:
    """The setpoints up to the tick at ``t_ns`` (recorded apart from ``~/executed``: wait for that tick's)."""
    assert pr.wait_for(lambda: any(ns(m.header.stamp) >= t_ns for m in pr.got_outputs()), 30), t_ns
    return [m for m in pr.got_outputs() if ns(m.header.stamp) <= t_ns]


def start_joints(pr: ExecutorProbe, names: list[str], positions, rate_hz: float = 50.0) -> None:
    """Stream joint states and wait until the executor has every one (its first setpoint starts from them)."""
    pr.stream_joints(names, positions, rate_hz=rate_hz)
    assert pr.wait_for(lambda: int(pr.diagnostic("joint_states.joints", "0")) >= len(names), 15), pr.diagnostics


def hold_value(rows: np.ndarray, stamp: int, first: int, tau: int, before: np.ndarray) -> np.ndarray:
    """The timing rule under ``hold``: the row whose due time passed last at ``tau`` (``before`` the first)."""
    step = (tau - stamp) // DT - 1
    if step < first:
        return before
    return rows[min(step, first + len(rows) - 1) - first]


def test_setpoints_follow_the_timing_rule_and_executed_carries_the_plan() -> None:
    """On simulated time (/clock from the probe, from 1000 s): every setpoint is the timing rule's at its tick's
    stamp, ``~/executed`` names the step and the rows ahead, the chunk running out is an underrun held (never
    extrapolated), and no chunk for ``stale_timeout_s`` of simulated time is stale."""
    with sim_executor({"command_rate_hz": 100.0, "interpolation": "hold", "stale_timeout_s": 1.0}) as (proc, pr):
        names = ["b", "a"]  # the chunk's own order: outputs and ~/executed keep it
        start_joints(pr, names, [0.0, 0.0])
        pr.step(PERIOD, 3)
        assert pr.got_outputs() == [], "a setpoint before any chunk"
        h, first = 8, 2
        rows = np.stack([np.arange(1, h + 1), -np.arange(1, h + 1)], axis=1).astype(np.float64)
        arrival = pr.sim_ns
        stamp = arrival + 35 * MS  # off the tick grid: due times fall between ticks
        pr.publish_chunk(rows, stamp, DT_S, names, frame_index=7, first_step=first)
        assert pr.wait_diagnostic("chunks.used", "1"), pr.diagnostics
        last = first + h - 1

        def due(step: int) -> int:
            return stamp + (step + 1) * DT

        ticks = pr.step(PERIOD, (due(last) - arrival) // PERIOD + 5)
        outs = outputs_through(pr, pr.sim_ns)
        assert outs and all(list(m.name) == names for m in outs)
        assert all(abs(ns(m.header.stamp) - T0) < 60 * 10**9 for m in outs)  # simulated time
        for m in outs:
            expect = hold_value(rows, stamp, first, ns(m.header.stamp), np.zeros(2))
            assert list(m.position) == list(expect), ((ns(m.header.stamp) - stamp) / MS, list(m.position))
        by_stamp = {ns(m.header.stamp): m for m in outs}
        assert all(ns(e.chunk_stamp) == stamp for e in ticks)
        following = [e for e in ticks if not e.holding]
        assert following and ticks[-1].holding and ticks[-1].step == last
        for e in ticks:
            tau = ns(e.header.stamp)
            assert e.frame_index == 7 and list(e.joint_names) == names and ns(e.dt) == DT
            assert e.step == max(-1, min(last, (tau - stamp) // DT - 1))
            assert e.holding == (tau >= due(last))
            assert list(e.setpoint) == list(by_stamp[tau].position)
        for e in following:  # the plan: the rows after the step in force, due from plan_start on
            plan = np.asarray(e.plan, dtype=np.float64).reshape(e.plan_length, 2)
            np.testing.assert_array_equal(plan, rows[e.step + 1 - first:] if e.step >= first else rows)
            assert ns(e.plan_start) == due(max(e.step + 1, first))
        assert pr.wait_diagnostic("underrun_ticks", str(sum(e.holding for e in ticks))), pr.diagnostics
        assert pr.diagnostic("underruns") == "1"
        # no chunk for stale_timeout_s (simulated): stale on the first tick past it, counted once, still holding
        pr.step(PERIOD, (arrival + 10**9 - pr.sim_ns) // PERIOD + 3)
        assert pr.wait_diagnostic("stale", "1"), pr.diagnostics
        assert pr.diagnostic("state") == "stale"
        assert all(m.position[0] == h for m in outputs_through(pr, pr.sim_ns) if ns(m.header.stamp) >= due(last))


@pytest.mark.parametrize("mode, rate", [("linear", 100.0), ("cubic", 500.0)])
def test_interpolation_gives_the_expected_values_on_a_known_chunk(mode: str, rate: float) -> None:
    period = round(1e9 / rate)
    with sim_executor({"command_rate_hz": rate, "interpolation": mode}) as (proc, pr):
        names, measured = ["a", "b"], [0.25, -0.5]
        start_joints(pr, names, measured)
        pr.step(period, 2)
        rows = np.array([[1.0, 0.0], [3.0, 1.0], [2.0, -1.0], [2.5, 0.5], [0.0, 0.0]])
        stamp = pr.sim_ns + 100 * MS
        pr.publish_chunk(rows, stamp, DT_S, names)
        assert pr.wait_diagnostic("chunks.used", "1"), pr.diagnostics
        end = stamp + len(rows) * DT
        pr.step(period, (end - pr.sim_ns) // period + 3)
        outs = outputs_through(pr, pr.sim_ns)
        # the path starts one period before the first setpoint, at rest at the measured position (no limits set)
        curve = Curve.through(mode, ns(outs[0].header.stamp) - period, np.array(measured), np.zeros(2),
                              stamp + (np.arange(len(rows)) + 1) * DT, rows)
        prev_t, prev_p = ns(outs[0].header.stamp) - period, np.array(measured)
        for m in outs:  # the velocity published is the one commanded: the step over the time since the last one
            pos, _ = curve.at(ns(m.header.stamp))
            np.testing.assert_allclose(m.position, pos, rtol=0, atol=1e-9)
            np.testing.assert_allclose(m.velocity, (pos - prev_p) / ((ns(m.header.stamp) - prev_t) / 1e9),
                                       rtol=0, atol=1e-5)
            prev_t, prev_p = ns(m.header.stamp), pos
        at_rows = [m for m in outs if (ns(m.header.stamp) - stamp) % DT == 0]  # ticks that fall on a due time
        assert len(at_rows) >= len(rows)
        for m in at_rows:
            t = (ns(m.header.stamp) - stamp) // DT - 1
            if 0 <= t < len(rows):
                np.testing.assert_allclose(m.position, rows[t], atol=1e-9)  # through the actions


def test_replace_never_uses_a_superseded_chunk_and_aggregate_matches_lerobot() -> None:
    for switch in ("replace", "aggregate"):
        with sim_executor({"command_rate_hz": 100.0, "interpolation": "hold", "switch": switch,
                           "aggregate": "weighted_average"}) as (proc, pr):
            names = ["a"]
            start_joints(pr, names, [0.0])
            s = pr.sim_ns + 100 * MS
            a = np.arange(20, dtype=np.float64)[:, None]
            b = 100.0 + np.arange(20, dtype=np.float64)[:, None]
            pr.publish_chunk(a, s, DT_S, names, frame_index=1)
            assert pr.wait_diagnostic("chunks.used", "1"), pr.diagnostics
            pr.step(PERIOD, 25)  # A in force, three of its rows done
            s_b = s + 3 * DT  # on A's grid, overlapping it
            pr.publish_chunk(b, s_b, DT_S, names, frame_index=2)
            assert pr.wait_diagnostic("chunks.used", "2"), pr.diagnostics
            pr.publish_chunk(500.0 + a, s + DT, DT_S, names, frame_index=3)  # older than B: superseded
            assert pr.wait_diagnostic("chunks.not_used.superseded", "1"), pr.diagnostics
            (e,) = pr.step(PERIOD)
            assert ns(e.chunk_stamp) == s_b and e.plan_length
            start = ns(e.plan_start)
            for i, got in enumerate(e.plan):
                tau = start + i * DT
                t_b = (tau - s_b) // DT - 1
                t_a = (tau - s) // DT - 1
                expect = b[t_b, 0]
                if switch == "aggregate" and t_a <= 19:  # LeRobot: 0.3 old + 0.7 new where both hold a value
                    expect = 0.3 * a[t_a, 0] + 0.7 * b[t_b, 0]
                assert got == pytest.approx(expect, rel=1e-6), (i, got, expect)
            pr.step(PERIOD, 30)
            outs = outputs_through(pr, pr.sim_ns)
            assert all(m.position[0] < 500 for m in outs), "a superseded chunk was executed"


def test_halt_holds_within_one_period_and_does_not_jump_back() -> None:
    with sim_executor({"command_rate_hz": 100.0, "interpolation": "linear", "limits.a.max_velocity": 2.0}) \
            as (proc, pr):
        names = ["a"]

        def robot() -> list[float]:  # a robot that follows its setpoints
            outs = pr.got_outputs()
            return [outs[-1].position[0] if outs else 0.0]

        start_joints(pr, names, robot, rate_hz=100.0)
        pr.publish_chunk(np.linspace(0.0, 1.9, 40)[:, None], pr.sim_ns, DT_S, names)  # 1 /s for 2 s
        assert pr.wait_diagnostic("chunks.used", "1"), pr.diagnostics
        for _ in range(100):  # (no setpoint until the executor has a joint state to start from)
            (e,) = pr.step(PERIOD)
            if e.setpoint and e.setpoint[0] > 0.3:
                break
        moving = e.setpoint[0]
        assert moving > 0.3
        pr.halt(True)
        assert pr.wait_diagnostic("halts", "1"), pr.diagnostics
        ticks = pr.step(PERIOD, 20)  # the first tick after the halt arrived holds, exactly, from then on
        assert all(list(e.setpoint) == [moving] and e.holding for e in ticks), [list(e.setpoint) for e in ticks]
        assert pr.wait_diagnostic("state", "halted"), pr.diagnostics
        released_after = pr.sim_ns
        pr.halt(False)
        for _ in range(20):  # the release arrives at some simulated time after released_after
            pr.step(PERIOD)
            if pr.wait_diagnostic("state", "waiting_for_chunk", 1.5):
                break
        assert pr.diagnostic("state") == "waiting_for_chunk", pr.diagnostics
        pr.publish_chunk(np.full((20, 1), 1.9), released_after - 20 * MS, DT_S, names, frame_index=5)  # before
        assert pr.wait_diagnostic("chunks.not_used.observed_before_release", "1"), pr.diagnostics
        pr.step(PERIOD, 20)
        halted_from = ns(ticks[0].header.stamp)
        held = [m.position[0] for m in outputs_through(pr, pr.sim_ns) if ns(m.header.stamp) >= halted_from]
        assert held and all(v == moving for v in held)
        t_new = pr.sim_ns
        pr.publish_chunk(np.full((20, 1), 1.9), t_new, DT_S, names, frame_index=6)
        assert pr.wait_diagnostic("chunks.used", "2"), pr.diagnostics
        pr.step(PERIOD, 30)
        resumed = [m.position[0] for m in outputs_through(pr, pr.sim_ns) if ns(m.header.stamp) > t_new]
        assert resumed[-1] > moving + 0.1
        steps = np.abs(np.diff([moving] + resumed))
        assert steps.max() <= 2.0 * PERIOD / 1e9 * (1 + 1e-9), steps.max()  # rate-limited from the held position


def test_limits_hold_on_every_setpoint_and_the_first_is_rate_limited() -> None:
    overrides = {"command_rate_hz": 100.0, "interpolation": "linear", "limits.a.max_acceleration": 2.0,
                 "limits.b.max_acceleration": 4.0}
    with sim_executor(overrides) as (proc, pr):
        names, measured = ["a", "b"], [0.2, -0.3]
        pr.publish_urdf(URDF)
        start_joints(pr, names, measured)
        assert pr.wait_diagnostic("limits.robot", "executor_test_robot"), pr.diagnostics
        rows = np.array([[1.5, 3.0], [-1.5, -3.0]] * 6)  # far beyond what the limits allow
        pr.publish_chunk(rows, pr.sim_ns, DT_S, names)
        assert pr.wait_diagnostic("chunks.used", "1"), pr.diagnostics
        pr.step(PERIOD, 80)  # past the chunk's last due time (12 rows of 50 ms)
        outs = outputs_through(pr, pr.sim_ns)
        assert len(outs) == 80
        stamps = np.array([ns(m.header.stamp) for m in outs], dtype=np.int64)
        t = (stamps - stamps[0]).astype(np.float64) / 1e9  # integer first: float seconds since 1970 lose the ns
        p = np.array([list(m.position) for m in outs])
        h0 = 0.01  # the first setpoint: one period from rest at the measured position
        assert np.all(np.abs(p[0] - measured) <= np.array([2.0, 4.0]) * h0 * h0 + 1e-9), p[0]
        assert np.all(np.diff(t) > 0)
        v = np.diff(p, axis=0) / np.diff(t)[:, None]
        acc = np.diff(v, axis=0) / np.diff(t)[1:, None]
        v0 = (p[0] - measured) / h0
        tol = 1e-6
        assert (p[:, 0] >= -1.0 - tol).all() and (p[:, 0] <= 1.0 + tol).all()
        assert np.abs(v[:, 0]).max() <= 0.5 * (1 + tol) and np.abs(v[:, 1]).max() <= 1.0 * (1 + tol)
        assert np.abs(acc[:, 0]).max() <= 2.0 * (1 + tol) and np.abs(acc[:, 1]).max() <= 4.0 * (1 + tol)
        assert np.all(np.abs((v[0] - v0) / (t[1] - t[0])) <= np.array([2.0, 4.0]) * (1 + tol))
        assert pr.wait_for(lambda: int(pr.diagnostic("limits.a.limited_setpoints", "0")) > 0, 5), pr.diagnostics
        bad = pr.publish_chunk(rows, pr.sim_ns, DT_S, names)  # bad input: counted, never a crash
        bad.horizon = 5
        pr.chunk_pub.publish(bad)
        assert pr.wait_for(lambda: pr.diagnostic("chunks.malformed") == "1", 5), pr.diagnostics
        assert proc.alive


def test_invalid_parameters_stop_it_with_every_problem_named() -> None:
    proc = NodeProcess(None, {"switch": "blend", "command_rate_hz": -1.0, "limits.a.max_acceleration": 0.0},
                       domain_id=DOMAIN, module="oxygen_ros.executor").start()
    try:
        assert proc.proc.wait(60) == 2, proc.output()
    finally:
        proc.stop()
    out = proc.output()
    assert all(name in out for name in ("switch", "command_rate_hz", "limits.a.max_acceleration")), out


@pytest.mark.parametrize("output, rate", [("float64_array", 500.0), ("joint_state", 100.0), ("trajectory", 100.0)])
def test_each_output_carries_the_joint_order(output: str, rate: float) -> None:
    """Every output type in ``output_joints`` order, one tick per command period (simulated time: each step of one
    period must bring exactly that tick, so a wrong rate times out)."""
    period = round(1e9 / rate)
    overrides = {"command_rate_hz": rate, "interpolation": "hold", "joint_map": ["j_c:wrist"],
                 "output_joints": ["wrist", "j_a", "j_b"]}
    with sim_executor(overrides, output=output) as (proc, pr):
        start_joints(pr, ["j_a", "j_b", "wrist"], [1.0, 2.0, 3.0])  # the robot's names
        pr.publish_chunk(np.tile([1.0, 2.0, 3.0], (10, 1)), pr.sim_ns, DT_S, ["j_a", "j_b", "j_c"])
        assert pr.wait_diagnostic("chunks.used", "1"), pr.diagnostics
        ticks = pr.step(period, 20)
        assert pr.wait_for(lambda: len(pr.got_outputs()) >= 20, 10), proc.output()
        m = pr.got_outputs()[-1]
        if output == "float64_array":
            assert list(m.data) == [3.0, 1.0, 2.0]
        elif output == "joint_state":
            assert list(m.name) == ["wrist", "j_a", "j_b"] and list(m.position) == [3.0, 1.0, 2.0]
            assert ns(m.header.stamp) == pr.sim_ns
        else:
            assert list(m.joint_names) == ["wrist", "j_a", "j_b"] and len(m.points) == 1
            assert list(m.points[0].positions) == [3.0, 1.0, 2.0]
            assert ns(m.points[0].time_from_start) == period
        e = ticks[-1]
        assert list(e.joint_names) == ["j_a", "j_b", "j_c"] and list(e.setpoint) == [1.0, 2.0, 3.0]
        assert np.all(np.diff([ns(e.header.stamp) for e in pr.got_executed()][-20:]) == period)


def test_an_output_joint_the_chunk_lacks_withholds_the_output_and_says_so() -> None:
    with executor({"command_rate_hz": 100.0, "output_joints": ["j_a", "elbow"]}, output="float64_array") as (proc, pr):
        pr.stream_joints(["j_a"], [0.0])
        pr.publish_chunk(np.ones((10, 1)), pr.now_ns(), DT_S, ["j_a"])
        assert pr.wait_for(lambda: int(pr.diagnostic("output_withheld.output_joints", "0")) > 10, 10), pr.diagnostics
        assert "elbow" in pr.diagnostic_message and pr.got_outputs() == []
