"""Chunk execution under inference delay (toy/world/delayed.py) and real-time chunking in the toy closed loop
(toy/train/rtc_eval.py): hand-computed switches and jumps, and RTC against the naive switch on a short real run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oxygen_ros.toy.world import TabletopWorld, WorldConfig
from oxygen_ros.toy.world.delayed import DelayedExecutor

BASE = np.array([0.5, 0.5, 1.0, 0.0])  # raised, gripper open: nothing is grasped, the world just moves
STEP_X = np.array([0.05, 0.0, 0.0, 0.0])


def _drive(ex: DelayedExecutor, chunk_of, seed: int = 3, frames: int = 5) -> list[int]:
    """Execute ``frames`` chunks ``chunk_of(k, observed_at)``; returns the observation steps."""
    ex.reset(seed)
    seen = []
    for k in range(frames):
        seen.append(ex.observed_at)
        ex.execute(chunk_of(k, ex.observed_at))
    return seen


def _constant(k: int, _origin: int, horizon: int = 8) -> np.ndarray:
    return np.tile(BASE + k * STEP_X, (horizon, 1))


def test_constant_chunks_switch_by_hand() -> None:
    world = TabletopWorld(WorldConfig(max_steps=100))
    ex = DelayedExecutor(world, delay=3, period=2)  # a late frame: the next one starts when it is ready
    assert _drive(ex, _constant) == [0, 3, 6, 9, 12]
    s0 = world.reset(3).state.astype(np.float64)
    ex = DelayedExecutor(world, delay=3, period=2)
    _drive(ex, _constant)
    want = [s0] * 3 + [BASE + k * STEP_X for k in range(4) for _ in range(3)]
    np.testing.assert_allclose(np.array(ex.commanded), np.array(want))
    assert [s.step for s in ex.switches] == [6, 9, 12, 15]  # the first chunk replaces the initial hold: no switch
    for s in ex.switches:
        np.testing.assert_allclose(s.jump, STEP_X)

    # LeRobot's weighted average: 0.3 old + 0.7 new where both chunks cover the step, the new one after that
    ex = DelayedExecutor(world, delay=3, period=2, blend="weighted_average")
    _drive(ex, _constant, frames=4)
    blend = 0.3 * (BASE + STEP_X) + 0.7 * (BASE + 2 * STEP_X)
    c = np.array(ex.commanded)
    np.testing.assert_allclose(c[6:8], [0.3 * BASE + 0.7 * (BASE + STEP_X)] * 2)  # chunk 0 covers steps 3..7
    np.testing.assert_allclose(c[8], BASE + STEP_X)
    np.testing.assert_allclose(c[9:11], [blend] * 2)
    np.testing.assert_allclose(c[11], BASE + 2 * STEP_X)
    for s in ex.switches:
        np.testing.assert_allclose(s.jump, 0.7 * STEP_X)


@pytest.mark.parametrize("blend", ["replace", "weighted_average"])
@pytest.mark.parametrize("delay, period", [(0, 2), (1, 2), (2, 2), (4, 2), (1, 3)])
def test_a_time_consistent_policy_never_jumps(blend: str, delay: int, period: int) -> None:
    """Action i of a chunk observed at step t is the command for step t + i: a policy that commands f(step)
    whatever its observation is followed exactly from the first take-over on (the chunk long enough to cover
    the next switch: 12 actions)."""
    from oxygen_ros.toy.train.rtc_eval import jerk

    def f(step):
        return BASE + np.array([0.01 * step - 0.2, 0.0, 0.0, 0.0])

    world = TabletopWorld(WorldConfig(max_steps=30))
    ex = DelayedExecutor(world, delay, period, blend)
    ex.reset(5)
    while not ex.done:
        t = ex.observed_at
        ex.execute(np.array([f(t + i) for i in range(12)]))
    c = np.array(ex.commanded)
    assert len(c) == 30 and len(ex.switches) > 3
    np.testing.assert_allclose(c[delay:], [f(s) for s in range(delay, 30)])
    np.testing.assert_allclose([np.abs(s.jump).max() for s in ex.switches], 0.0, atol=1e-12)
    np.testing.assert_allclose(jerk(c[delay:], 0.05), 0.0, atol=1e-6)


def test_a_chunk_that_ran_out_is_held() -> None:
    world = TabletopWorld(WorldConfig(max_steps=12))
    ex = DelayedExecutor(world, delay=0, period=4)
    ex.reset(1)
    ex.execute(np.array([BASE, BASE + STEP_X]))
    ex.execute(np.array([BASE + 3 * STEP_X] * 2))
    np.testing.assert_allclose(np.array(ex.commanded[:4]), [BASE, BASE + STEP_X, BASE + STEP_X, BASE + STEP_X])
    np.testing.assert_allclose(ex.switches[0].jump, 2 * STEP_X)  # against the held last action


def test_jerk_of_a_cubic() -> None:
    from oxygen_ros.toy.train.rtc_eval import jerk, switch_jumps

    steps = np.arange(10.0)
    c = np.stack([0.001 * steps ** 3, np.zeros(10), np.zeros(10), np.ones(10)], 1)
    np.testing.assert_allclose(jerk(c, 0.05), 0.006 / 0.05 ** 3)
    np.testing.assert_allclose(switch_jumps(np.array([[3.0, 4.0, 0.0, 1.0]])), [np.sqrt(26.0)])
    np.testing.assert_allclose(switch_jumps(np.array([[3.0, 4.0, 0.0, 1.0]]), slice(0, 3)), [5.0])


def test_bad_arguments_are_refused() -> None:
    world = TabletopWorld()
    with pytest.raises(ValueError, match="delay"):
        DelayedExecutor(world, -1, 2)
    with pytest.raises(ValueError, match="blend"):
        DelayedExecutor(world, 1, 2, "mean")
    ex = DelayedExecutor(world, 1, 2)
    ex.reset(0)
    with pytest.raises(ValueError, match="finite"):
        ex.execute(np.full((8, 4), np.nan))


def test_rtc_smooths_the_switches_of_the_toy_model(tmp_path) -> None:
    """Two held-out episodes at d = 3 (38% of the toy's 8-action chunk), the node's cadence (2 actions a tick):
    real-time chunking (identity guidance, delay estimated online) halves the naive switch jump at least, and
    succeeds as often; the runner's committed counts are the executor's (run_episode checks them)."""
    import dataclasses
    import json

    import torch
    import yaml

    from oxygen_ros.policy.rtc import PAPER_RTC
    from oxygen_ros.toy.train.rtc_eval import STRATEGIES, RTCClosedLoop, compare_table, markdown_table, summarize

    torch.set_num_threads(1)
    # the tabletop preset's guided region (8 actions of the 16-action chunk; guided over the whole remainder, seed
    # 1,000,000 stalls at d = 3: docs/rtc.md)
    preset = next(iter(yaml.safe_load((Path(__file__).parents[1] / "config" / "tabletop.yaml").read_text())
                       .values()))["ros__parameters"]["rtc"]
    assert preset["execution_horizon"] == 8
    loop = RTCClosedLoop(rtc=dataclasses.replace(PAPER_RTC, execution_horizon=preset["execution_horizon"]))
    naive, identity = STRATEGIES[0], STRATEGIES[1]
    seeds = (1_000_000, 1_000_001)
    rows = {}
    for strategy in (naive, identity):
        runner = loop.runner(strategy, 3)
        rows[strategy.name] = summarize([loop.run_episode(runner, strategy, 3, s) for s in seeds], loop.dt_s)
    plain, rtc = rows["naive"], rows["rtc_identity"]
    assert plain["guided_frames"] == 0 and rtc["guided_frames"] > 0 and rtc["guided_delays"] == [3]
    assert rtc["switches"] > 4
    assert rtc["jump_mean"] <= 0.5 * plain["jump_mean"], (rtc["jump_mean"], plain["jump_mean"])
    assert rtc["success_rate"] >= plain["success_rate"]
    # the delay fixed to d gives the same chunks as the online estimate (it measures d from the simulated clock)
    fixed = loop.runner(identity, 3, fixed_delay=True)
    again = summarize([loop.run_episode(fixed, identity, 3, seeds[0])], loop.dt_s)
    assert again["actions_sha1"][0] == rtc["actions_sha1"][0]
    # the tables of a run
    table = [{"strategy": k, "delay": 3, **v} for k, v in rows.items()]
    assert "| 3 (38%) | rtc_identity | 2/2 |" in markdown_table(table, 8)
    (tmp_path / "results.json").write_text(json.dumps({"rtc": dataclasses.asdict(loop.rtc), "rows": table}))
    compared = compare_table([tmp_path], [3]).splitlines()
    assert len(compared) == 4 and "| naive | - | - | 3 |" in compared[2]
    assert "| rtc_identity | exp | 5 | 3 |" in compared[3]
