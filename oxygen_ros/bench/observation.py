"""The synthetic observation every benchmark frame and stage profile runs on."""

from __future__ import annotations

import torch

from oxygen_ros.engine import Observation, Pi05Model

PROMPT_LEN = 48  # valid prompt tokens of the benchmark observation (pi0.5 LIBERO prompts are ~30-50 tokens)


def benchmark_prompt_len(model: Pi05Model) -> int:
    """Valid prompt tokens of the benchmark observation for ``model`` (``PROMPT_LEN``, capped by the config)."""
    return min(model.config.max_token_len, PROMPT_LEN)


def dummy_observation(model: Pi05Model, batch: int = 1, prompt_len: int | None = None) -> Observation:
    """A full-size observation: every camera visible, a prompt of ``prompt_len`` tokens (default: max)."""
    cfg = model.config
    n = prompt_len or cfg.max_token_len
    s = cfg.vision.image_size
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, cfg.vocab_size, (batch, cfg.max_token_len), generator=g)
    mask = torch.zeros(batch, cfg.max_token_len, dtype=torch.bool)
    mask[:, :n] = True
    return Observation(
        images=(torch.rand(batch, cfg.num_cameras, 3, s, s, generator=g) * 2 - 1),
        image_masks=torch.ones(batch, cfg.num_cameras, dtype=torch.bool),
        tokens=tokens.masked_fill(~mask, 0),
        token_mask=mask,
    ).to(model.device, model.dtype)
