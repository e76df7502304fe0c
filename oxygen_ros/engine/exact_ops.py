"""ATen's own kernels kept opaque inside compiled steps, for the precisions that reproduce openpi's bf16 roundings.

Inductor generates its own code for a row mean, a softmax or a layer norm, which sums in another order than
ATen's kernels: measured with torch 2.13 on a CPU, ``x.pow(2).mean(-1)`` over 64 floats differs by 1 ulp in about
half of the rows, and a bf16 ``layer_norm`` in some. In bf16 such an ulp can flip a rounding, so compiled steps
(``graphs: compile`` / ``aot``) would move openpi's numbers. Under tracing these ops are therefore called as custom
operators whose kernels are ATen's (an extern call in the compiled graph, found through the dispatcher when an
AOTInductor package runs); eager code calls ATen directly, so nothing changes there. Each kernel returns a contiguous
tensor, the layout its fake (shape) function promises.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["layer_norm", "mean_last", "softmax_last", "tracing"]

_LIB = torch.library.Library("oxygen_exact", "DEF")  # kept alive: the operators live as long as the library object
_LIB.define("mean_last(Tensor x) -> Tensor")
_LIB.define("softmax_last(Tensor x) -> Tensor")
_LIB.define("layer_norm(Tensor x, Tensor weight, Tensor bias, float eps) -> Tensor")


def _mean_last(x: torch.Tensor) -> torch.Tensor:
    return x.mean(-1, keepdim=True).contiguous()  # the layout the fake promises (a compiled caller reads it so)


def _softmax_last(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1).contiguous()


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps).contiguous()


for _key in ("CPU", "CUDA"):
    _LIB.impl("mean_last", _mean_last, _key)
    _LIB.impl("layer_norm", _layer_norm, _key)
    _LIB.impl("softmax_last", _softmax_last, _key)
torch.library.register_fake("oxygen_exact::mean_last", lambda x: x.new_empty((*x.shape[:-1], 1)), lib=_LIB)
torch.library.register_fake("oxygen_exact::softmax_last", lambda x: x.new_empty(x.shape), lib=_LIB)
torch.library.register_fake("oxygen_exact::layer_norm", lambda x, w, b, eps: x.new_empty(x.shape), lib=_LIB)


def tracing() -> bool:
    """Whether the code runs under torch.compile or torch.export tracing."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def mean_last(x: torch.Tensor, exact: bool) -> torch.Tensor:
    """``x.mean(-1, keepdim=True)``; ``exact``: ATen's kernel even inside a compiled graph."""
    if exact and tracing():
        return torch.ops.oxygen_exact.mean_last(x)
    return x.mean(-1, keepdim=True)


def softmax_last(x: torch.Tensor, exact: bool) -> torch.Tensor:
    """``torch.softmax(x, dim=-1)``; ``exact``: ATen's kernel even inside a compiled graph."""
    if exact and tracing():
        return torch.ops.oxygen_exact.softmax_last(x)
    return torch.softmax(x, dim=-1)


def layer_norm(module: nn.LayerNorm, x: torch.Tensor, exact: bool) -> torch.Tensor:
    """``module(x)``; ``exact``: ATen's kernel even inside a compiled graph."""
    if exact and tracing():
        return torch.ops.oxygen_exact.layer_norm(x, module.weight, module.bias, module.eps)
    return module(x)
