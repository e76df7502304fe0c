"""The fused stage runner (the default): the cached stages on ``fast_path``'s fused weights and precomputed
time conditioning, and a prefill that skips what the observation masks out (the ``compact`` layout)."""

from __future__ import annotations

import torch

from ..kv_cache import KVCache
from ..observation import PREFILL_LAYOUTS
from ..parts import HeadParts, Prefix
from ..rtc import RTCGuide
from . import fast_path
from .fusion import fused_stack

Pi05Model = torch.nn.Module  # the model (model.py picks this runner through backends.make_stages)


class FusedStages:
    """``fast_path``'s stages, each under ``inference_mode`` (no autograd bookkeeping per op; what a stage returns
    is a normal tensor)."""

    name = "fused"

    def prepare(self, model: Pi05Model) -> None:
        """Fuse the backbone's and the action expert's weights now (the parameters become views into them)."""
        fused_stack(model.backbone)
        fused_stack(model.expert)

    def compacts(self, model: Pi05Model, layout: str | None) -> bool:
        """Whether the prefill drops masked cameras and padded prompt columns under ``layout``
        (observation.PREFILL_LAYOUTS; None: ``auto``): ``compact``, or ``auto`` in a precision without openpi's
        roundings (``padded`` there is bit-identical to openpi's bf16)."""
        layout = layout or "auto"
        if layout not in PREFILL_LAYOUTS:
            raise ValueError(f"prefill_layout must be one of {PREFILL_LAYOUTS}, got {layout!r}")
        return layout == "compact" or (layout == "auto" and not model.rounded)

    def prefill(self, model: Pi05Model, embs: torch.Tensor, valid: torch.Tensor, cache: KVCache, rows: slice,
                last: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return fast_path.prefill(model, embs, valid, cache, rows, last=last)[:, 0]

    def denoise(self, model: Pi05Model, prefix: Prefix, cache: KVCache, noise: torch.Tensor, num_steps: int,
                head: HeadParts, guide: RTCGuide | None) -> torch.Tensor:
        with torch.inference_mode():
            actions = fast_path.denoise(model, prefix, cache, noise, num_steps, head, guide)
        return actions.clone()

    def decode_step(self, model: Pi05Model, cache: KVCache, rows: slice, tokens: torch.Tensor,
                    positions: torch.Tensor, write_index: torch.Tensor, attn_len: int, lora) -> torch.Tensor:
        cache.valid[rows][torch.arange(tokens.shape[0], device=tokens.device), write_index] = True
        logits = decode_tokens(model, cache, rows, tokens[:, None], positions[:, None], write_index[:, None],
                                    attn_len, lora)
        return logits[:, 0]


def decode_tokens(model: Pi05Model, cache: KVCache, rows: slice, tokens: torch.Tensor, positions: torch.Tensor,
                  write_index: torch.Tensor, attn_len: int, lora) -> torch.Tensor:
    """T tokens per row in one fused forward (speculative verification); logits [B, T, V] (float32)."""
    with torch.inference_mode():
        logits = fast_path.decode_tokens(model, cache, rows, tokens, positions, write_index, attn_len, lora)
    return logits.clone()
