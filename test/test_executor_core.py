"""The chunk executor's pure parts (oxygen_ros/executor): the timing rule, switching (replace never uses a
superseded chunk; aggregation equals LeRobot's async-inference formulas and ACT's temporal ensemble), each
interpolation mode on a known chunk, underruns, halt, stale, and the limits (position, velocity and acceleration on
every setpoint; the first setpoint rate-limited from the measured position)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oxygen_ros.executor.aggregation import parse_aggregate
from oxygen_ros.executor.interpolation import Curve
from oxygen_ros.executor.setpoint_limits import SetpointLimiter
from oxygen_ros.executor.streamer import SetpointStreamer
from oxygen_ros.executor.timeline import Chunk, Timeline
from oxygen_ros.robot.limits import JointLimit

MS = 1_000_000
DT = 50 * MS
NAMES = ("a", "b")


def chunk(stamp_ms: float, rows, first_step: int = 0, frame: int | None = None, dt: int = DT) -> Chunk:
    a = np.asarray(rows, dtype=np.float64)
    a = a if a.ndim == 2 else np.stack([a, -a], axis=1)
    return Chunk(int(stamp_ms * MS), int(stamp_ms) if frame is None else frame, dt, a, first_step, NAMES)


# ---------------------------------------------------------------------------------------------- timing rule
def test_timing_rule_due_times_and_step() -> None:
    c = chunk(1000, [1, 2, 3, 4], first_step=2)
    assert c.due_ns(2) == 1000 * MS + 3 * DT  # row 0 is step 2: stamp + (2 + 0 + 1) dt
    assert c.step_at(1000 * MS + DT - 1) == -1
    assert c.step_at(1000 * MS + DT) == 0
    assert c.step_at(1000 * MS + 3 * DT + 1) == 2
    assert c.step_at(1000 * MS + 100 * DT) == 5  # at most the last step (first_step + H - 1)


def test_replace_takes_over_at_the_first_row_not_yet_due() -> None:
    t = Timeline()
    assert t.offer(chunk(0, [1, 2, 3, 4, 5, 6]), now_ns=0) is None
    now = 120 * MS  # rows 0 and 1 (due 50, 100 ms) have passed
    assert t.offer(chunk(60, [10, 20, 30, 40, 50, 60]), now_ns=now) is None
    # the new chunk's rows: due 110, 160, 210... -> the first not yet due is row 1 (160 ms)
    assert t.plan.start == 1 and t.plan.times_ns[0] == 160 * MS
    np.testing.assert_array_equal(t.plan.values[:, 0], [20, 30, 40, 50, 60])
    first, ahead = t.plan.ahead(170 * MS)
    assert first == 2 and ahead[0, 0] == 30


def test_replace_never_uses_a_superseded_or_expired_chunk() -> None:
    t = Timeline()
    assert t.offer(chunk(100, [1, 2, 3]), 0) is None
    assert t.offer(chunk(50, [9, 9, 9]), 10 * MS) == "superseded"  # older stamp
    assert t.offer(chunk(100, [9, 9, 9]), 10 * MS) == "superseded"  # the same chunk again
    assert t.offer(chunk(120, [7, 7]), 400 * MS) == "expired"  # every row is due before now
    assert t.rejected == {"superseded": 2, "expired": 1}
    np.testing.assert_array_equal(t.plan.values[:, 0], [1, 2, 3])
    t.clear(released_ns=200 * MS)
    assert t.offer(chunk(150, [5, 5, 5, 5, 5, 5]), 210 * MS) == "observed_before_release"
    assert t.offer(chunk(200, [5, 5, 5]), 210 * MS) is None


def lerobot_aggregate(queue: dict[int, np.ndarray], latest: int, incoming: dict[int, np.ndarray], fn) -> dict:
    """LeRobot's RobotClient._aggregate_action_queues, transcribed: timesteps <= latest are skipped, new ones
    added, overlapping ones merged with fn(old, new); the result holds only the incoming timesteps."""
    out = {}
    for step, action in incoming.items():
        if step <= latest:
            continue
        out[step] = action if step not in queue else fn(queue[step], action)
    return out


@pytest.mark.parametrize("name, fn", [
    ("weighted_average", lambda old, new: 0.3 * old + 0.7 * new),
    ("average", lambda old, new: 0.5 * old + 0.5 * new),
    ("conservative", lambda old, new: 0.7 * old + 0.3 * new),
    ("latest_only", lambda old, new: new),
])
def test_aggregation_equals_lerobot_on_overlapping_chunks(name, fn) -> None:
    rng = np.random.default_rng(0)
    t = Timeline("aggregate", parse_aggregate(name))
    queue: dict[int, np.ndarray] = {}
    # chunks of 8 actions every 3 steps on one grid (stamp = step * dt): three-way overlaps
    for i, start in enumerate(range(0, 15, 3)):
        rows = rng.normal(size=(8, 2))
        # LeRobot's timestep g is due at g * dt; our row j of the chunk stamped start * dt at the same time as
        # g = start + j + 1. At now, timesteps up to start have been executed (latest_action = start).
        now = start * DT + DT // 2
        t.offer(Chunk(start * DT, i, DT, rows, 0, NAMES), now)
        queue = lerobot_aggregate(queue, start, {start + j + 1: rows[j] for j in range(8)}, fn)
        first, ahead = t.plan.ahead(now)
        expect = np.array([queue[s] for s in sorted(queue)])
        assert sorted(queue)[0] == start + first + 1
        np.testing.assert_allclose(ahead, expect, rtol=0, atol=1e-12)


def test_temporal_ensemble_weights_oldest_first() -> None:
    m = 0.5
    t = Timeline("aggregate", parse_aggregate(f"temporal_ensemble({m})"))
    preds = []
    for i in range(4):  # four chunks, all predicting step 10 (due 11 dt after stamp 0)
        rows = np.full((12 - i, 2), float(i + 1))
        t.offer(Chunk(i * DT, i, DT, rows, 0, NAMES), i * DT + DT // 2)
        preds.append(float(i + 1))
    w = np.exp(-m * np.arange(4))
    expect = float(np.dot(w, preds) / w.sum())
    covered, values, counts = t.plan.value_at(np.array([11 * DT]))
    assert covered[0] and counts[0] == 4
    assert values[0, 0] == pytest.approx(expect, abs=1e-12)
    with pytest.raises(ValueError):
        parse_aggregate("temporal_ensemble(x)")
    with pytest.raises(ValueError):
        parse_aggregate("median")


# ---------------------------------------------------------------------------------------------- interpolation
def test_interpolation_values_on_a_known_chunk() -> None:
    times = np.array([100, 200, 300]) * MS
    values = np.array([[1.0], [3.0], [2.0]])
    anchor = np.array([0.0])
    hold = Curve.through("hold", 0, anchor, None, times, values)
    assert hold.at(50 * MS)[0][0] == 0.0 and hold.at(100 * MS)[0][0] == 1.0 and hold.at(250 * MS)[0][0] == 3.0
    lin = Curve.through("linear", 0, anchor, None, times, values)
    assert lin.at(50 * MS)[0][0] == pytest.approx(0.5) and lin.at(150 * MS)[0][0] == pytest.approx(2.0)
    assert lin.at(150 * MS)[1][0] == pytest.approx(20.0)  # (3 - 1) / 0.1 s
    cub = Curve.through("cubic", 0, anchor, np.array([4.0]), times, values)
    for t, v in zip(times, values, strict=True):  # through every action
        assert cub.at(int(t))[0][0] == pytest.approx(v[0])
    assert cub.at(0)[1][0] == pytest.approx(4.0)  # starts with the anchor's velocity
    assert cub.at(1)[1][0] == pytest.approx(4.0, abs=1e-3)
    # Catmull-Rom: the velocity at 200 ms is (2 - 1) / 0.2 s; Hermite midpoint of [100, 200] ms
    m0, m1 = (3.0 - 0.0) / 0.2 * 0.1, (2.0 - 1.0) / 0.2 * 0.1
    assert cub.at(150 * MS)[0][0] == pytest.approx(0.5 * 1 + 0.125 * m0 + 0.5 * 3 - 0.125 * m1)
    for curve in (hold, lin, cub):  # past the end: hold the last action, never extrapolate
        pos, vel = curve.at(900 * MS)
        assert pos[0] == 2.0 and vel[0] == 0.0


def velocity_step_at_switch(mode: str) -> tuple[float, float]:
    """(|velocity change|, |position change|) over the tick at which a chunk with another slope takes over."""
    s = SetpointStreamer(Timeline(), mode, period_ns=2 * MS)
    s.offer(chunk(0, np.linspace(0.05, 1.0, 20)), 0)  # 1 /s
    now, before, prev = 0, None, None
    for _ in range(100):
        now += 2 * MS
        if now == 162 * MS:
            s.offer(chunk(150, np.linspace(0.25, 0.35, 20)), now)  # ahead of the old one, then slower
            before = prev
        sp = s.tick(now, np.zeros(2))
        if before is not None:
            return abs(sp.velocity[0] - before.velocity[0]), abs(sp.position[0] - before.position[0])
        prev = sp
    raise AssertionError("no switch")


def test_cubic_is_velocity_continuous_at_a_chunk_switch() -> None:
    cubic_dv, cubic_dp = velocity_step_at_switch("cubic")
    linear_dv, _ = velocity_step_at_switch("linear")
    assert linear_dv > 1.0  # the straight line to the new chunk's first row turns at once (1 -> 2.25 /s)
    assert cubic_dv < 0.3 * linear_dv, (cubic_dv, linear_dv)  # the cubic starts with the velocity it had
    assert cubic_dp < 1.3 * 0.002  # and the position moves on by about one tick at ~1 /s


# ---------------------------------------------------------------------------------------------- limits
def test_limits_hold_on_every_setpoint_including_acceleration() -> None:
    rng = np.random.default_rng(1)
    lim = {"a": JointLimit(-1.0, 1.0, 2.0, "param", 10.0), "b": JointLimit(None, None, 0.5, "param", 3.0)}
    limiter = SetpointLimiter(NAMES, lim)
    h = 0.002
    p, v = np.zeros(2), np.zeros(2)
    ps, vs = [p], [v]
    target = np.zeros(2)
    for i in range(6000):
        if i % 97 == 0 and i < 3000:
            target = rng.uniform(-1.5, 1.5, size=2)  # beyond the range at times; then 6 s to settle
        p, v = limiter.step(p, v, target, h)
        ps.append(p)
        vs.append(v)
    ps, vs = np.array(ps), np.array(vs)
    vel = np.diff(ps, axis=0) / h
    acc = np.diff(vel, axis=0) / h
    assert (ps[:, 0] >= -1.0 - 1e-12).all() and (ps[:, 0] <= 1.0 + 1e-12).all()
    assert np.abs(vel[:, 0]).max() <= 2.0 + 1e-9 and np.abs(vel[:, 1]).max() <= 0.5 + 1e-9
    assert np.abs(acc[:, 0]).max() <= 10.0 + 1e-6 and np.abs(acc[:, 1]).max() <= 3.0 + 1e-6
    np.testing.assert_allclose(ps[-1], np.clip(target, [-1, -np.inf], [1, np.inf]), atol=1e-9)  # gets there


def test_first_setpoint_is_rate_limited_from_the_joint_state() -> None:
    s = SetpointStreamer(Timeline(), "linear", period_ns=10 * MS)
    s.set_limits({"a": JointLimit(None, None, 1.0, "param", 5.0), "b": JointLimit(None, None, 1.0, "param")})
    s.offer(chunk(0, [2.0, 2.0, 2.0]), 0)
    assert s.tick(5 * MS, None).state == "waiting_joint_states"  # never a setpoint without the robot's position
    measured = np.array([0.3, 0.1])
    sp = s.tick(10 * MS, measured)
    # one period from rest at the measured position: at most a h^2 (accel) and v h (velocity)
    assert abs(sp.position[0] - 0.3) <= 5.0 * 0.01 ** 2 + 1e-12
    assert abs(sp.position[1] - 0.1) <= 1.0 * 0.01 + 1e-12
    assert sp.position[0] > 0.3  # and toward the chunk


# ---------------------------------------------------------------------------------------------- holds
def test_exhausted_chunk_holds_and_counts() -> None:
    s = SetpointStreamer(Timeline(), "hold", period_ns=10 * MS)
    s.offer(chunk(0, [1.0, 2.0, 3.0]), 0)
    out = [s.tick(t * MS, np.zeros(2)) for t in range(10, 400, 10)]
    assert out[-1].state == "exhausted" and out[-1].holding
    assert all(sp.position[0] == 3.0 for sp in out if sp.stamp_ns >= 150 * MS)  # no extrapolation past 3.0
    assert s.counts["underruns"] == 1 and s.counts["underrun_ticks"] == sum(sp.stamp_ns >= 150 * MS for sp in out)
    assert out[-1].step == 2 and len(out[-1].plan) == 0
    s.offer(chunk(390, [4.0, 5.0]), 395 * MS)  # a new chunk ends the underrun
    assert s.tick(440 * MS, np.zeros(2)).state == "following"


def test_halt_holds_at_once_and_does_not_jump_back() -> None:
    s = SetpointStreamer(Timeline(), "linear", period_ns=10 * MS)
    s.offer(chunk(0, np.linspace(0, 1, 20)), 0)
    for t in range(10, 210, 10):
        last = s.tick(t * MS, np.zeros(2))
    s.set_halted(True, 205 * MS)
    held = s.tick(210 * MS, np.zeros(2))
    assert held.state == "halted" and held.position[0] == last.position[0]
    assert s.offer(chunk(206, np.ones(10)), 207 * MS) == "halted"
    s.set_halted(False, 300 * MS)
    assert s.offer(chunk(250, np.ones(10)), 301 * MS) == "observed_before_release"
    after = s.tick(310 * MS, np.zeros(2))
    assert after.state == "waiting_for_chunk" and after.position[0] == last.position[0]


def test_stale_stop_or_hold() -> None:
    for mode in ("stop", "hold"):
        s = SetpointStreamer(Timeline(), "hold", period_ns=10 * MS, stale_timeout_ns=100 * MS, on_stale=mode)
        s.offer(chunk(0, np.ones(40)), 0)
        s.tick(50 * MS, np.zeros(2))
        sp = s.tick(150 * MS, np.zeros(2))
        assert sp.state == "stale" and s.counts["stale"] == 1
        assert (sp.position is None) == (mode == "stop")
        s.tick(160 * MS, np.zeros(2))
        assert s.counts["stale"] == 1  # once per stale period
        assert math.isfinite(s.diagnostics()["setpoints"])
