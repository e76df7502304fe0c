"""Building blocks of pi0.5: Gemma layers with (ada)RMSNorm, RoPE, grouped-query SDPA, SigLIP encoder.

Module and parameter names follow openpi's PyTorch port so that ``state_dict()`` keys equal checkpoint keys.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import GemmaConfig, VisionConfig
from .exact_ops import layer_norm, mean_last, softmax_last


class RMSNorm(nn.Module):
    """Gemma RMSNorm: computed in fp32, weight stored as w and applied as (1 + w)."""

    openpi_rounding: bool = False  # precision.py sets it: keep ATen's mean inside compiled steps (exact_ops.py)

    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        xf = x.float()
        y = xf * torch.rsqrt(mean_last(xf.pow(2), self.openpi_rounding) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype), None


class AdaRMSNorm(nn.Module):
    """pi0.5 adaptive RMSNorm: ``dense(cond)`` gives scale, shift and a residual gate (zero-initialised)."""

    openpi_rounding: bool = False  # precision.py sets it: keep ATen's mean inside compiled steps (exact_ops.py)

    def __init__(self, width: int, cond_dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * width)
        nn.init.zeros_(self.dense.weight)
        nn.init.zeros_(self.dense.bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        y = xf * torch.rsqrt(mean_last(xf.pow(2), self.openpi_rounding) + self.eps)
        scale, shift, gate = self.dense(cond).unsqueeze(1).chunk(3, dim=-1)
        y = y * (1.0 + scale.float()) + shift.float()
        return y.to(x.dtype), gate.to(x.dtype)


def gated_residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    return x + y if gate is None else x + y * gate


class GemmaMLP(nn.Module):
    def __init__(self, width: int, mlp_dim: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, mlp_dim, bias=False)
        self.up_proj = nn.Linear(width, mlp_dim, bias=False)
        self.down_proj = nn.Linear(mlp_dim, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class GemmaAttentionProj(nn.Module):
    """Q/K/V/O projections of one Gemma layer (the attention itself is joint across experts)."""

    def __init__(self, cfg: GemmaConfig) -> None:
        super().__init__()
        self.q_proj = nn.Linear(cfg.width, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.width, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.width, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.width, bias=False)


class GemmaLayer(nn.Module):
    def __init__(self, cfg: GemmaConfig, cond_dim: int | None) -> None:
        super().__init__()
        self.self_attn = GemmaAttentionProj(cfg)
        self.mlp = GemmaMLP(cfg.width, cfg.mlp_dim)
        if cond_dim is None:
            self.input_layernorm = RMSNorm(cfg.width, cfg.rms_eps)
            self.post_attention_layernorm = RMSNorm(cfg.width, cfg.rms_eps)
        else:
            self.input_layernorm = AdaRMSNorm(cfg.width, cond_dim, cfg.rms_eps)
            self.post_attention_layernorm = AdaRMSNorm(cfg.width, cond_dim, cfg.rms_eps)


class GemmaStack(nn.Module):
    """Layers + final norm of one expert. ``cond_dim`` set -> adaRMSNorm everywhere (the action expert).

    The fused stages keep the stack's fused weights in its ``__dict__`` (``backends.fusion.fused_stack``); a move or a
    copy drops them, and the stack fuses again on its next fused use."""

    def __init__(self, cfg: GemmaConfig, vocab_size: int | None, cond_dim: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        if vocab_size is not None:
            self.embed_tokens = nn.Embedding(vocab_size, cfg.width)
        self.layers = nn.ModuleList(GemmaLayer(cfg, cond_dim) for _ in range(cfg.depth))
        if cond_dim is None:
            self.norm = RMSNorm(cfg.width, cfg.rms_eps)
        else:
            self.norm = AdaRMSNorm(cfg.width, cond_dim, cfg.rms_eps)

    def _apply(self, fn, recurse: bool = True):
        self.__dict__.pop("_fused", None)  # .to() / .half(): release the fused storage (backends/fusion.py)
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()  # pickling and deepcopy: the copy fuses its own parameters on first use
        state.pop("_fused", None)
        return state


# ---------------------------------------------------------------------------------------------- rotary + SDPA
def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype,
                 freq_dtype: torch.dtype = torch.float32):
    """cos/sin [B, 1, T, head_dim] for integer positions [B, T] (HF/Gemma rotate-half convention).

    ``freq_dtype``: the frequencies rounded to it first (openpi's bf16 model holds HF's ``inv_freq`` buffer in
    bfloat16; the angles are then computed in float32)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    inv_freq = inv_freq.to(freq_dtype).float()
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def rounded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention as HF's eager path computes it in q's dtype (openpi's Gemma and SigLIP in bfloat16): the scores
    ``q k^T`` and their scaling rounded to that dtype, the softmax in float32, the probabilities rounded back to
    that dtype before ``p v``. (``scaled_dot_product_attention`` keeps all of it in float32.)

    q [.., T, D], k and v [.., L, D]; ``mask`` broadcastable to [.., T, L]: bool (True = attend) or additive float.
    """
    scores = (torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5).float()
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min) if mask.dtype == torch.bool \
            else scores + mask
    return torch.matmul(softmax_last(scores, True).to(q.dtype), v)  # ATen's softmax even when compiled


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                  rounded: bool = False) -> torch.Tensor:
    """Grouped-query SDPA without expanding K/V.

    q [B, Hq, T, D]; k, v [B, Hkv, L, D] (may be strided views into the KV cache); mask bool [B, T, L].
    The r = Hq / Hkv query heads of a group are folded into the query-length axis, so every kv head is read
    once. ``rounded``: :func:`rounded_attention` instead of SDPA. Returns [B, T, Hq * D].
    """
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    r = hq // hkv
    qf = q.reshape(b, hkv, r * t, d)
    m = mask[:, None] if t == 1 else mask[:, None, None].expand(b, 1, r, t, mask.shape[-1]).reshape(b, 1, r * t, -1)
    out = rounded_attention(qf, k, v, m) if rounded else F.scaled_dot_product_attention(qf, k, v, attn_mask=m)
    return out.reshape(b, hq, t, d).transpose(1, 2).reshape(b, t, hq * d)


# ---------------------------------------------------------------------------------------------- SigLIP
class SiglipAttention(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.q_proj = nn.Linear(cfg.width, cfg.width)
        self.k_proj = nn.Linear(cfg.width, cfg.width)
        self.v_proj = nn.Linear(cfg.width, cfg.width)
        self.out_proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape

        def heads(p: nn.Linear) -> torch.Tensor:
            return p(x).view(b, t, self.num_heads, -1).transpose(1, 2)

        # SDPA in every dtype: openpi's SigLIP runs HF's "sdpa" attention (only its Gemma experts are set to eager)
        out = F.scaled_dot_product_attention(heads(self.q_proj), heads(self.k_proj), heads(self.v_proj))
        return self.out_proj(out.transpose(1, 2).reshape(b, t, w))


class SiglipMLP(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.width, cfg.mlp_dim)
        self.fc2 = nn.Linear(cfg.mlp_dim, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class SiglipLayer(nn.Module):
    openpi_rounding: bool = False  # precision.py sets it: keep ATen's layer norm inside compiled steps

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)
        self.self_attn = SiglipAttention(cfg)
        self.layer_norm2 = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)
        self.mlp = SiglipMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        exact = self.openpi_rounding
        x = x + self.self_attn(layer_norm(self.layer_norm1, x, exact))
        return x + self.mlp(layer_norm(self.layer_norm2, x, exact))


class SiglipEmbeddings(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.patch_embedding = nn.Conv2d(3, cfg.width, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.position_embedding = nn.Embedding(cfg.tokens_per_image, cfg.width)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        return x + self.position_embedding.weight[None]


class SiglipEncoder(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(SiglipLayer(cfg) for _ in range(cfg.depth))


class SiglipVisionTransformer(nn.Module):
    """SigLIP So400m/14 without the pooling head (PaliGemma uses every patch token)."""

    openpi_rounding: bool = False  # precision.py sets it: keep ATen's layer norm inside compiled steps

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.embeddings = SiglipEmbeddings(cfg)
        self.encoder = SiglipEncoder(cfg)
        self.post_layernorm = nn.LayerNorm(cfg.width, eps=cfg.layer_norm_eps)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(pixels).to(self.post_layernorm.weight.dtype)  # float32 embeddings: an island
        for layer in self.encoder.layers:
            x = layer(x)
        return layer_norm(self.post_layernorm, x, self.openpi_rounding)


class SiglipVisionTower(nn.Module):
    """Keeps openpi's key prefix ``vision_tower.vision_model.*``."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.vision_model = SiglipVisionTransformer(cfg)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.vision_model(pixels)


class MultiModalProjector(nn.Module):
    def __init__(self, vision_width: int, text_width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(vision_width, text_width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def sinusoidal_time_embedding(t: torch.Tensor, dim: int, min_period: float = 4e-3, max_period: float = 4.0):
    """openpi's sine-cosine embedding of the flow-matching time t [B] -> [B, dim] (computed in float64)."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    x = (1.0 / period * 2 * math.pi)[None] * t.double()[:, None]  # openpi's order of operations, to the last bit
    return torch.cat([torch.sin(x), torch.cos(x)], dim=1)
