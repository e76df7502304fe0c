"""Fused weights: Q/K/V, gate/up and a stack's adaRMS dense layers concatenated into one matrix each (and the
output and down projections behind the same interface, so the fast path can run them all on packed weights).

The parameters keep their modules and names (checkpoint keys, loading and saving are unchanged): after fusing they
are views into the concatenated tensor, so in-place loads (``load_state_dict``, ``copy_``) and optimiser steps
update the fused matrix too. Moving or copying a module (``.to``, ``deepcopy``) gives the parameters new storage;
:meth:`FusedStack.valid` notices and the stack fuses again on its next use. Only a direct ``param.data = ...`` on a
fused parameter goes unnoticed: call ``fused_stack(stack, refresh=True)`` after one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .packed_linear import PackedWeight, packed_available

# oneDNN's packed inner product for decode, denoise and prefill rows (pi0.5's longest prefix: 968); measured on the
# 1-thread AVX2 benchmark host, 1.1-1.2x faster than MKL's GEMM at 108-968 rows, 1.3-3x at 2-30. Whether it is
# faster depends on the host, the thread count and the shape: ``kernel_choice.py`` measures it per stack and per row
# class (FEW_ROWS or fewer: decode and the action chunk; more: a prefix)
PACK_MAX_ROWS = 1024
FEW_ROWS = 64
# bf16: oneDNN's packed inner product is bit-identical to ATen's bf16 GEMM (both oneDNN, fp32 accumulation) on every
# row count and pi0.5 shape measured (AMD EPYC, avx512_bf16), and 1.5-1.9x faster at denoise rows; kernel_choice.py
# checks the identity again on the model before it keeps packed weights for a precision with openpi's roundings
PACKED_DTYPES = (torch.float32, torch.bfloat16)


class PackPolicy:
    """Which calls of a stack's fused projections run on the packed weights: ``few`` (at most ``FEW_ROWS`` rows),
    ``many`` (more, up to ``PACK_MAX_ROWS``). Shared by the stack's :class:`FusedLinear` (set in place)."""

    def __init__(self, few: bool = True, many: bool = True) -> None:
        self.few, self.many = few, many

    def uses(self, rows: int) -> bool:
        return self.few if rows <= FEW_ROWS else self.many and rows <= PACK_MAX_ROWS


