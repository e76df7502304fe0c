"""The fused cached stages: the same math as ``Pi05Model``'s eager stages, in fewer and bigger operations.

- one Q/K/V and one gate/up matrix product per layer (``fusion.py``), q and k rotated together;
- every adaRMS scale, shift and gate of all S denoise steps from one matrix product before the loop (the times are
  known in advance), the time MLP run once for all steps;
- RoPE from a cached table (``RopeTable``); the attention mask built once per stage as an additive float mask
  (SDPA would convert a boolean one in every layer); the cache's per-layer views taken once per stage;
- decode steps over rows of several tokens each (speculative verification, ``decode_tokens``).

``backends/fused.py`` runs them as a model's stage runner; ``stages.EagerStages`` is the eager, module-by-module
reference (the tests compare the two).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..config import GemmaConfig
from ..exact_ops import mean_last
from ..kv_cache import KVCache
from ..layers import GemmaStack, rope_cos_sin, rounded_attention, sinusoidal_time_embedding
from ..lora import LoraAdapter
from ..parts import HeadParts, Prefix
from ..rtc import RTCGuide
from .fusion import FusedStack, fused_stack

Pi05Model = nn.Module  # the model (its fused stage runner calls this module): config, backbone, dtype, embeddings

# attend(layer, q [B, T, Hq, D], k [B, T, Hkv, D], v [B, T, Hkv, D]) -> attention output [B, T, Hq * D]
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Norm = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]  # (scale, shift, gate): y = rms(x) * scale + shift


class RopeTable:
    """cos and sign-folded sin for positions [0, length): rotating by the table equals ``apply_rope``."""

    def __init__(self, g: GemmaConfig, length: int, dtype: torch.dtype, device: torch.device,
                 freq_dtype: torch.dtype = torch.float32) -> None:
        cos, sin = rope_cos_sin(torch.arange(length, device=device)[None], g.head_dim, g.rope_theta, dtype,
                                freq_dtype)
        half = g.head_dim // 2
        self.cos = cos[0, 0]
        self.sin = torch.cat([-sin[0, 0, :, :half], sin[0, 0, :, half:]], -1)  # rotate-half's sign folded in
        self.length, self.dtype, self.device, self.freq_dtype = length, dtype, device, freq_dtype

    @staticmethod
    def get(model: Pi05Model, length: int) -> RopeTable:
        """The model's table covering ``length`` positions (grown by doubling)."""
        t = model.__dict__.get("_rope_table")
        if t is None or t.length < length or t.dtype != model.dtype or t.device != model.device \
                or t.freq_dtype != model.rope_freq_dtype:
            t = RopeTable(model.config.backbone, max(length, 2 * (t.length if t else 256)), model.dtype, model.device,
                          model.rope_freq_dtype)
            model.__dict__["_rope_table"] = t
        return t

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, T, 1, D] for integer positions [B, T]."""
        return self.cos[positions][:, :, None], self.sin[positions][:, :, None]


def additive_mask(mask: torch.Tensor, group: int, dtype: torch.dtype) -> torch.Tensor:
    """bool [B, T, L] -> float [B, 1, group * T, L] (0 / -inf) for queries folded by kv group (``gqa_attention``)."""
    b, t, n = mask.shape
    if t > 1 and group > 1:
        mask = mask[:, None].expand(b, group, t, n).reshape(b, group * t, n)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))[:, None]


def sdpa(g: GemmaConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
         rounded: bool = False) -> torch.Tensor:
    """Grouped-query attention, q [B, T, Hq, D] against k, v [B, Hkv, L, D]; returns [B, T, Hq * D].
    ``rounded``: openpi's low-precision attention (``layers.rounded_attention``) instead of SDPA."""
    b, t = q.shape[:2]
    hkv, d = g.num_kv_heads, g.head_dim
    r = g.num_heads // hkv
    qf = q.reshape(b, t, hkv, r, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, r * t, d)
    out = rounded_attention(qf, k, v, mask) if rounded else F.scaled_dot_product_attention(qf, k, v, attn_mask=mask)
    return out.view(b, hkv, r, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, g.num_heads * d)


def rms(x: torch.Tensor, eps: float, exact: bool = False) -> torch.Tensor:
    """x / rms(x) in float32; ``exact``: ATen's mean even inside a compiled step (``exact_ops.py``)."""
    xf = x.float()
    return xf * torch.rsqrt(mean_last(xf.pow(2), exact) + eps)


