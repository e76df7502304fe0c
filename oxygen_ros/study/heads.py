"""Extra action experts reading the same prefix (the paper's multi-expert study, E = 2..4).

Each head is a flow-matching Gemma expert of its own size. Width and MLP size may differ; depth, heads and
head_dim must equal the backbone's, since every expert layer attends jointly over the backbone's prefix K/V.
"""

from __future__ import annotations

from torch import nn

from oxygen_ros.engine.config import GemmaConfig, Pi05Config
from oxygen_ros.engine.layers import GemmaStack
from oxygen_ros.engine.parts import HeadParts


class ActionHead(nn.Module):
    """A flow-matching action expert with its own weights, horizon and action size."""

    def __init__(self, config: Pi05Config, width: int, mlp_dim: int, horizon: int | None = None,
                 action_dim: int | None = None) -> None:
        super().__init__()
        b = config.backbone
        expert = GemmaConfig(width=width, depth=b.depth, mlp_dim=mlp_dim, num_heads=b.num_heads,
                             num_kv_heads=b.num_kv_heads, head_dim=b.head_dim, rope_theta=b.rope_theta)
        self.horizon = horizon or config.action_horizon
        action_dim = action_dim or config.action_dim
        self.model = GemmaStack(expert, vocab_size=None, cond_dim=width)
        self.action_in_proj = nn.Linear(action_dim, width)
        self.action_out_proj = nn.Linear(width, action_dim)
        self.time_mlp_in = nn.Linear(width, width)
        self.time_mlp_out = nn.Linear(width, width)

    def parts(self) -> HeadParts:
        return HeadParts(self.model, self.action_in_proj, self.action_out_proj, self.time_mlp_in,
                         self.time_mlp_out, self.horizon)


def make_extra_heads(config: Pi05Config, count: int) -> nn.ModuleList:
    """``count`` extra experts of decreasing size (1x, 0.5x, 0.25x of the main expert's width)."""
    e = config.expert
    heads = []
    for i in range(count):
        f = 2 ** (i % 3)
        heads.append(ActionHead(config, width=max(e.width // f, 16), mlp_dim=max(e.mlp_dim // f, 32)))
    return nn.ModuleList(heads)
