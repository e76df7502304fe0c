"""``rtc.remainder_source: executor`` at the policy level: the remainder built from the chunk executor's plans (the
newest plan that still had each time ahead, aligned on the nearest row, fresh only), robot units -> the model's
space (the inverse of postprocess), and the frame runner guiding toward it, falling back to the timing rule."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import TWO_CAMERAS, random_policy

from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.rtc import RTCConfig
from oxygen_ros.policy import RawObservation
from oxygen_ros.policy.adapters import decode_actions, encode_actions
from oxygen_ros.policy.executed_plan import ExecutedPlanRecord, PlanHistory
from oxygen_ros.policy.rtc import RTCSchedule
from oxygen_ros.policy.runner import FrameRunner

DT = 0.05
MS = 1_000_000
DT_NS = 50 * MS


def _plan(stamp_ms: int, start_ms: int, values: list[float], dims: int = 2) -> ExecutedPlanRecord:
    rows = np.repeat(np.asarray(values, dtype=np.float64)[:, None], dims, axis=1)
    return ExecutedPlanRecord(stamp_ms * MS, start_ms * MS, DT_NS, rows)


def test_remainder_takes_each_time_from_the_newest_plan_that_had_it_ahead():
    h = PlanHistory(DT, max_age_s=0.25)
    assert h.remainder(1000 * MS, 1000 * MS, 5) is None  # no plan yet
    assert h.add(_plan(1000, 1010, [1, 2, 3, 4, 5, 6])) is None  # rows at 1010, 1060, ... ms
    assert h.add(_plan(1070, 1110, [30, 40, 50])) is None  # re-planned at 1070 (e.g. a new chunk aggregated)
    # observation at 1005 ms: times 1055, 1105, 1155, 1205, 1255 -> rows due 1060 (only the first plan had it),
    # 1110, 1160, 1210 (the newest plan's), then nothing covers 1255
    r = h.remainder(1005 * MS, 1100 * MS, 10)
    assert r.shape == (4, 2) and r[:, 0].tolist() == [2, 30, 40, 50]
    assert h.remainder(1005 * MS, 1100 * MS, 2)[:, 1].tolist() == [2, 30]  # at most the horizon
    assert h.remainder(1005 * MS, 1400 * MS, 10) is None  # the newest plan is 330 ms old: not fresh
    assert h.remainder(1300 * MS, 1100 * MS, 10) is None  # nothing covers stamp + dt
    assert "older" in h.add(_plan(1050, 1060, [9]))
    assert "dt" in h.add(ExecutedPlanRecord(1100 * MS, 1110 * MS, 10 * MS, np.zeros((3, 2))))
    assert "finite" in h.add(ExecutedPlanRecord(1100 * MS, 1110 * MS, DT_NS, np.full((3, 2), np.nan)))
    h.clear()
    assert h.remainder(1005 * MS, 1100 * MS, 10) is None


def test_aloha_actions_decode_back():
    rng = np.random.default_rng(0)
    actions = rng.uniform(0.2, 0.8, (5, 14))
    assert np.allclose(encode_actions(decode_actions(actions, "aloha"), "aloha"), actions)
    assert decode_actions(actions, "none") is actions


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return random_policy(tmp_path_factory, std=0.1)


def test_model_actions_inverts_postprocess_with_delta_dims(policy):
    spec = dataclasses.replace(policy.spec, delta_mask=(True, False) + (False,) * (policy.spec.action_dims - 2))
    delta = type(policy)(spec, policy.model, policy.tokenizer)
    prepared = delta.prepare(RawObservation({TWO_CAMERAS[0]: np.zeros((32, 32, 3), np.uint8)}, np.full(8, 0.5),
                                            "go"))
    robot = np.random.default_rng(1).normal(size=(6, spec.action_dims))
    model = delta.model_actions(robot, prepared)
    assert model.dtype == np.float32 and not np.allclose(model[:, 0], robot[:, 0])  # relative to the state
    assert np.allclose(delta.postprocess(model, prepared), robot, atol=1e-5)


def _runner(policy, delay: int = 3) -> FrameRunner:
    rtc = RTCConfig(schedule="linear", execution_horizon=8)
    return FrameRunner(policy, lambda: build_engine(policy.model, EngineConfig(k=2, eos_id=-1, rtc=rtc)),
                       rtc=RTCSchedule(rtc, DT, delay=delay))


def _obs(seed: int) -> RawObservation:
    rng = np.random.default_rng(seed)
    return RawObservation({TWO_CAMERAS[0]: rng.integers(0, 255, (32, 32, 3), np.uint8)}, rng.normal(size=8),
                          "pick the cube")


def test_the_runner_guides_toward_the_executed_plan_and_falls_back(policy):
    runner = _runner(policy)
    first = runner.step(_obs(0), stamp_ns=1000 * MS).chunk
    target = np.tile(np.linspace(-1.0, 1.0, policy.spec.action_dims), (6, 1))  # far from what the model says
    runner.executed_remainder = lambda stamp_ns: target if stamp_ns == 1100 * MS else None
    pending = runner.begin(_obs(1), stamp_ns=1100 * MS, instruction="pick the cube")
    assert np.allclose(policy.postprocess(pending.frame.rtc.actions, pending.prepared), target, atol=1e-5)
    assert pending.frame.rtc.delay == 3
    assert runner.last_remainder[0] == "executor" and runner.remainder_counts["executor"] == 1
    guided = runner.step(_obs(1), stamp_ns=1100 * MS).chunk
    free = _runner(policy).step(_obs(1), stamp_ns=1100 * MS).chunk
    assert guided.guided and not free.guided
    # the frozen first d actions follow the plan, not the model's own chunk
    assert np.abs(guided.chunk[:3] - target[:3]).mean() < 0.5 * np.abs(free.chunk[:3] - target[:3]).mean()
    # no fresh plan: the timing rule (the last chunk from the new stamp on), counted
    fallback = runner.begin(_obs(2), stamp_ns=1200 * MS, instruction="pick the cube")
    assert fallback.frame.rtc is not None and runner.remainder_counts["executor_fallback"] == 1
    assert runner.last_remainder[0] == "timing_rule"
    assert first.end == policy.spec.chunk_size  # under RTC the whole chunk is published
    # a new instruction starts free even with a plan
    runner.executed_remainder = lambda stamp_ns: target
    assert runner.begin(_obs(3), stamp_ns=1300 * MS, instruction="something else").frame.rtc is None
