"""Precision policies: which parameters run in which dtype.

``float32`` / ``bfloat16`` / ``float16``: the whole model in that dtype. ``bfloat16_islands``: openpi's mixed
precision (``PaliGemmaWithExpertModel.to_bfloat16_for_selected_params``, which ``create_trained_policy`` applies
even to fp32 checkpoints): the transformer weights and the KV cache in bfloat16, and these islands in float32:

- every Gemma norm of the backbone and the action expert (RMSNorm weights and the adaRMS ``dense`` layers that
  give scale, shift and gate; norms compute in float32 anyway);
- SigLIP's patch and position embeddings;
- the action projections (``action_in_proj``, ``action_out_proj``) and the time MLP (``time_mlp_in/out``), so the
  flow-matching state and the time condition stay float32 end to end.

Hidden states entering and leaving an island are cast (``Pi05Model.dtype`` is the compute dtype: the backbone's).
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import AdaRMSNorm, RMSNorm, SiglipEmbeddings

PRECISIONS: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                                      "float16": torch.float16, "bfloat16_islands": torch.bfloat16}
ISLAND_NAMES = ("action_in_proj", "action_out_proj", "time_mlp_in", "time_mlp_out")


def float32_islands(model: nn.Module) -> list[nn.Module]:
    """The modules ``bfloat16_islands`` keeps in float32 (of a ``Pi05Model``, extra ``ActionHead`` s, ...)."""
    out = [m for m in model.modules() if isinstance(m, RMSNorm | AdaRMSNorm | SiglipEmbeddings)]
    return out + [getattr(m, n) for m in model.modules() for n in ISLAND_NAMES if isinstance(getattr(m, n, None),
                                                                                          nn.Linear)]


def apply_precision(model: nn.Module, precision: str) -> nn.Module:
    """Cast ``model`` (and keep its float32 islands) per ``precision``, in place; returns it."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, got {precision!r}")
    model.to(PRECISIONS[precision])
    if precision == "bfloat16_islands":
        for m in float32_islands(model):
            m.float()
    return model
