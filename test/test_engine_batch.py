"""``Engine.step_batch``: several observations prefilled and denoised together give each one the chunk and the
language outputs it gets alone, and their requests join the engine's continuous batched decode."""

from __future__ import annotations

import pytest
import torch

from oxygen_ros.engine import Observation, Pi05Model, get_config
from oxygen_ros.engine.checkpoint import init_random_weights
from oxygen_ros.engine.engine import Engine, EngineConfig, Frame, LanguageRequest
from oxygen_ros.engine.observation import stack_observations

CFG = get_config("tiny", None)


@pytest.fixture(scope="module")
def model() -> Pi05Model:
    torch.set_num_threads(1)
    return init_random_weights(Pi05Model(CFG), seed=0).eval()


def observation(tokens: int, seed: int) -> Observation:
    g = torch.Generator().manual_seed(seed)
    s = CFG.vision.image_size
    return Observation(torch.rand(1, CFG.num_cameras, 3, s, s, generator=g) * 2 - 1,
                       torch.tensor([[True, True, seed % 2 == 0]]), torch.randint(2, 500, (1, tokens), generator=g),
                       torch.ones(1, tokens, dtype=torch.bool))


def frames(n: int) -> list[Frame]:
    g = torch.Generator().manual_seed(99)
    return [Frame(observation(5 + 3 * i, i), [LanguageRequest("memory", 6)] if i != 1 else [],
                  torch.randn(1, CFG.action_horizon, CFG.action_dim, generator=g), stamp=i) for i in range(n)]


@pytest.mark.parametrize("mode", ["oxygen", "isolated"])
def test_a_batched_frame_equals_each_observation_alone(model: Pi05Model, mode: str) -> None:
    batch = frames(4)
    alone = []
    for f in batch:
        r = Engine(model, EngineConfig(mode=mode, k=100, max_new_tokens=8)).step(f)
        alone.append((r.actions[0], [x.tokens for x in r.finished]))
    engine = Engine(model, EngineConfig(mode=mode, k=100, max_new_tokens=8))
    seen = []
    result = engine.step_batch(batch, on_actions=lambda i, chunks: seen.append(i))
    assert seen == [0, 1, 2, 3] and result.actions == [] and engine.frame_index == 1
    for i, (chunk, tokens) in enumerate(alone):
        torch.testing.assert_close(result.batch_actions[i][0], chunk, rtol=0, atol=1e-5)
        mine = [x.tokens for x in result.finished if x.stamp == i]  # each request keeps its observation's stamp
        assert mine == tokens
    assert len(result.finished) == 3 and engine.backlog == 0 and engine.slots.num_free == engine.slots.num_slots
    if mode == "oxygen":
        assert max(result.batch_sizes) == 3  # the three clients' requests decode in one batched forward


def test_requests_in_flight_continue_across_batched_frames(model: Pi05Model) -> None:
    engine = Engine(model, EngineConfig(k=2, max_new_tokens=8))
    first = engine.step_batch(frames(3))
    assert engine.backlog == 2 and not first.finished
    second = engine.step_batch([Frame(observation(7, 9))])  # no requests of its own: the others still advance
    assert engine.backlog == 2 and second.batch_sizes == [2, 2]
    while engine.backlog:
        engine.step(Frame(observation(4, 10)))
    assert engine.slots.num_free == engine.slots.num_slots


def test_stacking_pads_the_prompts_and_an_empty_batch_is_refused(model: Pi05Model) -> None:
    obs = stack_observations([observation(3, 0), observation(6, 1)])
    assert obs.tokens.shape == (2, 6) and obs.token_mask.sum(1).tolist() == [3, 6]
    with pytest.raises(ValueError, match="at least one frame"):
        Engine(model).step_batch([])
