"""Priorities under k=auto: spare decode time goes to higher-priority rows, nothing starves, tokens never change."""

from __future__ import annotations

import time

import pytest
import torch
from conftest import make_model, make_observation

from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.requests import Frame, LanguageRequest, RequestState
from oxygen_ros.engine.scheduler import Scheduler


def _scheduler(deadline_s: float = 1.08) -> Scheduler:
    sched = Scheduler(EngineConfig(k="auto", deadline_s=deadline_s, max_inflight=8), 9, batched=True)
    for batch in range(1, 10):  # a step costs 0.1 s whatever the batch: the arithmetic below stays exact
        sched.budget.observe(batch, 0.1)
    sched.begin_frame(0, None, time.perf_counter())
    return sched


def _add(sched: Scheduler, slot: int, priority: int, max_new_tokens: int = 30) -> RequestState:
    st = RequestState(len(sched.inflight), LanguageRequest("memory", max_new_tokens, priority=priority), slot, 0,
                      None, 8, 8, time.perf_counter())
    sched.inflight.append(st)
    return st


def test_spare_time_goes_to_the_higher_priority_rows() -> None:
    sched = _scheduler(deadline_s=1.08)  # 0.918 s after the safety factor (0.85): 9 forwards of 0.1 s
    low = [_add(sched, s, priority=0) for s in (0, 1)]
    high = _add(sched, 2, priority=5)
    sched.frame_budget()
    # one forward over everyone (k_min), then the 8 forwards left over the high-priority row alone
    assert [sched._allow[r.request_id] for r in low] == [1, 1]
    assert sched._allow[high.request_id] == 9
    steps = {r.request_id: 0 for r in sched.inflight}
    while (batch := sched.schedule(1 << 30)) is not None:
        for r in batch.active:
            r.frame_steps += 1
            steps[r.request_id] += 1
    assert steps == {low[0].request_id: 1, low[1].request_id: 1, high.request_id: 9}


def test_a_short_request_of_high_priority_leaves_the_rest_to_lower_levels() -> None:
    sched = _scheduler(deadline_s=1.08)
    low = _add(sched, 0, priority=0)
    high = _add(sched, 1, priority=1, max_new_tokens=3)  # needs 3 steps, leaves time for the low row
    sched.frame_budget()
    assert sched._allow[high.request_id] == 3
    assert sched._allow[low.request_id] == 1 + 9 - 3  # the level's forwards include the high row until it is done


def test_equal_priorities_keep_the_plain_budget() -> None:
    sched = _scheduler()
    for s in range(3):
        _add(sched, s, priority=2)
    k = sched.frame_budget()
    assert sched._allow == {} and k == 9


def test_fixed_k_ignores_priorities() -> None:
    sched = Scheduler(EngineConfig(k=2, max_inflight=4), 5, batched=True)
    sched.begin_frame(0, None, time.perf_counter())
    _add(sched, 0, priority=0)
    _add(sched, 1, priority=9)
    assert sched.frame_budget() == 2 and sched._allow == {}


@pytest.fixture(scope="module")
def model():
    return make_model(seed=3)


def test_nothing_starves_and_tokens_match_isolated_under_a_tight_deadline(model) -> None:
    """A question of high priority every frame, memories of low priority every 3rd frame, a deadline that leaves
    time for little more than one forward: every low-priority request still advances every frame it is in flight,
    so it finishes within its own step count of frames; the texts equal the isolated engine's."""
    cfg = dict(max_inflight=24, max_new_tokens=12, max_prompt_tokens=8)
    oxygen = build_engine(model, EngineConfig(k="auto", deadline_s=0.02, **cfg))
    isolated = build_engine(model, EngineConfig(mode="isolated", **cfg))
    finished: dict[str, dict[tuple[int, str], list[int]]] = {"oxygen": {}, "isolated": {}}
    seen_steps: dict[int, int] = {}
    for i in range(24):
        reqs = [LanguageRequest("answer", 6, [5, 6, 7], stream="ask", priority=10)]
        if i % 3 == 0:
            reqs.append(LanguageRequest("memory", 12, [], stream="memory", priority=0))
        obs = make_observation(model.config, seed=100 + i)
        noise = torch.randn(1, model.config.action_horizon, model.config.action_dim,
                            generator=torch.Generator().manual_seed(i))
        for name, engine in (("oxygen", oxygen), ("isolated", isolated)):
            out = engine.step(Frame(obs, [LanguageRequest(**vars(r)) for r in reqs], noise))
            assert out.rejected == 0
            for f in out.finished:
                finished[name][(f.frame_index, f.stream)] = f.tokens
                if name == "oxygen" and f.stream == "memory":
                    assert f.frames <= 12  # one step per frame at least: done within its 12 steps of frames
        for st in oxygen.inflight:  # every request in flight advanced this frame
            if st.request.stream == "memory" and st.request_id in seen_steps:
                assert st.steps > seen_steps[st.request_id]
            seen_steps[st.request_id] = st.steps
    memories = {k[0] for k in finished["oxygen"] if k[1] == "memory"}
    assert memories >= {0, 3, 6, 9, 12}  # every memory that had its 12 frames finished
    for key, tokens in finished["oxygen"].items():
        assert tokens == finished["isolated"][key], key
