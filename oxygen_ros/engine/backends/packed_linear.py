"""oneDNN's inner product on weights reordered once (CPU, float32 or bfloat16).

A decode batch or the action chunk multiplies a few rows by a large weight. oneDNN's ``_linear_pointwise`` on a
weight reordered ahead of time (``_reorder_linear_weight``) takes the dense input as it is and runs 1.3-2x faster
there than ``mkldnn_linear`` on a plain oneDNN tensor (which converts its input each call), and up to 3x faster
than MKL's GEMM at 2-8 rows, which MKL treats as that many vector products; at a prefix's 100-1000 rows it is still
1.1-1.2x faster than MKL on the benchmark host. A single row stays on MKL (a vector product streaming the dense
weight is what that row costs either way, and measured faster).

Compiled steps (``graphs.py``) call the kernel through the operator ``oxygen::packed_linear``, opaque to the
compiler, so a compiled graph keeps the packed kernel instead of planning a GEMM of its own. It is defined with
``torch.library.Library`` (about 15 us per call; ``torch.library.custom_op`` costs ten times that).
"""

from __future__ import annotations

import functools
import itertools
import weakref

import torch
import torch.nn.functional as F

MANY_ROWS_HINT = 16  # the row count the multi-row layout is reordered for (measured: any of 8-64 is as good)
_REGISTRY: weakref.WeakValueDictionary[int, PackedWeight] = weakref.WeakValueDictionary()
_KEYS = itertools.count()


def packed_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build has oneDNN's reordered-weight linear for ``dtype`` on this CPU: bfloat16 needs
    AVX512-BW/VL/DQ or AVX-NE-CONVERT (an AVX2-only CPU refuses to reorder a bfloat16 weight)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    return dtype != torch.bfloat16 or _bf16_supported()


@functools.cache
def _bf16_supported() -> bool:
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if check is not None:
        return bool(check())
    try:  # an older build without the query: try one reorder
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), MANY_ROWS_HINT)
    except RuntimeError:
        return False
    return True


class PackedWeight:
    """A [N, K] float32 / bfloat16 weight (and bias) reordered for oneDNN: ``pw(x)`` = ``F.linear(x, weight, bias)``.

    ``weight`` itself is kept (not copied) for single rows; the reordered copy is taken now, so load weights
    first (in-place loads afterwards do not reach it)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight.detach(), None if bias is None else bias.detach().contiguous()
        self.out_features, self.in_features = self.weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.contiguous(), MANY_ROWS_HINT)
        self.key = next(_KEYS)
        _REGISTRY[self.key] = self

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return torch.ops.oxygen.packed_linear(x, self.key)
        return self.apply(x)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] == 1:
            return F.linear(x, self.weight, self.bias)
        y = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)


def _packed_linear(x: torch.Tensor, key: int) -> torch.Tensor:
    pw = _REGISTRY.get(key)
    if pw is None:
        raise RuntimeError("a compiled step refers to packed weights that no longer exist: build its graphs again")
    return pw.apply(x)


def _packed_linear_fake(x: torch.Tensor, key: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], _REGISTRY[key].out_features)


_LIB = torch.library.Library("oxygen", "DEF")  # kept alive: the operator lives as long as the library object
_LIB.define("packed_linear(Tensor x, int key) -> Tensor")
_LIB.impl("packed_linear", _packed_linear, "CPU")
torch.library.register_fake("oxygen::packed_linear", _packed_linear_fake, lib=_LIB)
