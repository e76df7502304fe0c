"""oneDNN linear: same results as nn.Linear, same parameters, survives deepcopy; packed weights, eager and compiled."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from oxygen_ros.engine.backends.cpu_kernels import MAX_ROWS, OneDNNLinear, onednn_available, use_onednn
from oxygen_ros.engine.backends.fusion import fused_stack
from oxygen_ros.engine.backends.packed_linear import PackedWeight, packed_available

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
def test_bfloat16_packing_is_offered_only_where_this_cpu_runs_it() -> None:
    """An AVX2-only CPU refuses to reorder a bfloat16 weight: packed_available says so, and the engine's kernels
    stay plain there instead of failing at load."""
    w, x = torch.randn(32, 16).to(torch.bfloat16), torch.randn(4, 16).to(torch.bfloat16)
    if packed_available(torch.bfloat16):
        torch.testing.assert_close(PackedWeight(w)(x), torch.nn.functional.linear(x, w), atol=2e-2, rtol=2e-2)
    else:
        with pytest.raises(RuntimeError):
            PackedWeight(w)(x)


@pytest.mark.skipif(not packed_available(), reason="this torch build has no oneDNN reordered-weight linear")
def test_packed_operator_refuses_released_weights() -> None:
    pw = PackedWeight(torch.randn(8, 4))
    key = pw.key
    assert torch.ops.oxygen.packed_linear(torch.ones(2, 4), key).shape == (2, 8)
    del pw
    with pytest.raises(RuntimeError, match="no longer exist"):
        torch.ops.oxygen.packed_linear(torch.ones(2, 4), key)


@pytest.mark.skipif(not packed_available(), reason="this torch build has no oneDNN reordered-weight linear")
def test_kernel_choice_is_measured_stored_and_applied_per_stage(tmp_path, monkeypatch) -> None:
    """``kernels: auto`` times each stage both ways, keeps packed weights only where they are faster, stores the
    verdict under a key of sizes, threads and torch, reads it back, and measures again for another key or a
    corrupt file; the stacks' projections then follow it per row class."""
    from conftest import make_model

    from oxygen_ros.engine.backends import kernel_choice
    from oxygen_ros.engine.backends.fusion import FEW_ROWS

    model = make_model()
    heads = [model.head_parts()]
    first = kernel_choice.choose(model, heads, 10, "auto", tmp_path)
    assert first.source == "measured" and [t.stage for t in first.timings] == ["prefill", "decode", "denoise"]
    rows = {t.stage: t.rows for t in first.timings}  # each stage timed at the row class its choice decides
    assert rows["decode"] == kernel_choice.DECODE_ROWS and rows["denoise"] == model.config.action_horizon, rows
    assert rows["prefill"] > 10, rows  # the 10 prompt tokens asked for and the images' tokens
    for t in first.timings:
        assert t.packed == (t.ratio <= kernel_choice.MARGIN)
    assert (first.prefill, first.decode, first.denoise) == tuple(t.packed for t in first.timings)
    bb = fused_stack(model.backbone).qkv[0].policy
    ex = fused_stack(model.expert).down[3 % len(model.expert.layers)].policy
    assert (bb.few, bb.many, ex.few, ex.many) == (first.decode, first.prefill, first.denoise, first.denoise)
    stored = list(tmp_path.glob("kernels-*.json"))
    assert len(stored) == 1
    again = kernel_choice.choose(model, heads, 10, "auto", tmp_path)
    assert again.source == "cached" and (again.prefill, again.decode, again.denoise) == (
        first.prefill, first.decode, first.denoise)
    stored[0].write_text("{not json")
    assert kernel_choice.choose(model, heads, 10, "auto", tmp_path).source == "measured"
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)  # another key: measured, stored beside
    assert kernel_choice.choose(model, heads, 10, "auto", tmp_path).source == "measured"
    assert len(list(tmp_path.glob("kernels-*.json"))) == 2
    monkeypatch.undo()

    # a forced choice, and the row classes: packed only for the class asked
    kernel_choice.choose(model, heads, 10, "packed", tmp_path)
    pw = fused_stack(model.backbone).qkv[0]
    pw.policy.few, pw.policy.many = True, False
    calls = []
    original = type(pw._packed).apply
    monkeypatch.setattr(type(pw._packed), "apply", lambda self, x: calls.append(x.shape[0]) or original(self, x))
    with torch.no_grad():
        ref = torch.nn.functional.linear(torch.ones(FEW_ROWS + 1, pw.weight.shape[1]), pw.weight, pw.bias)
        assert torch.allclose(pw(torch.ones(FEW_ROWS + 1, pw.weight.shape[1])), ref)
        assert torch.allclose(pw(torch.ones(3, pw.weight.shape[1])), ref[:3], atol=1e-5)
    assert calls == [3]
    plain = kernel_choice.choose(model, heads, 10, "plain", tmp_path)
    assert plain.source == "plain" and fused_stack(model.backbone).packed == (False, False)


