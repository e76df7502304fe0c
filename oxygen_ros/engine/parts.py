"""What the cached stages hand each other: an action expert's parts and a prefilled prefix."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .layers import GemmaStack


@dataclass(frozen=True)
class HeadParts:
    """One flow-matching action expert: its Gemma stack and projections (see heads.py for extra experts)."""

    stack: GemmaStack
    action_in_proj: nn.Linear
    action_out_proj: nn.Linear
    time_mlp_in: nn.Linear
    time_mlp_out: nn.Linear
    horizon: int


@dataclass
class Prefix:
    """What ``prefill`` leaves behind for the action expert and the language path."""

    rows: slice  # cache slots holding this prefix
    length: int  # padded prefix length P (cache positions [0, P))
    num_valid: torch.Tensor  # [B] valid prefix tokens = position of the first appended token
    last_hidden: torch.Tensor  # [B, W] final-normed hidden state at the last VALID prefix position
