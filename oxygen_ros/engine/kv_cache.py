"""The KV cache: preallocated tensors that the model writes in place and reads through views.

Layout per layer: K and V ``[num_slots, num_kv_heads, max_len, head_dim]`` plus one validity mask
``valid[num_slots, max_len]`` shared by all layers. A *slot* is one sequence (one observation's prefix followed by
the tokens a language request appends). The model addresses a contiguous range of slots with a ``slice``, so every
read is a view (no gather, no concatenation) and every write is an in-place index_put.

Positions inside a slot:
  [0, P)           the prefix (images + prompt); padded prompt positions stay invalid
  [P, P + H)       scratch for the action expert's H tokens during denoising (never marked valid, so it is
                   invisible to language decoding and overwritten by it)
  [P, ...)         tokens appended by a language request (marked valid as they are written)
"""

from __future__ import annotations

import torch

from .config import Pi05Config


class KVCache:
    """Preallocated K/V storage for ``num_slots`` sequences of up to ``max_len`` tokens."""

    def __init__(
        self,
        config: Pi05Config,
        num_slots: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        g = config.backbone
        shape = (g.depth, num_slots, g.num_kv_heads, max_len, g.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.valid = torch.zeros(num_slots, max_len, dtype=torch.bool, device=device)
        self.num_slots = num_slots
        self.max_len = max_len
        self._views: dict[tuple[int, int], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}

    @staticmethod
    def for_model(config: Pi05Config, num_slots: int, extra_tokens: int = 0, **kw) -> KVCache:
        """Cache sized for the longest prefix plus the action scratch or ``extra_tokens`` appended tokens."""
        return KVCache(config, num_slots, config.max_prefix_len + max(config.action_horizon, extra_tokens), **kw)

    def layer_views(self, rows: slice) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per layer, the K and V views [B, kv_heads, max_len, head_dim] of the slots ``rows`` (memoised)."""
        key = (rows.start, rows.stop)
        views = self._views.get(key)
        if views is None:
            with torch.inference_mode(False):  # memoised: views made in inference mode could not be written later
                views = self._views[key] = (list(self.k[:, rows].unbind(0)), list(self.v[:, rows].unbind(0)))
        return views

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.valid.nbytes

    def reset(self, rows: slice) -> None:
        """Forget the sequences in ``rows`` (K/V bytes are simply overwritten later)."""
        self.valid[rows] = False
