"""oneDNN linear layers for CPU inference.

On small row counts (a decode batch of 1-32 tokens) plain ``F.linear`` (MKL GEMM) runs at vector-product speed;
oneDNN's inner-product primitive with a pre-packed weight is 2-4x faster there. ``use_onednn`` swaps every
``nn.Linear`` of a model for ``OneDNNLinear`` in place: same parameters and state_dict keys, faster forward.
Call it after loading weights (the packed copy is taken once); fp32 on CPU only.
"""

from __future__ import annotations

import torch
from torch import nn

from ..layers import GemmaStack
from .fusion import fused_stack

MAX_ROWS = 64  # oneDNN only for small row counts (decode, denoise)
MIN_WEIGHT = 1 << 20  # ... and for matrices large enough to amortise the format conversion


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch._C._nn, "mkldnn_linear")


class OneDNNLinear(nn.Linear):
    """``nn.Linear`` whose forward runs oneDNN's inner product on a packed copy of the weight."""

    def pack(self) -> None:
        self._packed = self.weight.detach().to_mkldnn()
        self._packed_bias = None if self.bias is None else self.bias.detach().to_mkldnn()

    def __deepcopy__(self, memo: dict) -> OneDNNLinear:
        # oneDNN tensors have no storage to copy: copy the dense parameters and pack again
        new = nn.Linear(self.in_features, self.out_features, self.bias is not None, device=self.weight.device)
        new.load_state_dict(self.state_dict())
        new.__class__ = OneDNNLinear
        new.pack()
        memo[id(self)] = new
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        if (x.numel() > MAX_ROWS * self.in_features or x.dtype != torch.float32 or torch.is_grad_enabled()
                or torch.compiler.is_compiling()):  # a compiler plans its own kernels
            return super().forward(x)  # many rows (prefill): MKL's GEMM is already efficient
        y = torch._C._nn.mkldnn_linear(x.reshape(-1, x.shape[-1]).to_mkldnn(), self._packed, self._packed_bias)
        return y.to_dense().view(*lead, self.out_features)


def use_onednn(model: nn.Module) -> int:
    """Turn every ``nn.Linear`` of ``model`` into a packed ``OneDNNLinear`` and pack the fused projections of its
    Gemma stacks (``fusion.py``); returns how many ``nn.Linear`` were converted."""
    if not onednn_available():
        return 0
    for module in model.modules():
        if isinstance(module, GemmaStack) and module.layers[0].mlp.down_proj.weight.dtype == torch.float32 \
                and not module.layers[0].mlp.down_proj.weight.is_cuda:
            fused_stack(module, pack=True)
    n = 0
    for name, module in model.named_modules():
        if name.endswith("lm_head"):
            continue  # tied to the token embedding (logits use the embedding directly)
        w = getattr(module, "weight", None)
        if type(module) is nn.Linear and w.numel() >= MIN_WEIGHT and w.dtype == torch.float32 and not w.is_cuda:
            module.__class__ = OneDNNLinear
            module.pack()
            n += 1
    return n
