"""oneDNN linear: same results as nn.Linear, same parameters, survives deepcopy; packed weights, eager and compiled."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from oxygen_ros.engine.cpu_kernels import MAX_ROWS, OneDNNLinear, onednn_available, use_onednn
from oxygen_ros.engine.packed_linear import PackedWeight, packed_available

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN (mkldnn) support")


def test_onednn_linear_matches_dense() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 1024, bias=False), nn.Linear(8, 8))
    keys = list(model.state_dict())
    ref = copy.deepcopy(model)
    assert use_onednn(model) == 2  # the 8x8 layer is too small to gain
    assert isinstance(model[0], OneDNNLinear) and type(model[2]) is nn.Linear
    assert list(model.state_dict()) == keys
    with torch.no_grad():
        for rows in (1, 2, 7, MAX_ROWS, MAX_ROWS + 1, 200):
            x = torch.randn(rows, 1024)
            assert torch.allclose(model[0](x), ref[0](x), atol=1e-4, rtol=1e-5)
            x3 = torch.randn(2, rows, 1024)
            assert model[1](x3).shape == (2, rows, 1024)
            assert torch.allclose(model[1](x3), ref[1](x3), atol=1e-4, rtol=1e-5)


def test_onednn_linear_deepcopy_and_grad_fallback() -> None:
    lin = nn.Linear(1024, 1024)
    use_onednn(lin)
    twin = copy.deepcopy(lin)
    x = torch.randn(3, 1024)
    with torch.no_grad():
        assert torch.equal(twin(x), lin(x))
    y = lin(x.requires_grad_())  # training path: plain autograd linear
    y.sum().backward()
    assert lin.weight.grad is not None


@pytest.mark.skipif(not packed_available(), reason="this torch build has no oneDNN reordered-weight linear")
@pytest.mark.parametrize("bias", [True, False])
def test_packed_weight_matches_linear_eager_and_compiled(bias: bool) -> None:
    torch.manual_seed(1)
    lin = nn.Linear(96, 80, bias=bias)
    pw = PackedWeight(lin.weight, lin.bias)
    torch._dynamo.reset()  # one compiled variant per input shape: start from none
    compiled = torch.compile(lambda x: torch.nn.functional.gelu(pw(x)), fullgraph=True, dynamic=False)
    with torch.no_grad():
        for shape in ((1, 96), (2, 96), (7, 96), (3, 5, 96), (1, 1, 96)):
            x = torch.randn(shape)
            assert pw(x).shape == (*shape[:-1], 80)
            assert torch.allclose(pw(x), lin(x), atol=1e-5, rtol=1e-5)
            # the compiled graph calls the packed kernel through the opaque operator, same numbers
            assert torch.allclose(compiled(x), torch.nn.functional.gelu(lin(x)), atol=1e-5, rtol=1e-5)
        with torch.profiler.profile() as prof:
            compiled(torch.randn(7, 96))
    assert "mkldnn::_linear_pointwise" in {e.key for e in prof.key_averages()}, "the compiler planned its own GEMM"


@pytest.mark.skipif(not packed_available(), reason="this torch build has no oneDNN reordered-weight linear")
def test_packed_operator_refuses_released_weights() -> None:
    pw = PackedWeight(torch.randn(8, 4))
    key = pw.key
    assert torch.ops.oxygen.packed_linear(torch.ones(2, 4), key).shape == (2, 8)
    del pw
    with pytest.raises(RuntimeError, match="no longer exist"):
        torch.ops.oxygen.packed_linear(torch.ones(2, 4), key)
