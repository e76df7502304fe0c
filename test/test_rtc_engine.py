"""Real-time chunking in the engine (engine/rtc.py): the guided denoise on every path (eager reference, fused,
static, compiled) equal to the eager reference, both guidance variants, RTC off or without a remainder bit-identical
to plain denoising, the KV slot and the frame's language untouched, and the schedule / guidance-weight math."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import make_model, make_observation

from oxygen_ros.engine import ENGINE_MODES, Pi05Model
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.requests import Frame, LanguageRequest
from oxygen_ros.engine.rtc import RTCConfig, RTCGuide, RTCPrefix, guidance_weight, prefix_weights

ATOL = 1e-5


@pytest.fixture(scope="module")
def model() -> Pi05Model:
    return make_model(seed=0, std=0.1)


def _noise(cfg, seed: int) -> torch.Tensor:
    return torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(seed))


def _remainder(cfg, seed: int, length: int, dims: int | None = None) -> np.ndarray:
    gen = np.random.default_rng(seed)
    return gen.normal(size=(length, dims or cfg.action_dim)).astype(np.float32)


def _frames(cfg, count: int, delay: int = 2) -> list[Frame]:
    """Frames whose language requests span frames (k=2), each with a remainder of its own (none on the first)."""
    out = []
    for f in range(count):
        reqs = [LanguageRequest("memory", 6, [17, 23])] if f % 2 == 0 else []
        obs = make_observation(cfg, prompt_lens=[8 + f % 4], seed=f)
        rtc = None if f == 0 else RTCPrefix(_remainder(cfg, f, cfg.action_horizon - 1 - f % 3, 7), delay)
        out.append(Frame(obs, reqs, _noise(cfg, f), stamp=f, rtc=rtc))
    return out


def _run(model: Pi05Model, frames: list[Frame], rtc: RTCConfig | None, graphs: str = "off", **cfg):
    config = EngineConfig(**{"k": 2, "eos_id": -1, "max_new_tokens": 8, "max_inflight": 6, "graph_stages": "all", **cfg,
                             "graphs": graphs,
                             "rtc": rtc})
    eng = build_engine(model, config)
    results = [eng.step(fr) for fr in frames]
    close = getattr(eng, "close", None)
    if close:
        close()
    return results


def _texts(results) -> list[list[int]]:
    return sorted(f.tokens for r in results for f in r.finished)


def test_prefix_weights_schedules():
    """1 for the first d actions, a ramp to 0 until E, 0 after; E <= d: only the ones (LeRobot's rules)."""
    assert prefix_weights(3, 8, 12, "zeros").tolist() == [1.0] * 3 + [0.0] * 9
    assert prefix_weights(3, 8, 12, "ones").tolist() == [1.0] * 8 + [0.0] * 4
    lin = prefix_weights(3, 8, 12, "linear")
    assert lin[:3].tolist() == [1.0] * 3 and lin[8:].tolist() == [0.0] * 4
    assert torch.allclose(lin[3:8], torch.tensor([5, 4, 3, 2, 1]) / 6.0)
    exp = prefix_weights(3, 8, 12, "exp")
    assert torch.all(exp[3:8] < lin[3:8]) and torch.all(exp[3:8] > 0) and exp[:3].tolist() == [1.0] * 3
    assert prefix_weights(5, 3, 10, "linear").tolist() == [1.0] * 3 + [0.0] * 7  # d capped at E
    assert prefix_weights(0, 0, 6, "linear").tolist() == [0.0] * 6


def test_guidance_weight_clamped_and_symmetric():
    """g = min(beta, (1 - tau) / (tau r^2)): beta at pure noise, 2 at t = 0.5, never above beta."""
    assert guidance_weight(1.0, 10.0) == 10.0
    assert guidance_weight(0.5, 10.0) == pytest.approx(2.0)
    assert guidance_weight(0.9, 5.0) == 5.0
    assert all(0 < guidance_weight(1 - k / 10, 10.0) <= 10.0 for k in range(10))


def test_guide_pads_caps_and_rejects(model):
    cfg = model.config
    g = RTCGuide.build(RTCPrefix(_remainder(cfg, 0, 4, 5), 2, execution_horizon=9), RTCConfig(), cfg.action_horizon,
                       cfg.action_dim, 10)
    assert g.target.shape == (1, cfg.action_horizon, cfg.action_dim)
    assert torch.all(g.target[0, 4:] == 0) and torch.all(g.target[0, :, 5:] == 0)  # zero-padded in time and dims
    assert g.weights[0, 4:, 0].abs().sum() == 0  # E capped at the remainder's length (4)
    with pytest.raises(ValueError, match="NaN"):
        RTCGuide.build(RTCPrefix(np.full((3, 4), np.nan, np.float32), 1), RTCConfig(), 10, 32, 10)
    with pytest.raises(ValueError, match="rtc remainder"):
        RTCGuide.build(RTCPrefix(np.zeros((3, 40), np.float32), 1), RTCConfig(), 10, 32, 10)
    with pytest.raises(ValueError, match="schedule"):
        RTCConfig(schedule="cosine")


@pytest.mark.parametrize("guidance", ["identity", "vjp"])
def test_guidance_pulls_the_chunk_to_the_remainder(model, guidance):
    """The guided chunk's frozen part lies much closer to the remainder than the free chunk's; vjp differs from
    identity (a real backward pass), and both leave the prefix's K/V untouched."""
    cfg = model.config
    obs = make_observation(cfg, seed=3)
    free = model.sample_actions(obs, _noise(cfg, 3))[0]
    target = torch.from_numpy(_remainder(cfg, 9, cfg.action_horizon)) * 0.5
    guide = RTCGuide.build(RTCPrefix(target, 3), RTCConfig(guidance=guidance), cfg.action_horizon, cfg.action_dim,
                           cfg.num_steps)
    guided = model.sample_actions(obs, _noise(cfg, 3), guide=guide)[0]
    before = (free[:3] - target[:3]).abs().mean()
    after = (guided[:3] - target[:3]).abs().mean()
    assert after < 0.3 * before, (float(before), float(after))
    if guidance == "vjp":
        ident = RTCGuide.build(RTCPrefix(target, 3), RTCConfig(), cfg.action_horizon, cfg.action_dim, cfg.num_steps)
        assert not torch.allclose(guided, model.sample_actions(obs, _noise(cfg, 3), guide=ident)[0], atol=1e-4)


def test_rtc_off_or_no_remainder_is_bit_identical(model):
    """Frames without a remainder under RTC, and frames with one but RTC disabled, give exactly today's chunks."""
    cfg = model.config
    frames = _frames(cfg, 4)
    plain = _run(model, [Frame(f.observation, f.requests, f.noise, f.stamp) for f in frames], None)
    no_remainder = _run(model, [Frame(f.observation, f.requests, f.noise, f.stamp) for f in frames], RTCConfig())
    disabled = _run(model, frames, RTCConfig(enabled=False))
    for a, b, c in zip(plain, no_remainder, disabled, strict=True):
        assert torch.equal(a.actions[0], b.actions[0]) and torch.equal(a.actions[0], c.actions[0])
        assert not b.guided and not c.guided
    guided = _run(model, frames, RTCConfig())
    assert [r.guided for r in guided] == [False, True, True, True]
    assert torch.equal(guided[0].actions[0], plain[0].actions[0])
    assert not torch.equal(guided[1].actions[0], plain[1].actions[0])
    assert _texts(guided) == _texts(plain)  # the frame's language is unaffected


@pytest.mark.parametrize("guidance", ["identity", "vjp"])
def test_every_path_equals_the_eager_reference(model, guidance):
    """Guided chunks in every engine mode on the fused, static and compiled paths equal the eager reference."""
    cfg = model.config
    frames = _frames(cfg, 4)
    rtc = RTCConfig(guidance=guidance, schedule="exp", max_guidance_weight=5.0, execution_horizon=6)
    eager_model = copy.deepcopy(model).with_stages("eager")
    references = {mode: _run(eager_model, frames, rtc, mode=mode) for mode in ENGINE_MODES}
    paths = [*[("off", m) for m in ENGINE_MODES], ("static", "oxygen"), ("static", "isolated")]
    for graphs, mode in paths:
        reference = references[mode]
        out = _run(model, frames, rtc, graphs, mode=mode)
        for r, o in zip(reference, out, strict=True):
            assert o.guided == r.guided
            torch.testing.assert_close(o.actions[0], r.actions[0], atol=ATOL, rtol=0, msg=f"{graphs} {mode}")
        assert _texts(out) == _texts(reference), (graphs, mode)


def test_compiled_guided_denoise_equals_eager(model):
    """The compiled static denoise with identity guidance (its own graph beside the unguided one) equals eager."""
    cfg = model.config
    frames = _frames(cfg, 3)
    rtc = RTCConfig()
    reference = _run(copy.deepcopy(model).with_stages("eager"), frames, rtc)
    out = _run(model, frames, rtc, "compile")
    for r, o in zip(reference, out, strict=True):
        torch.testing.assert_close(o.actions[0], r.actions[0], atol=ATOL, rtol=0)


def test_guided_denoise_leaves_the_slot_read_only(model):
    """vjp guidance writes nothing into the cache (not even the action scratch); identity writes only the scratch
    that every denoise writes: the prefix's K/V are the same after a guided denoise."""
    from oxygen_ros.engine.kv_cache import KVCache

    cfg = model.config
    obs = make_observation(cfg, seed=4)
    cache = KVCache.for_model(cfg, 1, dtype=model.dtype)
    prefix = model.prefill(obs, cache)
    k0, v0 = cache.k.clone(), cache.v.clone()
    for guidance in ("vjp", "identity"):
        guide = RTCGuide.build(RTCPrefix(_remainder(cfg, 1, 6), 2), RTCConfig(guidance=guidance), cfg.action_horizon,
                               cfg.action_dim, cfg.num_steps)
        model.denoise(prefix, cache, _noise(cfg, 1), guide=guide)
        p = prefix.length
        assert torch.equal(cache.k[:, :, :, :p], k0[:, :, :, :p]) and torch.equal(cache.v[:, :, :, :p], v0[:, :, :, :p])
        if guidance == "vjp":
            assert torch.equal(cache.k, k0) and torch.equal(cache.v, v0)
