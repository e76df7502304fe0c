"""Per-stream suffix adapters: rows of different LoRAs decode in one batched forward, each as if alone."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model, make_observation

from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.lora import LoraAdapter, LoraSet, batch_lora, random_lora_weights
from oxygen_ros.engine.requests import Frame, LanguageRequest

NO_EOS = -1
FRAMES = 8


@pytest.fixture(scope="module")
def model():
    return make_model(seed=11, std=0.3)


@pytest.fixture(scope="module")
def adapters(model, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    mods = ("q_proj", "v_proj", "o_proj", "gate_proj", "down_proj")
    live_a = random_lora_weights(model, std=0.3, seed=1, modules=mods)
    live_b = random_lora_weights(model, std=0.3, seed=2, modules=("k_proj", "up_proj", "v_proj"))
    zero = random_lora_weights(model, zero=True, modules=mods)
    return {name: LoraAdapter.load(LoraAdapter.save(root / name, w, 4, 8))
            for name, w in (("mem", live_a), ("narr", live_b), ("zero", zero))}


def _frames(model, names: dict[str, str]) -> list[Frame]:
    """Memory every 2nd frame, narration every frame, subtask every 3rd: each stream with the adapter ``names``
    gives it ('' = none)."""
    cfg = model.config
    out = []
    for f in range(FRAMES):
        reqs = [LanguageRequest("narration", 5, [9, 4], stream="narration", adapter=names.get("narration", ""))]
        if f % 2 == 0:
            reqs.append(LanguageRequest("memory", 7, [17, 23], stream="memory", adapter=names.get("memory", "")))
        if f % 3 == 0:
            reqs.append(LanguageRequest("subtask", 6, [], stream="subtask", adapter=names.get("subtask", "")))
        obs = make_observation(cfg, prompt_lens=[8 + f % 3], seed=40 + f)
        noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(f))
        out.append(Frame(obs, reqs, noise, stamp=f))
    return out


def _run(model, mode: str, frames: list[Frame], adapters, fused: bool = True, **cfg):
    model = model if fused else model.with_stages("eager")
    eng = build_engine(model, EngineConfig(mode=mode, k=2, eos_id=NO_EOS, max_new_tokens=16, **cfg),
                       adapters=adapters)
    results = [eng.step(Frame(fr.observation, [LanguageRequest(**vars(r)) for r in fr.requests], fr.noise,
                              stamp=fr.stamp)) for fr in frames]
    while eng.backlog:  # drain what is still in flight with frames that start nothing
        results.append(eng.step(Frame(frames[-1].observation, [], frames[-1].noise)))
    tokens = {(f.frame_index, f.stream): f.tokens for r in results for f in r.finished}
    return results, tokens


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "eager"])
def test_rows_of_different_adapters_share_a_forward_and_equal_alone(model, adapters, fused) -> None:
    names = {"memory": "mem", "narration": "narr"}  # subtask: the base model
    frames = _frames(model, names)
    results, batched = _run(model, "oxygen", frames, adapters, fused)
    assert max(max(r.batch_sizes, default=0) for r in results) >= 3  # all three kinds of rows in one forward
    _, alone = _run(model, "isolated", frames, adapters, fused)
    assert batched == alone and len(batched) == FRAMES + FRAMES // 2 + FRAMES // 3 + 1
    base_results, base = _run(model, "oxygen", _frames(model, {}), None, fused)
    for key, tokens in batched.items():  # every adapter changes its own stream, and only it
        assert (tokens != base[key]) == (key[1] != "subtask"), key
    for r, b in zip(results, base_results, strict=False):
        assert torch.equal(r.actions[0], b.actions[0])  # suffix-only: the actions never see an adapter


def test_one_adapter_in_a_mixed_batch_equals_that_adapter_alone(model, adapters) -> None:
    frames = _frames(model, {"memory": "mem", "narration": "narr"})
    _, both = _run(model, "oxygen", frames, adapters)
    _, only_mem = _run(model, "oxygen", _frames(model, {"memory": "mem"}), adapters)
    assert {k: v for k, v in both.items() if k[1] == "memory"} == {k: v for k, v in only_mem.items()
                                                                   if k[1] == "memory"}


def test_a_zero_adapter_is_bit_identical_to_none(model, adapters) -> None:
    frames = _frames(model, {"memory": "zero", "narration": "zero", "subtask": "zero"})
    res, zero = _run(model, "oxygen", frames, adapters)
    base_res, base = _run(model, "oxygen", _frames(model, {}), None)
    assert zero == base
    assert all(torch.equal(a.actions[0], b.actions[0]) for a, b in zip(res, base_res, strict=False))


def test_unknown_adapter_is_a_clear_error(model, adapters) -> None:
    eng = build_engine(model, EngineConfig(eos_id=NO_EOS), adapters=adapters)
    fr = _frames(model, {"memory": "nope"})[0]
    with pytest.raises(ValueError, match="unknown adapter"):
        eng.step(fr)
    assert eng.frame_index == 0 and eng.slots.num_free == eng.slots.num_slots


def test_batch_lora_masks_each_adapter_to_its_rows(adapters) -> None:
    a, b = adapters["mem"], adapters["narr"]
    assert batch_lora([None, None], torch.float32, "cpu") is None
    assert batch_lora([None, a, a], torch.float32, "cpu") is a and a.row_mask.flatten().tolist() == [0, 1, 1]
    both = batch_lora([b, None, a], torch.float32, "cpu")
    assert isinstance(both, LoraSet) and both.adapters == [b, a]
    assert a.row_mask.flatten().tolist() == [0, 0, 1] and b.row_mask.flatten().tolist() == [1, 0, 0]
