"""How a cached stage runs: the ``Stages`` a model is built with, and the eager reference.

``Pi05Model`` does what every way of running a stage shares (embedding the prefix, the cache's validity, the
final norm, the denoise's arguments) and hands the layers to its stage runner, picked once when the model is built
(``backends.make_stages``). :class:`EagerStages` runs them module by module with the plain PyTorch modules: the
reference the fused stages (``backends/fused.py``) are tested against, same math.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .kv_cache import KVCache
from .layers import gqa_attention
from .parts import HeadParts, Prefix
from .rtc import RTCGuide

Pi05Model = torch.nn.Module  # the model (model.py picks its stages through backends.make_stages)

__all__ = ["EagerStages", "Stages", "denoise_vjp"]


class Stages(Protocol):
    """A way to run the model's cached stages (``name``: ``fused`` or ``eager``)."""

    name: str

    def prepare(self, model: Pi05Model) -> None:
        """Ready the model's weights for these stages (the fused ones concatenate projections)."""

    def compacts(self, model: Pi05Model, layout: str | None) -> bool:
        """Whether the prefill drops the observation's masked cameras and padded prompt columns."""

    def prefill(self, model: Pi05Model, embs: torch.Tensor, valid: torch.Tensor, cache: KVCache, rows: slice,
                last: torch.Tensor) -> torch.Tensor:
        """The backbone over the prefix embeddings, K/V written into ``cache`` rows; the hidden state at ``last``."""

    def denoise(self, model: Pi05Model, prefix: Prefix, cache: KVCache, noise: torch.Tensor, num_steps: int,
                head: HeadParts, guide: RTCGuide | None) -> torch.Tensor:
        """The Euler loop of the action expert over the cached prefix: the chunk [B, H, A] (float32)."""

    def decode_step(self, model: Pi05Model, cache: KVCache, rows: slice, tokens: torch.Tensor,
                    positions: torch.Tensor, write_index: torch.Tensor, attn_len: int, lora) -> torch.Tensor:
        """One token per row, its K/V written and marked valid; logits [B, V] (float32)."""


def _suffix_mask(prefix: Prefix, cache: KVCache, h_len: int, dev: torch.device) -> torch.Tensor:
    """The action tokens' mask [B, H, P + H]: the row's valid prefix positions, then every action token."""
    rows, p, b = prefix.rows, prefix.length, prefix.num_valid.shape[0]
    mask = torch.cat([cache.valid[rows, :p], torch.ones(b, h_len, dtype=torch.bool, device=dev)], 1)
    return mask[:, None, :].expand(b, h_len, p + h_len)


