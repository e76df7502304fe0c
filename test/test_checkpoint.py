"""Checkpoint I/O: openpi and LeRobot layouts, bit-exact round trips, clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_model, make_observation
from safetensors.torch import load_file, save_file

from oxygen_ros.engine import get_config
from oxygen_ros.engine.checkpoint import (
    EMBED_KEY,
    LM_HEAD_KEY,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)


@pytest.mark.parametrize("layout", ["openpi", "lerobot"])
def test_round_trip_is_bit_exact(tmp_path, layout) -> None:
    model = make_model(get_config("tiny", "aloha"), seed=4)
    save_checkpoint(model, tmp_path, layout=layout)
    keys = load_file(str(tmp_path / "model.safetensors")).keys()
    prefix = "model." if layout == "lerobot" else ""
    assert prefix + LM_HEAD_KEY in keys and prefix + EMBED_KEY not in keys  # tied tensor stored once (openpi)
    assert all(k.startswith(prefix) for k in keys)
    loaded = load_checkpoint(tmp_path)
    assert loaded.config == model.config
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    obs = make_observation(model.config, seed=1)
    noise = torch.randn(1, model.config.action_horizon, model.config.action_dim)
    assert torch.equal(model.sample_actions(obs, noise), loaded.sample_actions(obs, noise))


def test_openpi_file_without_config_and_with_unused_expert_head(tmp_path) -> None:
    model = make_model(seed=2)
    save_checkpoint(model, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["paligemma_with_expert.gemma_expert.lm_head.weight"] = torch.zeros(7, 3)  # present in openpi, unused
    tensors[EMBED_KEY] = tensors.pop(LM_HEAD_KEY)  # an exporter that kept the embedding name instead
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").unlink()
    loaded = load_checkpoint(tmp_path, config=model.config)
    assert torch.equal(loaded.backbone.embed_tokens.weight, model.backbone.embed_tokens.weight)


def test_missing_unexpected_and_mismatched_keys_are_named(tmp_path) -> None:
    model = make_model(seed=3)
    save_checkpoint(model, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["action_in_proj.weight"]
    tensors["some.extra.weight"] = torch.zeros(1)
    tensors["time_mlp_in.bias"] = torch.zeros(5)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    msg = str(err.value)
    assert "missing keys (1): action_in_proj.weight" in msg
    assert "unexpected keys (1): some.extra.weight" in msg
    assert "time_mlp_in.bias (5,) != (32,)" in msg


def test_wrong_config_is_a_clear_error(tmp_path) -> None:
    save_checkpoint(make_model(seed=0), tmp_path)
    with pytest.raises(CheckpointError, match="does not match config 'small'"):
        load_checkpoint(tmp_path, config=get_config("small"))


def test_corrupt_files_are_clear_errors(tmp_path) -> None:
    save_checkpoint(make_model(seed=0), tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="cannot read safetensors"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_checkpoint(tmp_path / "nowhere")


def test_sizes_are_read_from_the_tensors(tmp_path) -> None:
    """Without our config.json the model is built from the tensor shapes (variant names are never trusted)."""
    cfg = get_config("tiny", action_horizon=15)
    model = make_model(cfg)
    save_checkpoint(model, tmp_path, layout="lerobot")
    (tmp_path / "config.json").write_text(json.dumps({"type": "pi05", "paligemma_variant": "gemma_2b"}))
    loaded = load_checkpoint(tmp_path)
    for part in ("vision", "backbone", "expert"):
        assert getattr(loaded.config, part) == getattr(cfg, part)
    assert (loaded.config.vocab_size, loaded.config.action_dim) == (cfg.vocab_size, cfg.action_dim)
    for k, v in model.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k


def test_untied_embeddings_and_old_key_names(tmp_path) -> None:
    """LeRobot >= 0.5 stores embed_tokens and lm_head separately: both are kept. Older transformers key names
    (language_model.model.*, a top-level vision_tower) load into the same model."""
    from oxygen_ros.engine.checkpoint import canonical_keys, checkpoint_state_dict

    model = make_model(get_config("tiny").replace(tie_word_embeddings=False), seed=3)
    with torch.no_grad():
        model.paligemma_with_expert.paligemma.lm_head.weight.mul_(2.0)
    sd = checkpoint_state_dict(model, "lerobot")
    assert "model." + EMBED_KEY in sd and "model." + LM_HEAD_KEY in sd
    old = {}
    for k, v in sd.items():
        k = k.replace("paligemma.model.language_model.", "paligemma.language_model.model.")
        k = k.replace("paligemma.model.vision_tower.vision_model.", "paligemma.vision_tower.")
        old[k] = v
    assert canonical_keys(old).keys() == canonical_keys(sd).keys()
    save_file(old, str(tmp_path / "model.safetensors"))
    loaded = load_checkpoint(tmp_path)
    assert not loaded.config.tie_word_embeddings
    head = loaded.paligemma_with_expert.paligemma.lm_head.weight
    assert torch.equal(head, model.paligemma_with_expert.paligemma.lm_head.weight)
    assert torch.equal(loaded.backbone.embed_tokens.weight, model.backbone.embed_tokens.weight)
    assert not torch.equal(head, loaded.backbone.embed_tokens.weight)
