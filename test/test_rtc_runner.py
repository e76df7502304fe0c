"""Real-time chunking at run time (policy/rtc.py, FrameRunner): the delay estimate (cold start, outliers, a window
and not the maximum ever), which part of the last chunk a new observation continues, delta dims re-referenced, and
consecutive chunks of a runner agreeing on the actions they share in time only with guidance."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import TWO_CAMERAS, random_policy

from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.rtc import RTCConfig
from oxygen_ros.policy import RawObservation
from oxygen_ros.policy.rtc import ChunkMemory, DelayEstimator, RTCSchedule
from oxygen_ros.policy.runner import FrameRunner

DT = 0.05
MS = 1_000_000


def test_delay_estimator_cold_start_and_outliers():
    est = DelayEstimator(DT, window=30, quantile=0.9)
    assert est.delay == 0 and est.age_s is None  # nothing measured: no delay assumed
    est.observe(1.0)  # the slow first call (a cold cache)
    assert est.delay == 20
    for _ in range(10):
        est.observe(0.06)
    assert est.delay == 2, "one slow call does not hold the estimate: a percentile, not the maximum ever"
    for _ in range(30):
        est.observe(0.06)
    est.observe(0.9)  # a GC pause among 30 normal frames
    assert est.delay == 2
    for _ in range(5):
        est.observe(0.14)  # frames got slower for good: the p90 follows within a few frames
    assert est.delay == 3
    est.observe(float("nan"))
    est.observe(-1.0)
    assert est.delay == 3, "non-finite and negative ages are ignored"
    exact = DelayEstimator(DT)
    exact.observe(0.1)
    assert exact.delay == 2, "a whole number of steps is not rounded up to one more"


def test_chunk_memory_remainder_follows_the_stamps():
    mem = ChunkMemory(DT)
    chunk = np.arange(30, dtype=np.float32).reshape(10, 3)
    assert mem.remainder(100 * MS, 2) is None  # nothing published yet
    mem.record(100 * MS, chunk, np.zeros(3))
    r = mem.remainder(200 * MS, 2)  # two steps later: the chunk's actions from index 2 on
    assert r.delay == 2 and np.array_equal(r.actions, chunk[2:])
    assert np.array_equal(mem.remainder(226 * MS, 1).actions, chunk[3:])  # rounded to the nearest step
    assert mem.remainder(100 * MS, 1) is None and mem.remainder(50 * MS, 1) is None  # not after the chunk
    assert mem.remainder(100 * MS + 10 * 50 * MS, 1) is None  # the chunk ended
    assert mem.remainder(0, 1) is None  # unstamped
    mem.clear()
    assert mem.remainder(200 * MS, 2) is None


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return random_policy(tmp_path_factory, std=0.1)


def test_rereference_moves_delta_dims_only(policy):
    """A remainder's delta dims are re-expressed relative to the new state: same absolute targets."""
    p = dataclasses.replace(policy.spec, delta_mask=(True, False) + (False,) * (policy.spec.action_dims - 2))
    delta = type(policy)(p, policy.model, policy.tokenizer)
    raw = RawObservation({TWO_CAMERAS[0]: np.zeros((32, 32, 3), np.uint8)}, np.full(8, 0.5), "go")
    new = delta.prepare(raw)
    actions = np.ones((4, p.action_dims), np.float32)
    old_ref = new.reference_state + 0.25
    moved = delta.rereference(actions, old_ref, new)
    assert np.allclose(moved[:, 0], 1.25) and np.array_equal(moved[:, 1:], actions[:, 1:])
    assert policy.rereference(actions, old_ref, new) is actions  # no delta dims: unchanged


def _run(policy, rtc: RTCConfig | None, frames: int = 6, stride: int = 2, delay: int = 2):
    """Frames 2 steps apart (stride), each chunk ready ``delay`` steps after its observation (a simulated clock);
    returns the chunks and, per frame, the gap on the actions it shares in time with the previous chunk."""
    cfg = EngineConfig(k=2, eos_id=-1, rtc=rtc)
    schedule = None if rtc is None else RTCSchedule(rtc, DT)
    runner = FrameRunner(policy, lambda: build_engine(policy.model, cfg), rtc=schedule)
    rng = np.random.default_rng(0)
    outs = []
    for f in range(frames):
        stamp = (1000 + f * stride * 50) * MS
        raw = RawObservation({TWO_CAMERAS[0]: rng.integers(0, 255, (32, 32, 3), np.uint8)}, rng.normal(size=8),
                             "pick the cube")
        outs.append(runner.step(raw, stamp_ns=stamp, clock_ns=lambda s=stamp: s + delay * 50 * MS).chunk)
    pairs = zip(outs[:-1], outs[1:], strict=True)
    gaps = [np.abs(b.chunk[:delay] - a.chunk[stride:stride + delay]).mean() for a, b in pairs]
    return outs, gaps, runner


def test_consecutive_chunks_agree_only_with_guidance(policy):
    """With RTC the actions a new chunk shares in time with the previous one (its frozen first d) follow it; without
    RTC they do not. The runner measures the delay from the simulated clock and publishes from the first action
    not yet committed."""
    plain, plain_gaps, _ = _run(policy, None)
    guided, guided_gaps, runner = _run(policy, RTCConfig(schedule="linear", execution_horizon=8))
    assert [c.guided for c in guided] == [False] + [True] * (len(guided) - 1)
    assert all(c.start == 2 for c in guided) and all(c.delay == 2 for c in guided[1:])
    assert runner.delay == 2 and np.array_equal(guided[1].published, guided[1].chunk[2:])
    assert all(c.start == 0 and not c.guided for c in plain)  # without RTC nothing is cut (consumers skip by time)
    assert np.mean(guided_gaps) < 0.2 * np.mean(plain_gaps), (guided_gaps, plain_gaps)
    assert np.array_equal(plain[0].chunk, guided[0].chunk)  # the first chunk has nothing to continue


def test_a_new_instruction_starts_free(policy):
    rtc = RTCConfig()
    runner = FrameRunner(policy, lambda: build_engine(policy.model, EngineConfig(eos_id=-1, rtc=rtc)),
                         rtc=RTCSchedule(rtc, DT, delay=1))
    img = {TWO_CAMERAS[0]: np.zeros((32, 32, 3), np.uint8)}
    first = runner.step(RawObservation(img, np.zeros(8), "a"), stamp_ns=1000 * MS).chunk
    second = runner.step(RawObservation(img, np.zeros(8), "a"), stamp_ns=1100 * MS).chunk
    third = runner.step(RawObservation(img, np.zeros(8), "b"), stamp_ns=1200 * MS).chunk
    assert (first.guided, second.guided, third.guided) == (False, True, False)
    with pytest.raises(ValueError, match="EngineConfig"):
        FrameRunner(policy, lambda: build_engine(policy.model, EngineConfig(eos_id=-1)), rtc=RTCSchedule(rtc, DT))