class EagerStages:
    """The eager, module-by-module reference (openpi's computation: every padded position too)."""

    name = "eager"

    def prepare(self, model: Pi05Model) -> None:
        pass

    def compacts(self, model: Pi05Model, layout: str | None) -> bool:
        return False

    def prefill(self, model: Pi05Model, embs: torch.Tensor, valid: torch.Tensor, cache: KVCache, rows: slice,
                last: torch.Tensor) -> torch.Tensor:
        b, p = valid.shape
        cos, sin = model._rope(valid.cumsum(1) - 1)
        # Prefix-LM: every query sees every valid key (padded queries too, so no row is all-masked).
        mask = valid[:, None, :].expand(b, p, p)
        h = embs
        for i, layer in enumerate(model.backbone.layers):
            x, _ = layer.input_layernorm(h)
            q, k, v = model._qkv(layer, x, cos, sin)
            cache.k[i, rows, :, :p] = k
            cache.v[i, rows, :, :p] = v
            h = model._attn_out_mlp(layer, h, gqa_attention(q, k, v, mask, model.rounded), None, None)
        return h[torch.arange(b, device=valid.device), last]

    def denoise(self, model: Pi05Model, prefix: Prefix, cache: KVCache, noise: torch.Tensor, num_steps: int,
                head: HeadParts, guide: RTCGuide | None) -> torch.Tensor:
        rows, p = prefix.rows, prefix.length
        b, h_len, dev = prefix.num_valid.shape[0], head.horizon, noise.device
        cos, sin = model._rope(prefix.num_valid[:, None] + torch.arange(h_len, device=dev))
        mask = _suffix_mask(prefix, cache, h_len, dev)
        dt = -1.0 / num_steps
        x_t = noise.float()
        for step, time_k in enumerate(model.denoise_times(num_steps)):
            t = torch.tensor(time_k, dtype=torch.float32, device=dev)
            h, cond = model.embed_suffix(x_t, t.expand(b), head)
            for i, layer in enumerate(head.stack.layers):
                x, gate = layer.input_layernorm(h, cond)
                q, k, v = model._qkv(layer, x, cos, sin)
                cache.k[i, rows, :, p:p + h_len] = k
                cache.v[i, rows, :, p:p + h_len] = v
                attn = gqa_attention(q, cache.k[i, rows, :, :p + h_len], cache.v[i, rows, :, :p + h_len], mask,
                                     model.rounded)
                h = model._attn_out_mlp(layer, h, attn, gate, cond)
            h, _ = head.stack.norm(h, cond)
            v_t = head.action_out_proj(h.to(head.action_out_proj.weight.dtype)).float()
            if guide is not None:
                v_t = guide.apply(step, x_t, v_t)
            x_t = x_t + dt * v_t
        return x_t

    def decode_step(self, model: Pi05Model, cache: KVCache, rows: slice, tokens: torch.Tensor,
                    positions: torch.Tensor, write_index: torch.Tensor, attn_len: int, lora) -> torch.Tensor:
        b = tokens.shape[0]
        ar = torch.arange(b, device=tokens.device)
        valid = cache.valid[rows]
        valid[ar, write_index] = True
        mask = valid[:, None, :attn_len]
        cos, sin = model._rope(positions[:, None])
        h = model.embed_tokens(tokens[:, None])
        for i, layer in enumerate(model.backbone.layers):
            x, _ = layer.input_layernorm(h)
            if lora is None:
                q, k, v = model._qkv(layer, x, cos, sin)
            else:
                q, k, v = lora.qkv(model, i, layer, x, cos, sin)
            kc, vc = cache.k[i, rows], cache.v[i, rows]
            kc[ar, :, write_index] = k[:, :, 0]
            vc[ar, :, write_index] = v[:, :, 0]
            attn = gqa_attention(q, kc[:, :, :attn_len], vc[:, :, :attn_len], mask, model.rounded)
            if lora is None:
                h = model._attn_out_mlp(layer, h, attn, None, None)
            else:
                h = lora.attn_out_mlp(model, i, layer, h, attn)
        h, _ = model.backbone.norm(h[:, 0])
        return model.lm_logits(h).float()


def denoise_vjp(model: Pi05Model, prefix: Prefix, cache: KVCache, noise: torch.Tensor, num_steps: int,
                head: HeadParts, guide: RTCGuide) -> torch.Tensor:
    """The Euler loop with ``vjp`` guidance (any stage runner): each step's velocity is differentiated in x through
    the reference modules under autograd, the prefix K/V (read from the cache, never written) held constant."""
    rows, p = prefix.rows, prefix.length
    b, h_len, dev = prefix.num_valid.shape[0], head.horizon, noise.device
    cos, sin = model._rope(prefix.num_valid[:, None] + torch.arange(h_len, device=dev))
    mask = _suffix_mask(prefix, cache, h_len, dev)
    ks = [cache.k[i, rows, :, :p] for i in range(len(head.stack.layers))]
    vs = [cache.v[i, rows, :, :p] for i in range(len(head.stack.layers))]

    def velocity(x_t: torch.Tensor, time_k: float) -> torch.Tensor:
        h, cond = model.embed_suffix(x_t, torch.tensor(time_k, dtype=torch.float32, device=dev).expand(b), head)
        for i, layer in enumerate(head.stack.layers):
            x, gate = layer.input_layernorm(h, cond)
            q, k, v = model._qkv(layer, x, cos, sin)
            attn = gqa_attention(q, torch.cat([ks[i], k], 2), torch.cat([vs[i], v], 2), mask, model.rounded)
            h = model._attn_out_mlp(layer, h, attn, gate, cond)
        h, _ = head.stack.norm(h, cond)
        return head.action_out_proj(h.to(head.action_out_proj.weight.dtype)).float()

    dt = -1.0 / num_steps
    x_t = noise.float()
    for step, time_k in enumerate(model.denoise_times(num_steps)):
        x_t = x_t + dt * guide.apply_vjp(step, x_t, lambda x, time_k=time_k: velocity(x, time_k))
    return x_t