@pytest.mark.skipif(not packed_available(), reason="this torch build has no oneDNN reordered-weight linear")
def test_engine_kernels_setting_gives_the_same_actions_and_tokens(tmp_path) -> None:
    """Every ``EngineConfig.kernels`` runs the same frames to the same actions (1e-5) and tokens."""
    from conftest import make_model, make_observation

    from oxygen_ros.engine.engine import EngineConfig, build_engine
    from oxygen_ros.engine.requests import Frame, LanguageRequest

    out = {}
    for how in ("plain", "packed", "auto"):
        model = make_model(seed=5, std=0.3)
        eng = build_engine(model, EngineConfig(k=3, eos_id=-1, max_new_tokens=6, kernels=how,
                                               compile_cache_dir=str(tmp_path)))
        assert eng.runner.kernels.source in (how, "measured", "cached")
        frames = [Frame(make_observation(model.config, prompt_lens=[9], seed=f),
                        [LanguageRequest("narration", 5, [5, 7])] if f == 0 else [],
                        torch.randn(1, model.config.action_horizon, model.config.action_dim,
                                    generator=torch.Generator().manual_seed(f)), stamp=f) for f in range(3)]
        results = [eng.step(fr) for fr in frames]
        out[how] = ([r.actions[0] for r in results], [tuple(f.tokens) for r in results for f in r.finished])
    for how in ("packed", "auto"):
        assert out[how][1] == out["plain"][1] and len(out["plain"][1]) == 1
        assert all((a - b).abs().max() <= 1e-5 for a, b in zip(out[how][0], out["plain"][0], strict=True))


@pytest.mark.skipif(not packed_available(torch.bfloat16),
                    reason="this CPU has no oneDNN bfloat16 linear (needs AVX512-BW/VL/DQ or AVX-NE-CONVERT)")
def test_islands_keep_packed_weights_only_where_bit_identical(tmp_path, monkeypatch) -> None:
    """Under openpi's roundings (``bfloat16_islands``) ``kernels: auto`` checks each stage's packed output against
    the plain one bit for bit, and the engine's actions stay the eager islands reference's exactly, whatever it keeps.
    A packed kernel that is one ulp off anywhere is refused for that stage (plain kept, said in the summary)."""
    from conftest import make_model, make_observation

    from oxygen_ros.engine.backends import kernel_choice
    from oxygen_ros.engine.backends.precision import apply_precision
    from oxygen_ros.engine.engine import EngineConfig, build_engine
    from oxygen_ros.engine.requests import Frame

    model = apply_precision(make_model(seed=5, std=0.3), "bfloat16_islands")
    obs = make_observation(model.config, prompt_lens=[9], seed=0).to(model.device, model.input_dtype)
    noise = torch.randn(1, model.config.action_horizon, model.config.action_dim,
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model.with_stages("eager").sample_actions(obs, noise.clone())[0]
    engine = build_engine(model, EngineConfig(max_inflight=1, max_new_tokens=4, compile_cache_dir=str(tmp_path)))
    choice = engine.runner.kernels
    assert choice.source == "measured" and all(t.identical is not None for t in choice.timings)
    assert all(t.packed == (t.ratio <= kernel_choice.MARGIN and t.identical) for t in choice.timings)
    assert torch.equal(engine.step(Frame(obs, [], [noise.clone()])).actions[0], reference.float())

    original = PackedWeight.apply  # one ulp up on every packed call: never bit-identical
    monkeypatch.setattr(PackedWeight, "apply", lambda self, x: torch.nextafter(original(self, x), torch.tensor(
        float("inf"), dtype=x.dtype)))
    refused = kernel_choice.choose(model, [model.head_parts()], 10, "auto", tmp_path / "other")
    assert [t.identical for t in refused.timings] == [False, False, False]
    assert (refused.prefill, refused.decode, refused.denoise) == (False, False, False)
    assert "NOT bit-identical: plain kept" in refused.summary()
    monkeypatch.undo()
    fp32 = kernel_choice.choose(make_model(), [make_model().head_parts()], 10, "auto", tmp_path / "fp32")
    assert all(t.identical is None for t in fp32.timings)  # float32: speed decides, no bit check