def alias_concat(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate ``params`` along dim 0 and make each a view into the result (returned)."""
    fused = torch.cat([p.detach() for p in params])
    offset = 0
    for p in params:
        n = p.shape[0]
        p.data = fused[offset:offset + n]
        offset += n
    return fused


class FusedLinear:
    """``x W^T + b`` over several ``nn.Linear`` layers' weights, concatenated (their weights are views into it)."""

    def __init__(self, linears: Sequence[nn.Linear]) -> None:
        self.weight = alias_concat([lin.weight for lin in linears])
        self.bias = alias_concat([lin.bias for lin in linears]) if linears[0].bias is not None else None
        self.splits = [lin.out_features for lin in linears]
        self._first = linears[0].weight
        self._packed: PackedWeight | None = None
        self.policy = PackPolicy(False, False)

    def valid(self) -> bool:
        """Whether the first source parameter still lives in the fused storage."""
        return self._first.data_ptr() == self.weight.data_ptr() and self._first.device == self.weight.device

    def pack(self, policy: PackPolicy | None = None) -> None:
        """Keep a oneDNN-packed copy for the calls ``policy`` names (fp32 or bf16 on CPU only; ``packed_linear``)."""
        w = self.weight
        self.policy = policy or PackPolicy()
        if w.dtype in PACKED_DTYPES and w.device.type == "cpu" and packed_available(w.dtype):
            self._packed = PackedWeight(w, self.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        p = self._packed
        if (p is None or x.dtype != self.weight.dtype or not self.policy.uses(x.numel() // x.shape[-1])
                or torch.compiler.is_exporting()):  # an exported step takes the plain weight as an input
            return F.linear(x, self.weight, self.bias)
        return p(x)  # compiled steps too, through the opaque custom op


@dataclass
class FusedStack:
    """The fused weights of one Gemma stack (backbone or action expert).

    ``qkv[i]`` / ``gate_up[i]``: layer i's fused projections, ``o[i]`` / ``down[i]`` its output and down projections
    (one matrix each, the same interface); norms are numbered 2i (input), 2i + 1 (post-attention) and
    2L (final). RMSNorm stacks: ``norm_weight`` [2L + 1, W] (the weights as stored, applied as 1 + w). adaRMS
    stacks: ``cond`` maps the time condition to every norm's (scale, shift, gate): [.., (2L + 1) * 3 * W].
    """

    qkv: list[FusedLinear]
    gate_up: list[FusedLinear]
    o: list[FusedLinear]
    down: list[FusedLinear]
    norm_weight: torch.Tensor | None
    cond: FusedLinear | None
    packed: tuple[bool, bool] = (False, False)  # (few, many): the PackPolicy its projections follow

    @staticmethod
    def build(stack: nn.Module, packed: tuple[bool, bool] = (False, False)) -> FusedStack:
        """Fuse ``stack`` (a ``GemmaStack``) in place and describe its fused weights; ``packed``: (few, many) rows
        on oneDNN-packed weights (:class:`PackPolicy`)."""
        layers = list(stack.layers)
        norms = [n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
        norms.append(stack.norm)
        with torch.no_grad():
            qkv = [FusedLinear([lyr.self_attn.q_proj, lyr.self_attn.k_proj, lyr.self_attn.v_proj]) for lyr in layers]
            gate_up = [FusedLinear([lyr.mlp.gate_proj, lyr.mlp.up_proj]) for lyr in layers]
            o = [FusedLinear([lyr.self_attn.o_proj]) for lyr in layers]
            down = [FusedLinear([lyr.mlp.down_proj]) for lyr in layers]
            if hasattr(norms[0], "dense"):
                norm_weight, cond = None, FusedLinear([n.dense for n in norms])
            else:
                norm_weight, cond = alias_concat([n.weight for n in norms]).view(len(norms), -1), None
        fs = FusedStack(qkv, gate_up, o, down, norm_weight, cond)
        if any(packed):
            fs.pack(*packed)
        return fs

    def valid(self, stack: nn.Module) -> bool:
        """Whether the parameters of ``stack`` are still views into these fused weights."""
        if not self.qkv[0].valid():
            return False
        if self.norm_weight is not None:
            return stack.norm.weight.data_ptr() == self.norm_weight[-1].data_ptr()
        return self.cond is not None and self.cond.valid()

    def pack(self, few: bool = True, many: bool = True) -> None:
        """oneDNN-packed copies of the projection matrices, used for CPU fp32 / bf16 calls of ``few`` / ``many``
        rows."""
        self.packed = (few, many)
        if self.qkv[0]._packed is not None:  # packed already: only which calls use the copies changes
            self.qkv[0].policy.few, self.qkv[0].policy.many = few, many
            return
        policy = PackPolicy(few, many)
        for f in (*self.qkv, *self.gate_up, *self.o, *self.down):
            f.pack(policy)


def fused_stack(stack: nn.Module, refresh: bool = False, pack: bool | tuple[bool, bool] | None = None) -> FusedStack:
    """The Gemma stack's fused weights, fused again when a move or copy gave the parameters new storage.

    ``pack``: from now on, run the fused projections on oneDNN-packed copies (``True``: every call, as
    ``cpu_kernels.use_onednn``; ``(few, many)``: calls of that row class, as ``kernel_choice`` measured)."""
    if pack is not None:
        stack.__dict__["_pack"] = (pack, pack) if isinstance(pack, bool) else tuple(pack)
    fs = stack.__dict__.get("_fused")
    if fs is not None and torch.compiler.is_compiling():
        return fs  # a traced step (graphs.py) runs on the weights fused before tracing; no pointer checks
    packed = stack.__dict__.get("_pack", (False, False))
    if fs is not None and not refresh and packed == fs.packed and fs.valid(stack):
        return fs
    with torch.inference_mode(False):  # the parameters become views of the fused weights: normal tensors
        if fs is not None and not refresh and all(map(any, (packed, fs.packed))) and fs.valid(stack):
            fs.pack(*packed)  # from one packed policy to another: the packed copies stay
        else:
            fs = stack.__dict__["_fused"] = FusedStack.build(stack, packed)
    return fs
