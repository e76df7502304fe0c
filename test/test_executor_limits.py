"""The executor's limits at any tick spacing (property tests, hypothesis): whatever the spacing of the ticks and
wherever the targets lie (beyond the range ends included), no setpoint leaves the range, and the velocity and the
acceleration computed from successive setpoints and their real stamps never exceed the limits; the velocity
published is the one those setpoints imply, also when leaving rest and at the range ends."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from oxygen_ros.executor.setpoint_limits import SetpointLimiter
from oxygen_ros.executor.streamer import SetpointStreamer
from oxygen_ros.executor.timeline import Chunk, Timeline
from oxygen_ros.robot.limits import JointLimit

TOL = 1e-9
MS = 1_000_000

spacing = st.floats(0.0002, 0.06)  # tick spacings from 5 kHz to 17 Hz, in any order
limits = st.tuples(st.floats(-2.0, 0.0), st.floats(0.05, 2.0), st.floats(0.05, 3.0), st.floats(0.2, 30.0))


def check(p: np.ndarray, v: np.ndarray, t: np.ndarray, lo, hi, vmax, amax, start_v: float = 0.0) -> None:
    """Position, velocity and acceleration of a single joint's setpoints ``p`` at stamps ``t`` (seconds; p[0] the
    starting point), and the published velocity ``v`` against the positions."""
    h = np.diff(t)
    vel = np.diff(p) / h
    acc = np.diff(np.concatenate([[start_v], vel])) / h
    assert (p >= lo - TOL).all() and (p <= hi + TOL).all(), (p.min(), p.max(), lo, hi)
    assert np.abs(vel).max(initial=0) <= vmax * (1 + 1e-9) + TOL, (np.abs(vel).max(), vmax)
    assert np.abs(acc).max(initial=0) <= amax * (1 + 1e-7) + 1e-6, (np.abs(acc).max(), amax, np.argmax(np.abs(acc)))
    np.testing.assert_allclose(v, vel, rtol=1e-9, atol=1e-6)  # the velocity published agrees with the positions


@settings(max_examples=150, deadline=None)
@given(lim=limits, start=st.floats(0.0, 1.0), hs=st.lists(spacing, min_size=5, max_size=150),
       targets=st.lists(st.floats(-4.0, 4.0), min_size=1, max_size=12), seed=st.integers(0, 2**16))
def test_limiter_holds_at_any_tick_spacing(lim, start, hs, targets, seed) -> None:
    lo, width, vmax, amax = lim
    hi = lo + width
    limiter = SetpointLimiter(("j",), {"j": JointLimit(lo, hi, vmax, "param", amax)})
    rng = np.random.default_rng(seed)
    p, v = np.array([lo + start * width]), np.zeros(1)
    ps, vs, ts, t = [p[0]], [], [0.0], 0.0
    for i, h in enumerate(hs):  # targets beyond either end at times, switched at random ticks
        target = np.array([targets[(i * len(targets)) // len(hs)] + (rng.normal() * 0.01 if seed % 2 else 0.0)])
        p, v = limiter.step(p, v, target, h)
        t += h
        ps.append(p[0])
        vs.append(v[0])
        ts.append(t)
    check(np.array(ps), np.array(vs), np.array(ts), lo, hi, vmax, amax)


@settings(max_examples=20, deadline=None)
@given(vmax=st.floats(0.2, 2.0), amax=st.floats(0.5, 20.0), hs=st.lists(st.floats(0.001, 0.03), min_size=40,
       max_size=80))
def test_a_joint_driven_into_its_range_end_stops_in_time(vmax, amax, hs) -> None:
    """Full speed toward the upper end, then irregular ticks: it stops at the end, never decelerating too hard."""
    limiter = SetpointLimiter(("j",), {"j": JointLimit(-1.0, 1.0, vmax, "param", amax)})
    d = min(1.9, vmax**2 / (2 * amax) + 0.01)  # from inside the range, as fast as still allows stopping
    p, v = np.array([1.0 - d]), np.array([min(vmax, np.sqrt(2 * amax * d) * (1 - 1e-9))])
    v0 = float(v[0])
    ps, vs, ts = [p[0]], [], [0.0]
    i = 0
    while ts[-1] < vmax / amax + 0.5:  # braking takes vmax / amax; then half a second at the end
        h = hs[i % len(hs)]
        i += 1
        p, v = limiter.step(p, v, np.array([5.0]), h)
        ps.append(p[0])
        vs.append(v[0])
        ts.append(ts[-1] + h)
    check(np.array(ps), np.array(vs), np.array(ts), -1.0, 1.0, vmax, amax, start_v=v0)
    assert ps[-1] > 1.0 - 1e-3  # and it gets there


def chunk(stamp_ns: int, rows: np.ndarray, frame: int, dt_ns: int = 50 * MS) -> Chunk:
    return Chunk(stamp_ns, frame, dt_ns, rows[:, None], 0, ("j",))


@settings(max_examples=60, deadline=None)
@given(hs=st.lists(st.integers(200_000, 40 * MS), min_size=50, max_size=250),
       rows=st.lists(st.floats(-3.0, 3.0), min_size=2, max_size=10), every=st.integers(3, 40),
       mode=st.sampled_from(["hold", "linear", "cubic"]), measured=st.floats(-0.9, 0.9))
def test_streamer_holds_the_limits_at_any_tick_spacing(hs, rows, every, mode, measured) -> None:
    """The executor's core over irregular ticks: chunks beyond the range ends, underruns, leaving rest from the
    measured position over the real time since the previous setpoint."""
    s = SetpointStreamer(Timeline(), mode, period_ns=10 * MS)
    s.set_limits({"j": JointLimit(-1.0, 1.0, 1.5, "param", 6.0)})
    now, frame = 0, 0
    ps, vs, ts = [], [], []
    a = np.asarray(rows)
    for i, h in enumerate(hs):
        now += h
        if i % every == 0:  # a new chunk now and then (the last one may run out: an underrun, held)
            frame += 1
            s.offer(chunk(now, np.roll(a, frame) * (-1) ** frame, frame), now)
        sp = s.tick(now, np.array([ps[-1] if ps else measured]))
        if sp.position is not None:
            ps.append(sp.position[0])
            vs.append(sp.velocity[0])
            ts.append(now / 1e9)
    # the first setpoint leaves rest at the measured position one period earlier (nothing commanded before)
    check(np.array([measured] + ps), np.array(vs), np.array([ts[0] - 0.01] + ts), -1.0, 1.0, 1.5, 6.0)
