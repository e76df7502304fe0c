"""The fused stages (engine/backends/fast_path.py) against the eager reference, in one process: every engine mode,
with a LoRA adapter and an extra action head; fused weights survive loading, copying, moving and saving."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_heads_and_lora, make_model, make_observation

from oxygen_ros.engine import ENGINE_MODES, KVCache, Pi05Model
from oxygen_ros.engine.backends.cpu_kernels import use_onednn
from oxygen_ros.engine.backends.fusion import fused_stack
from oxygen_ros.engine.backends.packed_linear import packed_available
from oxygen_ros.engine.checkpoint import load_checkpoint, save_checkpoint
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.lora import TARGETS, LoraAdapter, random_lora_weights
from oxygen_ros.engine.requests import Frame, LanguageRequest

ATOL = 1e-5


@pytest.fixture(scope="module")
def model() -> Pi05Model:
    """Weights large enough that greedy text varies token to token (actions are chaotic: float rounding grows)."""
    return make_model(seed=5, std=0.3)


@pytest.fixture(scope="module")
def smooth() -> Pi05Model:
    """The default test model: the actions' sensitivity to rounding is that of a trained model's."""
    return make_model(seed=0, std=0.1)


def _noise(cfg, batch: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(seed))


def _both(model: Pi05Model, fn):
    """``fn(model)`` on the fused stages, then on the eager reference over the same weights."""
    return fn(model), fn(model.with_stages("eager"))


def test_stages_match_eager(model: Pi05Model, smooth: Pi05Model) -> None:
    cfg = model.config
    obs = make_observation(cfg, batch=2, prompt_lens=[12, 7], camera_masks=[[1, 1, 0], [1, 0, 1]])
    noise = _noise(cfg, 2)
    for steps in (1, 3, 10):
        fused, eager = _both(smooth, lambda m, steps=steps: m.sample_actions(obs, noise, steps))
        assert (fused - eager).abs().max() <= ATOL
    fused, eager = _both(model, lambda m: m.sample_actions(obs, noise, 10))
    assert (fused - eager).abs().max() <= 1e-5 * eager.abs().max() * 10  # 10 steps of a chaotic map
    caches = []

    def prefill_and_decode(m: Pi05Model):
        cache = KVCache.for_model(cfg, 2, extra_tokens=4)
        prefix = m.prefill(obs, cache)
        logits = m.decode_step(cache, prefix.rows, torch.tensor([5, 9]), prefix.num_valid,
                                   torch.full((2,), prefix.length), prefix.length + 1)
        caches.append(cache)
        return prefix.last_hidden, logits

    (h_f, l_f), (h_e, l_e) = _both(model, prefill_and_decode)
    assert (h_f - h_e).abs().max() <= ATOL and (l_f - l_e).abs().max() <= ATOL
    assert (caches[0].k - caches[1].k).abs().max() <= ATOL and torch.equal(caches[0].valid, caches[1].valid)
    gen_f, gen_e = _both(model, lambda m: m.generate(obs, 12, prompts=[[17, 3], []], eos_id=-1))
    assert gen_f == gen_e


@pytest.mark.parametrize("camera_masks", [[[1, 1, 0], [0, 1, 0]], [[0, 0, 0], [0, 0, 0]]],
                         ids=["a camera masked in every row", "no camera"])
def test_fast_prefill_skips_masked_work_exactly(model: Pi05Model, smooth: Pi05Model, camera_masks) -> None:
    """The fast path drops cameras masked in every row and prompt padding (openpi computes both) and runs the last
    layer's output only at each row's last valid token: same K/V at the valid positions, same last hidden state,
    same actions and the same greedy text as the eager reference, which computes everything."""
    cfg = model.config
    obs = make_observation(cfg, batch=2, prompt_lens=[12, 7], camera_masks=camera_masks, length=cfg.max_token_len)
    prefixes, caches = [], []

    def prefill(m: Pi05Model):
        cache = KVCache.for_model(cfg, 2, extra_tokens=4)
        prefixes.append(m.prefill(obs, cache))
        caches.append(cache)
        return prefixes[-1].last_hidden

    h_f, h_e = _both(model, prefill)
    (pf, pe), (cf, ce) = prefixes, caches
    kept = sum(any(r[c] for r in camera_masks) for c in range(cfg.num_cameras))
    assert pe.length == cfg.num_cameras * cfg.vision.tokens_per_image + cfg.max_token_len
    assert pf.length == kept * cfg.vision.tokens_per_image + 12  # the longest prompt: row 1's padding stays
    assert torch.equal(pf.num_valid, pe.num_valid)
    assert (h_f - h_e).abs().max() <= ATOL
    for row in range(2):
        vf, ve = cf.valid[row].nonzero().flatten(), ce.valid[row].nonzero().flatten()
        assert (cf.k[:, row][:, :, vf] - ce.k[:, row][:, :, ve]).abs().max() <= ATOL
        assert (cf.v[:, row][:, :, vf] - ce.v[:, row][:, :, ve]).abs().max() <= ATOL
    noise = _noise(cfg, 2)
    fused, eager = _both(smooth, lambda m: m.sample_actions(obs, noise, 10))
    assert (fused - eager).abs().max() <= ATOL
    gen_f, gen_e = _both(model, lambda m: m.generate(obs, 12, prompts=[[17, 3], []], eos_id=-1))
    assert gen_f == gen_e


def test_lora_decode_matches_eager(model: Pi05Model) -> None:
    cfg = model.config
    obs = make_observation(cfg, batch=3, prompt_lens=[9, 11, 6], seed=2)
    for modules in (TARGETS, ("q_proj", "v_proj"), ("up_proj", "o_proj")):
        lora = LoraAdapter(random_lora_weights(model, r=4, std=0.3, modules=modules), 2.0)

        def step(m: Pi05Model, lora=lora):
            cache = KVCache.for_model(cfg, 3, extra_tokens=4)
            prefix = m.prefill(obs, cache)
            lora.row_mask = torch.tensor([1.0, 0.0, 1.0])[:, None, None]
            return m.decode_step(cache, prefix.rows, torch.tensor([5, 9, 7]), prefix.num_valid,
                                     torch.full((3,), prefix.length), prefix.length + 1, lora)

        fused, eager = _both(model, step)
        assert (fused - eager).abs().max() <= ATOL


def _frames(cfg, count: int) -> list[Frame]:
    out = []
    for f in range(count):
        reqs = [LanguageRequest("memory", 6, [17, 23]), LanguageRequest("narration", 5)] if f % 3 != 2 else []
        obs = make_observation(cfg, prompt_lens=[8 + f % 4], seed=f)
        out.append(Frame(obs, reqs, [_noise(cfg, 1, f), _noise(cfg, 1, 100 + f)], stamp=f))
    return out


def _run_mode(model: Pi05Model, mode: str, fused: bool, frames: list[Frame]):
    heads, lora = make_heads_and_lora(model)
    model = model if fused else model.with_stages("eager")  # the parallel language worker copies it, stages too
    eng = build_engine(model, EngineConfig(mode=mode, k=2, eos_id=-1, max_new_tokens=8, max_inflight=6,
                                            kernels="keep"),
                       heads=heads, adapter=lora)
    results = [eng.step(fr) for fr in frames]
    if mode == "parallel":
        eng.close()
    toks = sorted((f.request_id, f.frame_index, tuple(f.tokens)) for r in results for f in r.finished)
    return [r.actions for r in results], toks


@pytest.mark.parametrize("mode", ENGINE_MODES)
def test_every_mode_fused_equals_eager_with_adapter_and_head(model: Pi05Model, smooth: Pi05Model,
                                                             mode: str) -> None:
    fl = _frames(model.config, 7)
    for m in (model, smooth):
        (act_f, tok_f), (act_e, tok_e) = (_run_mode(m, mode, fused, fl) for fused in (True, False))
        assert tok_f == tok_e and len(tok_f) >= 6
        if m is smooth:
            for a, b in zip(act_f, act_e, strict=True):
                assert len(a) == 2 and all((x - y).abs().max() <= ATOL for x, y in zip(a, b, strict=True))


@pytest.mark.skipif(not packed_available(), reason="this torch build has no oneDNN reordered-weight linear")
@pytest.mark.parametrize("mode", ENGINE_MODES)
def test_packed_fused_path_equals_eager(model: Pi05Model, smooth: Pi05Model, mode: str) -> None:
    """The CPU benchmark setup: every projection of the fast path on oneDNN-packed weights (``packed_linear``)."""
    fl = _frames(model.config, 5)
    for base in (model, smooth):
        m = copy.deepcopy(base)
        use_onednn(m)
        fs = fused_stack(m.expert)
        assert all(f._packed is not None for f in (*fs.qkv, *fs.o, *fs.gate_up, *fs.down))
        (act_f, tok_f), (act_e, tok_e) = (_run_mode(m, mode, fused, fl) for fused in (True, False))
        assert tok_f == tok_e and len(tok_f) >= 4
        if base is smooth:
            for a, b in zip(act_f, act_e, strict=True):
                assert all((x - y).abs().max() <= ATOL for x, y in zip(a, b, strict=True))


def test_fused_weights_follow_loads_copies_moves_and_saves(model: Pi05Model, tmp_path) -> None:
    cfg = model.config
    obs = make_observation(cfg, prompt_lens=[10], seed=4)
    noise = _noise(cfg, 1)
    other = make_model(seed=9, std=0.1)
    fresh = Pi05Model(cfg).eval()
    assert list(fresh.state_dict()) == list(other.state_dict())  # checkpoint keys unchanged by fusing
    fresh.load_state_dict(other.state_dict())  # in place: the fused matrices see the new weights
    expect = other.sample_actions(obs, noise)
    assert torch.equal(fresh.sample_actions(obs, noise), expect)
    assert (fresh.with_stages("eager").sample_actions(obs, noise) - expect).abs().max() <= ATOL
    assert torch.equal(copy.deepcopy(fresh).sample_actions(obs, noise), expect)
    moved = copy.deepcopy(fresh).to(torch.float64)
    assert fused_stack(moved.backbone).qkv[0].weight.dtype == torch.float64
    assert (moved.sample_actions(obs.to("cpu", torch.float64), noise) - expect).abs().max() <= 1e-4
    save_checkpoint(fresh, tmp_path / "ck")
    loaded = load_checkpoint(tmp_path / "ck")
    assert torch.equal(loaded.sample_actions(obs, noise), expect)
    assert model.generate(obs, 6, eos_id=-1) == model.generate(obs, 6, eos_id=-1)
