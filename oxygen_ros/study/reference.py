"""Uncached reference computations (openpi-style: recompute everything) for checking the cached paths."""

from __future__ import annotations

import torch

from oxygen_ros.engine.model import Pi05Model
from oxygen_ros.engine.observation import Observation


@torch.no_grad()
def reference_sample_actions(model: Pi05Model, obs: Observation, noise: torch.Tensor, num_steps: int) -> torch.Tensor:
    """Flow-matching sampling that re-runs the joint prefix + suffix forward at every denoise step."""
    prefix_embs, valid = model.embed_prefix(obs)
    b, p = valid.shape
    h = model.config.action_horizon
    dev = valid.device
    # openpi's att_masks: prefix block 0, suffix starts block 1 -> cumsum rule (j visible to i if cum[j] <= cum[i]).
    pad = torch.cat([valid, torch.ones(b, h, dtype=torch.bool, device=dev)], 1)
    block = torch.cat([torch.zeros(p, dtype=torch.long), torch.ones(h, dtype=torch.long)]).to(dev)
    mask = (block[None, :] <= block[:, None])[None] & pad[:, None, :]
    positions = torch.cat([valid.cumsum(1) - 1, valid.sum(1, keepdim=True) + torch.arange(h, device=dev)], 1)
    dt = -1.0 / num_steps
    x_t = noise.float()
    t = torch.tensor(1.0, dtype=torch.float32, device=dev)
    for _ in range(num_steps):
        suffix, cond = model.embed_suffix(x_t, t.expand(b))
        streams = [(prefix_embs, model.backbone, None), (suffix, model.expert, cond)]
        _, out = model.joint_forward(streams, mask, positions)
        x_t = x_t + dt * model.action_out_proj(out.to(model.action_out_proj.weight.dtype)).float()
        t = t + dt
    return x_t


@torch.no_grad()
def reference_language_logits(model: Pi05Model, obs: Observation, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [B, T + 1, V] predicting the token after the prefix and after each of ``tokens`` [B, T], computed by
    one full forward over prefix + tokens (prefix bidirectional, tokens causal)."""
    prefix_embs, valid = model.embed_prefix(obs)
    b, p = valid.shape
    t = tokens.shape[1]
    dev = valid.device
    pad = torch.cat([valid, torch.ones(b, t, dtype=torch.bool, device=dev)], 1)
    block = torch.cat([torch.zeros(p, dtype=torch.long), torch.arange(1, t + 1)]).to(dev)
    mask = (block[None, :] <= block[:, None])[None] & pad[:, None, :]
    positions = torch.cat([valid.cumsum(1) - 1, valid.sum(1, keepdim=True) + torch.arange(t, device=dev)], 1)
    streams = [(prefix_embs, model.backbone, None), (model.embed_tokens(tokens), model.backbone, None)]
    out_prefix, out_tokens = model.joint_forward(streams, mask, positions)
    last = torch.arange(p, device=dev).masked_fill(~valid, -1).argmax(1)
    first = out_prefix[torch.arange(b, device=dev), last][:, None]
    return model.lm_logits(torch.cat([first, out_tokens], 1)).float()
