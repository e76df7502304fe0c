"""Precision policies: bfloat16 with openpi's float32 islands runs every stage, fused and eager, close to float32."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model, make_observation

from oxygen_ros.engine import ENGINE_MODES
from oxygen_ros.engine.backends.precision import apply_precision, exact_islands, float32_islands
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.requests import Frame, LanguageRequest
from oxygen_ros.study.heads import make_extra_heads


def _noise(cfg, batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(0))


def test_islands_are_float32_and_the_rest_bfloat16() -> None:
    original = make_model().state_dict()
    model = apply_precision(make_model(), "bfloat16_islands")
    # as openpi leaves them: the action and time projections exact, the norms and embeddings bfloat16-rounded
    exact = {id(p) for m in exact_islands(model) for p in m.parameters()}
    for name, p in model.named_parameters():
        if p.dtype == torch.float32:
            want = original[name] if id(p) in exact else original[name].bfloat16().float()
            assert torch.equal(p, want), name
    assert model.rounded and model.rope_freq_dtype == torch.bfloat16 and model.input_dtype == torch.float32
    assert not apply_precision(make_model(), "bfloat16").rounded
    island = {id(p) for m in float32_islands(model) for p in m.parameters()}
    for name, p in model.named_parameters():
        want = torch.float32 if id(p) in island else torch.bfloat16
        assert p.dtype == want, name
    names = [n for n, p in model.named_parameters() if p.dtype == torch.float32]
    assert any("patch_embedding" in n for n in names) and any("input_layernorm.dense" in n for n in names)
    assert any(n.startswith("time_mlp_in") for n in names) and model.dtype == torch.bfloat16
    with pytest.raises(ValueError):
        apply_precision(model, "int8")


@pytest.mark.parametrize("precision", ["bfloat16_islands", "bfloat16"])
def test_low_precision_actions_close_to_float32_fused_and_eager(precision: str) -> None:
    ref_model = make_model()
    cfg = ref_model.config
    obs = make_observation(cfg, batch=2, prompt_lens=[12, 7])
    noise = _noise(cfg, 2)
    ref = ref_model.sample_actions(obs, noise)
    model = apply_precision(make_model(), precision)
    low = obs.to("cpu", torch.bfloat16)
    fused = model.sample_actions(low, noise)
    eager = model.with_stages("eager").sample_actions(low, noise)
    scale = ref.abs().max()
    assert fused.dtype == torch.float32 and (fused - ref).abs().max() <= 0.05 * scale
    assert (fused - eager).abs().max() <= 0.05 * scale


@pytest.mark.parametrize("mode", ENGINE_MODES)
def test_every_mode_runs_with_islands(mode: str) -> None:
    model = apply_precision(make_model(seed=5, std=0.3), "bfloat16_islands")
    cfg = model.config
    heads = apply_precision(make_extra_heads(cfg, 1), "bfloat16_islands")
    eng = build_engine(model, EngineConfig(mode=mode, k=2, eos_id=-1, max_new_tokens=4, speculate=2), heads=heads)
    for f in range(4):
        res = eng.step(Frame(make_observation(cfg, seed=f), [LanguageRequest("memory", 4, [9])],
                             [_noise(cfg), _noise(cfg)]))
        assert all(torch.isfinite(a).all() and a.dtype == torch.float32 for a in res.actions)
    assert eng.totals["tokens"] > 0
    if mode == "parallel":
        eng.close()


def test_the_node_dtype_parameter_selects_the_islands() -> None:
    """``dtype: bfloat16_islands`` loads the checkpoint by openpi's policy; for our own checkpoints ``auto`` picks it
    on CUDA only (openpi and LeRobot checkpoints: ``test_precision_auto.py``)."""
    from oxygen_ros.runtime.model_loader import load_node_policy, resolve_precision
    from oxygen_ros.runtime.params import ParamError, validate

    assert resolve_precision(torch.device("cuda"), "auto") == "bfloat16_islands"
    assert resolve_precision(torch.device("cpu"), "auto") == "float32"
    assert resolve_precision(torch.device("cuda"), "bfloat16") == "bfloat16"
    with pytest.raises(ParamError, match="dtype"):
        validate({"model": "random_tiny", "joint_names": ["a"], "dtype": "bfloat17"})
    loaded = load_node_policy(validate({"model": "random_tiny", "device": "cpu", "dtype": "bfloat16_islands",
                                        "joint_names": [f"j{i}" for i in range(8)]}))
    try:
        model = loaded.policy.model
        island = {id(p) for m in float32_islands(model) for p in m.parameters()}
        assert island and all(p.dtype == torch.float32 for p in model.parameters() if id(p) in island)
        assert all(p.dtype == torch.bfloat16 for p in model.parameters() if id(p) not in island)
        assert model.dtype == torch.bfloat16 and any("bfloat16_islands" in n for n in loaded.notes)
    finally:
        loaded.release()
