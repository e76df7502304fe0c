"""pi0.5 model: cached stages equal the uncached reference; batching, masking, structure."""

from __future__ import annotations

import torch
from conftest import make_model, make_observation

from oxygen_ros.engine import KVCache, Observation, Pi05Model, get_config
from oxygen_ros.study.reference import reference_language_logits, reference_sample_actions


def _noise(cfg, batch, seed=0):
    return torch.randn(batch, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(seed))


def test_cached_denoise_equals_recomputed_prefix(tiny_model: Pi05Model) -> None:
    cfg = tiny_model.config
    obs = make_observation(cfg, batch=2, prompt_lens=[12, 7], camera_masks=[[1, 1, 0], [1, 0, 1]])
    noise = _noise(cfg, 2)
    for steps in (1, 3, 10):
        cached = tiny_model.sample_actions(obs, noise, num_steps=steps)
        ref = reference_sample_actions(tiny_model, obs, noise, steps)
        assert (cached - ref).abs().max() <= 1e-5
    assert cached.shape == (2, cfg.action_horizon, cfg.action_dim)
    assert not torch.allclose(cached, noise)  # the expert actually moved the sample


def test_cached_greedy_decoding_equals_uncached_forward(tiny_model: Pi05Model) -> None:
    cfg = tiny_model.config
    obs = make_observation(cfg, batch=2, prompt_lens=[9, 14], camera_masks=[[1, 0, 1], [1, 1, 1]], seed=3)
    steps = 8
    cache = KVCache.for_model(cfg, 2, extra_tokens=steps)
    prefix = tiny_model.prefill(obs, cache)
    logits = [tiny_model.lm_logits(prefix.last_hidden).float()]
    tokens = [logits[0].argmax(-1)]
    for i in range(steps - 1):
        logits.append(tiny_model.decode_step(
            cache, prefix.rows, tokens[-1], prefix.num_valid + i,
            torch.full((2,), prefix.length + i), prefix.length + i + 1))
        tokens.append(logits[-1].argmax(-1))
    cached = torch.stack(logits, 1)
    generated = torch.stack(tokens, 1)
    ref = reference_language_logits(tiny_model, obs, generated[:, :-1])
    assert torch.equal(ref.argmax(-1), generated)
    assert (cached - ref).abs().max() <= 1e-5
    assert tiny_model.generate(obs, steps, eos_id=-1) == generated.tolist()


def test_generate_with_request_prompt_matches_reference(tiny_model: Pi05Model) -> None:
    cfg = tiny_model.config
    obs = make_observation(cfg, batch=2, prompt_lens=[6, 11], seed=5)
    prompts = [[17, 29, 41], [88]]
    out = tiny_model.generate(obs, 5, prompts=prompts, eos_id=-1)
    for r in range(2):
        seq = torch.tensor([prompts[r] + out[r][:-1]])
        ref = reference_language_logits(tiny_model, obs.select(r), seq)[0]
        assert ref[len(prompts[r]):].argmax(-1).tolist() == out[r]


def test_generate_stops_at_eos(tiny_model: Pi05Model) -> None:
    obs = make_observation(tiny_model.config, batch=1, seed=2)
    free = tiny_model.generate(obs, 6, eos_id=-1)[0]
    stopped = tiny_model.generate(obs, 6, eos_id=free[2])[0]
    assert stopped == free[: free.index(free[2]) + 1]


def test_batch_equals_each_alone(tiny_model: Pi05Model) -> None:
    cfg = tiny_model.config
    lens, cams = [13, 6], [[1, 0, 1], [1, 1, 0]]
    obs = make_observation(cfg, batch=2, prompt_lens=lens, camera_masks=cams, seed=7)
    noise = _noise(cfg, 2, seed=1)
    batched = tiny_model.sample_actions(obs, noise, 5)
    batched_text = tiny_model.generate(obs, 6, eos_id=-1)
    for r in range(2):
        one = obs.select(r)
        # alone, with the prompt trimmed to its own length: a different padded prefix length
        alone = Observation(one.images, one.image_masks, one.tokens[:, : lens[r]], one.token_mask[:, : lens[r]])
        assert (tiny_model.sample_actions(alone, noise[r : r + 1], 5) - batched[r : r + 1]).abs().max() <= 1e-5
        assert tiny_model.generate(alone, 6, eos_id=-1)[0] == batched_text[r]


def test_masked_camera_has_no_influence(tiny_model: Pi05Model) -> None:
    cfg = tiny_model.config
    obs = make_observation(cfg, batch=1, camera_masks=[[1, 0, 1]], seed=11)
    other = Observation(obs.images.clone(), obs.image_masks, obs.tokens, obs.token_mask)
    other.images[:, 1] = torch.rand_like(other.images[:, 1]) * 2 - 1
    noise = _noise(cfg, 1)
    a, b = tiny_model.sample_actions(obs, noise), tiny_model.sample_actions(other, noise)
    assert (a - b).abs().max() <= 1e-6
    assert tiny_model.generate(obs, 5, eos_id=-1) == tiny_model.generate(other, 5, eos_id=-1)
    # ...while a visible camera does influence it
    other.images[:, 0] = torch.rand_like(other.images[:, 0]) * 2 - 1
    assert (tiny_model.sample_actions(other, noise) - a).abs().max() > 1e-4


def test_siglip_matches_transformers() -> None:
    transformers = __import__("transformers")
    cfg = get_config("tiny")
    model = make_model(cfg)
    v = cfg.vision
    hf_cfg = transformers.SiglipVisionConfig(
        hidden_size=v.width, intermediate_size=v.mlp_dim, num_hidden_layers=v.depth, num_attention_heads=v.num_heads,
        image_size=v.image_size, patch_size=v.patch_size, layer_norm_eps=v.layer_norm_eps, vision_use_head=False,
        hidden_act="gelu_pytorch_tanh",
    )
    hf = transformers.SiglipVisionModel(hf_cfg).eval()
    ours = model.paligemma_with_expert.paligemma.model.vision_tower.vision_model
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0, 0.1)
    sd = ours.state_dict()
    hf_keys = hf.state_dict().keys()
    prefix = "vision_model." if any(k.startswith("vision_model.") for k in hf_keys) else ""
    hf.load_state_dict({prefix + k: t for k, t in sd.items()}, strict=True)
    x = torch.rand(2, 3, v.image_size, v.image_size) * 2 - 1
    with torch.no_grad():
        assert (hf(pixel_values=x).last_hidden_state - ours(x)).abs().max() <= 1e-5


def test_full_pi05_structure_and_parameter_count() -> None:
    cfg = get_config("pi05")
    with torch.device("meta"):
        model = Pi05Model(cfg)
    n = model.num_parameters()
    assert 3.0e9 < n < 3.5e9, n  # PaliGemma 3B (2.9B) + Gemma-300M action expert
    keys = set(model.state_dict())
    assert "paligemma_with_expert.gemma_expert.model.layers.17.input_layernorm.dense.weight" in keys
    assert "paligemma_with_expert.paligemma.model.language_model.layers.17.mlp.gate_proj.weight" in keys
    assert "paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.26.mlp.fc1.weight" in keys
    assert cfg.vision.tokens_per_image == 256 and cfg.max_prefix_len == 3 * 256 + 200


def test_workload_presets() -> None:
    assert get_config("pi05", "libero").action_horizon == 10 and get_config("pi05", "libero").num_cameras == 2
    assert get_config("pi05", "droid").action_horizon == 15
    aloha = get_config("small", "aloha")
    assert aloha.action_horizon == 50 and aloha.num_cameras == 3
