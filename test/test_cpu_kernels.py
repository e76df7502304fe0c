"""oneDNN linear: same results as nn.Linear, same parameters, survives deepcopy."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from oxygen_ros.engine.cpu_kernels import MAX_ROWS, OneDNNLinear, onednn_available, use_onednn

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
