"""Training losses of pi0.5 through the model's uncached joint (Mixture-of-Transformers) forward.

One forward carries the prefix (images + prompt, bidirectional), the memory token stream (causal, reading the
prefix: the language loss) and ``num_noise`` noisy action chunks (each reading the prefix and itself: the
flow-matching loss). No stream sees another, so this equals separate forwards per stream while the prefix is
computed once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from oxygen_ros.engine import Pi05Model

from .data import Batch

__all__ = ["sample_time", "training_losses"]


def sample_time(batch: int, gen: torch.Generator | None = None) -> torch.Tensor:
    """openpi's flow-matching time: Beta(1.5, 1) * 0.999 + 0.001 (more weight near t = 1, pure noise)."""
    u = torch.rand(batch, generator=gen)
    return u ** (1.0 / 1.5) * 0.999 + 0.001  # inverse CDF of Beta(1.5, 1) is u^(1/1.5)


def _mask_and_positions(valid: torch.Tensor, lang_lens: list[int], horizon: int, num_noise: int):
    """Attention mask [B, L, L] and RoPE positions [B, L] for prefix | language streams | action blocks.

    The prefix sees itself; each language stream sees the prefix and, causally, itself; each action block sees the
    prefix and itself. Every stream after the prefix is positioned right after the valid prefix tokens.
    """
    b, p = valid.shape
    dev = valid.device
    lens = list(lang_lens) + [horizon] * num_noise
    causal = [True] * len(lang_lens) + [False] * num_noise
    block = torch.cat([torch.zeros(p, dtype=torch.long)] + [torch.full((n,), i + 1) for i, n in enumerate(lens)])
    order = torch.cat([torch.zeros(p, dtype=torch.long)] + [torch.arange(n) if c else torch.zeros(n, dtype=torch.long)
                                                            for n, c in zip(lens, causal, strict=True)])
    block, order = block.to(dev), order.to(dev)
    see = (block[None, :] == 0) | ((block[None, :] == block[:, None]) & (order[None, :] <= order[:, None]))
    pad = torch.cat([valid, torch.ones(b, sum(lens), dtype=torch.bool, device=dev)], 1)
    start = valid.sum(1, keepdim=True)
    positions = torch.cat([valid.cumsum(1) - 1] + [start + torch.arange(n, device=dev) for n in lens], 1)
    return see[None] & pad[:, None, :], positions


def training_losses(model: Pi05Model, batch: Batch, num_noise: int = 2, gen: torch.Generator | None = None,
                    object_head: torch.nn.Module | None = None) -> dict[str, torch.Tensor]:
    """Flow-matching action loss (openpi: x_t = t * noise + (1 - t) * actions, target u = noise - actions,
    MSE against the expert's velocity prediction), one cross-entropy per language stream (teacher forcing) and, with
    ``object_head`` (a training-only probe, see :mod:`.object_maps`), the per-patch object loss on the image tokens."""
    obs, actions = batch.observation, batch.actions
    b, h, _ = actions.shape
    prefix, valid = model.embed_prefix(obs)
    losses = {}
    if object_head is not None and batch.object_maps is not None:
        maps = batch.object_maps
        logits = object_head(prefix[:, : maps.shape[1]].float())  # image tokens come first in the prefix
        losses["objects"] = F.binary_cross_entropy_with_logits(logits, maps)
    streams = [(prefix, model.backbone, None)]
    streams += [(model.embed_tokens(tokens), model.backbone, None) for tokens, _ in batch.language.values()]
    targets = []
    for _ in range(num_noise):
        noise = torch.randn(actions.shape, generator=gen)
        t = sample_time(b, gen)
        x_t = t[:, None, None] * noise + (1.0 - t[:, None, None]) * actions
        tokens, cond = model.embed_suffix(x_t, t)
        streams.append((tokens, model.expert, cond))
        targets.append(noise - actions)
    lang_lens = [tokens.shape[1] for tokens, _ in batch.language.values()]
    mask, positions = _mask_and_positions(valid, lang_lens, h, num_noise)
    out = model.joint_forward(streams, mask, positions)
    n = len(lang_lens)
    v = torch.stack([model.action_out_proj(o) for o in out[1 + n:]])
    losses["action"] = F.mse_loss(v.float(), torch.stack(targets))
    # Language: the output at token i predicts token i + 1; only the text after the request prompt (and EOS) counts.
    for (task, (tokens, is_target)), hidden in zip(batch.language.items(), out[1:1 + n], strict=True):
        logits = model.lm_logits(hidden[:, :-1]).float()
        tgt = is_target[:, 1:]
        losses[task] = F.cross_entropy(logits[tgt], tokens[:, 1:][tgt])
    return losses