def normed(x: torch.Tensor, norm: Norm, eps: float, rounded: bool = False) -> torch.Tensor:
    """RMS-normed x scaled (and shifted); ``rounded``: the product rounded before the sum, as openpi's norm (and
    ATen's mean of squares when compiled)."""
    scale, shift, _ = norm
    y = rms(x, eps, rounded)
    y = y * scale if shift is None else y * scale + shift if rounded else torch.addcmul(shift, y, scale)
    return y.to(x.dtype)


def residual(h: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None, rounded: bool = False) -> torch.Tensor:
    """h + y (* gate); ``rounded``: the product rounded before the sum, as openpi's gated residual."""
    return h + y if gate is None else h + y * gate if rounded else torch.addcmul(h, y, gate)


def layer_forward(stack: GemmaStack, fs: FusedStack, i: int, h: torch.Tensor, n_in: Norm, n_post: Norm,
                  cos: torch.Tensor, sin: torch.Tensor, attend: Attend,
                  lora: LoraAdapter | None = None, rounded: bool = False,
                  rows: torch.Tensor | None = None) -> torch.Tensor:
    """One Gemma layer on hidden states h [B, T, W]. ``rounded``: each product rounded before its sum (openpi's
    bf16 order of roundings, ``Pi05Model.rounded``) instead of fused multiply-adds. ``rows`` [B]: Q/K/V for every
    position (``attend`` keeps the K/V and answers that row's query only), the rest for that one position of each
    row: returns [B, 1, W]."""
    g = stack.cfg
    b, t, _ = h.shape
    x = normed(h, n_in, g.rms_eps, rounded)
    qkv = fs.qkv[i](x) if lora is None else lora.fused_delta(i, "qkv", x, fs.qkv[i](x), fs.qkv[i].splits)
    heads = g.num_heads + g.num_kv_heads
    qk = qkv[..., :heads * g.head_dim].view(b, t, heads, g.head_dim)
    rot = torch.roll(qk, g.head_dim // 2, -1)
    qk = qk * cos + rot * sin if rounded else torch.addcmul(qk * cos, rot, sin)
    v = qkv[..., heads * g.head_dim:].view(b, t, g.num_kv_heads, g.head_dim)
    attn = attend(i, qk[:, :, :g.num_heads], qk[:, :, g.num_heads:], v)
    if rows is not None:
        h = h.gather(1, rows[:, None, None].expand(b, 1, h.shape[2]))
    o = fs.o[i](attn) if lora is None else lora.fused_delta(i, "o", attn, fs.o[i](attn))
    h = residual(h, o, n_in[2], rounded)
    x = normed(h, n_post, g.rms_eps, rounded)
    gu = fs.gate_up[i](x) if lora is None else lora.fused_delta(i, "gate_up", x, fs.gate_up[i](x),
                                                                             fs.gate_up[i].splits)
    gate, up = gu.chunk(2, -1)
    inner = F.gelu(gate, approximate="tanh") * up
    down = fs.down[i]
    y = down(inner) if lora is None else lora.fused_delta(i, "down", inner, down(inner))
    return residual(h, y, n_post[2], rounded)


def rms_norms(fs: FusedStack) -> list[Norm]:
    """Every RMSNorm of a backbone stack as (1 + w, None, None), in norm order (2i, 2i + 1, 2L)."""
    return [(w, None, None) for w in (1.0 + fs.norm_weight.float()).unbind(0)]


# ------------------------------------------------------------------------------------------------ stages
def prefill(model: Pi05Model, embs: torch.Tensor, valid: torch.Tensor, cache: KVCache | None, rows: slice | None,
            rope: RopeTable | None = None,
            views: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
            last: torch.Tensor | None = None) -> torch.Tensor:
    """The backbone over prefix embeddings [B, P, W] (bidirectional over valid tokens); K/V into ``cache`` rows, or
    into per-layer ``views`` [B, Hkv, >= P, D]. Returns the last layer's hidden states [B, P, W] (not normed), or
    with ``last`` (a position per row, [B]) only those: [B, 1, W]. The K/V a prefix keeps are every layer's
    projections, so past the last layer's Q/K/V only those rows' attention output and MLP are computed (for
    pi0.5's action path nothing else of the last layer is used; openpi computes it all).
    ``rope``: a table covering P positions (else the model's, grown to P: no host read)."""
    stack = model.backbone
    fs, g = fused_stack(stack), stack.cfg
    b, p = valid.shape
    positions = valid.cumsum(1) - 1
    # positions < p: a table of p positions covers them without reading the largest back from the device
    cos, sin = (RopeTable.get(model, p) if rope is None else rope).lookup(positions)
    group = g.num_heads // g.num_kv_heads
    mask = additive_mask(valid[:, None, :].expand(b, p, p), group, embs.dtype)
    last_mask = None if last is None else additive_mask(valid[:, None, :], group, embs.dtype)
    kv = views if views is not None else cache.layer_views(rows)

    def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        kv[0][i][:, :, :p].copy_(k)
        kv[1][i][:, :, :p].copy_(v)
        if last is not None and i == g.depth - 1:
            return sdpa(g, q.gather(1, last[:, None, None, None].expand(b, 1, *q.shape[2:])), k, v, last_mask,
                        rounded)
        return sdpa(g, q, k, v, mask, rounded)

    rounded = model.rounded
    norms = rms_norms(fs)
    h = embs
    for i in range(g.depth):
        h = layer_forward(stack, fs, i, h, norms[2 * i], norms[2 * i + 1], cos, sin, attend, rounded=rounded,
                          rows=last if i == g.depth - 1 else None)
    return h


def time_conditioning(model: Pi05Model, head: HeadParts, times: list[float]) -> list[list[Norm]]:
    """Per denoise step, every adaRMS norm's (1 + scale, shift, gate) of ``head``'s stack: one time MLP and one
    matrix product for all steps, computed once per set of times and weights (a frame's denoise reads the memo;
    an in-place load or a move of the weights computes it again)."""
    fs = fused_stack(head.stack)
    sources = (fs.cond.weight, head.time_mlp_in.weight, head.time_mlp_out.weight, head.time_mlp_in.bias,
               head.time_mlp_out.bias, fs.cond.bias)
    key = (tuple(times), model.rounded, *((t.data_ptr(), t._version) for t in sources if t is not None))
    memo = fs.__dict__.setdefault("_time_conditioning", {})
    if key not in memo:
        with torch.inference_mode(False):  # kept across frames: normal tensors
            memo.clear()
            memo[key] = _time_conditioning(model, head, fs, times)
    return memo[key]


def _time_conditioning(model: Pi05Model, head: HeadParts, fs: FusedStack, times: list[float]) -> list[list[Norm]]:
    w = head.action_in_proj.out_features
    t = torch.tensor(times, dtype=torch.float32, device=model.device)
    cond = sinusoidal_time_embedding(t, w).to(head.time_mlp_in.weight.dtype)
    def mlp(c: torch.Tensor) -> torch.Tensor:
        return fs.cond(F.silu(head.time_mlp_out(F.silu(head.time_mlp_in(c)))))

    mod = torch.cat([mlp(c[None]) for c in cond]) if model.rounded else mlp(cond)
    mod = mod.view(len(times), -1, 3, w)
    scale = (1.0 + mod[:, :, 0].float()).unbind(0)
    shift = mod[:, :, 1].float().unbind(0)
    gate = mod[:, :, 2].to(model.dtype).unbind(0)
    return [list(zip(sc.unbind(0), sh.unbind(0), gt.unbind(0), strict=True))
            for sc, sh, gt in zip(scale, shift, gate, strict=True)]


def denoise(model: Pi05Model, prefix: Prefix, cache: KVCache, noise: torch.Tensor, num_steps: int,
            head: HeadParts, guide: RTCGuide | None = None) -> torch.Tensor:
    """Flow-matching Euler sampling from a cached prefix (see ``Pi05Model.denoise``)."""
    rows, p = prefix.rows, prefix.length
    ks, vs = cache.layer_views(rows)
    conds = time_conditioning(model, head, model.denoise_times(num_steps))
    rope = RopeTable.get(model, p + head.horizon)  # num_valid <= p: no host read of the largest position
    return denoise_kv(model, head, ks, vs, cache.valid[rows, :p], prefix.num_valid, noise, conds, rope, guide)


def denoise_kv(model: Pi05Model, head: HeadParts, ks: list[torch.Tensor], vs: list[torch.Tensor],
               valid: torch.Tensor, num_valid: torch.Tensor, noise: torch.Tensor, conds: list[list[Norm]],
               rope: RopeTable, guide: RTCGuide | None = None) -> torch.Tensor:
    """The S-step loop (one step per entry of ``conds``, :func:`time_conditioning`) over per-layer K/V
    [B, Hkv, >= P + H, D] whose first P = ``valid.shape[1]`` positions hold the prefix (``valid`` [B, P] marks its
    tokens, ``num_valid`` [B] counts them); the action tokens' K/V go to [P, P + H). Shapes depend only on the
    arguments' shapes and nothing syncs with the host: the captured graph runs exactly this (``graphs.py``).
    ``guide``: identity real-time-chunking guidance of every step's velocity (its tensors are read, not copied)."""
    stack = head.stack
    fs, g = fused_stack(stack), stack.cfg
    h_len = head.horizon
    b, p = valid.shape
    dev = noise.device
    cos, sin = rope.lookup(num_valid[:, None] + torch.arange(h_len, device=dev))
    full = torch.cat([valid, torch.ones(b, h_len, dtype=torch.bool, device=dev)], 1)
    mask = additive_mask(full[:, None, :].expand(b, h_len, p + h_len), g.num_heads // g.num_kv_heads, model.dtype)
    k_scr, v_scr = [k[:, :, p:p + h_len] for k in ks], [v[:, :, p:p + h_len] for v in vs]
    k_all, v_all = [k[:, :, :p + h_len] for k in ks], [v[:, :, :p + h_len] for v in vs]

    def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_scr[i].copy_(k.transpose(1, 2))
        v_scr[i].copy_(v.transpose(1, 2))
        return sdpa(g, q, k_all[i], v_all[i], mask, rounded)

    dt = -1.0 / len(conds)
    x_t = noise.float()
    in_dtype, out_dtype = head.action_in_proj.weight.dtype, head.action_out_proj.weight.dtype
    rounded = model.rounded
    for step, norms in enumerate(conds):
        h = head.action_in_proj(x_t.to(in_dtype)).to(model.dtype)
        for i in range(g.depth):
            h = layer_forward(stack, fs, i, h, norms[2 * i], norms[2 * i + 1], cos, sin, attend, rounded=rounded)
        v_t = head.action_out_proj(normed(h, norms[-1], g.rms_eps, rounded).to(out_dtype)).float()
        if guide is not None:
            v_t = guide.apply(step, x_t, v_t)
        x_t = x_t + dt * v_t
    return x_t


def decode_tokens(model: Pi05Model, cache: KVCache, rows: slice, tokens: torch.Tensor, positions: torch.Tensor,
                  write_index: torch.Tensor, attn_len: int, lora: LoraAdapter | None = None,
                  rope: RopeTable | None = None,
                  views: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None) -> torch.Tensor:
    """Advance B sequences by T tokens each in one forward; logits [B, T, V] (float32).

    tokens/positions/write_index are [B, T]: token j of row b has RoPE position positions[b, j] and writes its K/V
    at cache index write_index[b, j] (< attn_len); it attends to the row's valid cache positions in [0, attn_len)
    and to the row's tokens 0..j of this forward. ``cache.valid`` is not changed: the caller marks what it keeps.
    ``rope``: a table covering every position (else the model's table of ``attn_len`` positions: every position
    must be below ``attn_len``, as a token's position never exceeds its write index);
    ``views``: ``cache.layer_views(rows)``, taken by the caller (a compiled step must not guard on the memo).
    """
    stack = model.backbone
    fs, g = fused_stack(stack), stack.cfg
    b, t = tokens.shape
    dev = tokens.device
    # a token's RoPE position never exceeds its write index (< attn_len): no host read of the largest position
    cos, sin = (RopeTable.get(model, attn_len) if rope is None else rope).lookup(positions)
    slots = torch.arange(attn_len, device=dev)
    new = (slots[None, None, :] == write_index[:, :, None]).cumsum(1) > 0  # [B, T, L]: tokens 0..j of the row
    mask = additive_mask(cache.valid[rows, None, :attn_len] | new, g.num_heads // g.num_kv_heads, model.dtype)
    ks, vs = views if views is not None else cache.layer_views(rows)
    ar = torch.arange(b, device=dev)[:, None]

    def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ks[i][ar, :, write_index] = k
        vs[i][ar, :, write_index] = v
        return sdpa(g, q, ks[i][:, :, :attn_len], vs[i][:, :, :attn_len], mask, rounded)

    rounded = model.rounded
    norms = rms_norms(fs)
    h = model.embed_tokens(tokens)
    for i in range(g.depth):
        h = layer_forward(stack, fs, i, h, norms[2 * i], norms[2 * i + 1], cos, sin, attend, lora, rounded)
    return model.lm_logits(normed(h, norms[-1], g.rms_eps, rounded)).float()
