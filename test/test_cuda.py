"""The CUDA path on a GPU (marker ``cuda``; ``scripts/gpu_bench.sh`` runs these first): captured CUDA graphs against
the eager engine in every mode, real-time chunking as a captured step, ``bfloat16_islands`` on the device.

What "equal" means on a GPU (docs/gpu.md): captured and eager steps run other GEMM shapes (fused Q/K/V and gate/up,
query heads folded per KV head, a decode over the whole bucket), so cuBLAS may pick other tilings and split-K:
results are held to a stated tolerance, not to bit-identity. float32 with TF32 off: greedy tokens equal and actions
within ``FP32_ATOL``; bf16 islands: actions within ``BF16_REL`` relative (||a - b|| / ||b||) of eager and of the CPU
float32 reference, tokens' agreement recorded. Every measured difference is appended to ``$OXYGEN_CUDA_REPORT``
(JSON lines) when set.

Without CUDA these skip, unless ``OXYGEN_CUDA_REHEARSAL=1``: then they run on the CPU with the ``static`` backend
(the code captured on a GPU, run eagerly), which is how ``test_gpu_bench.py`` rehearses the GPU script.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
from conftest import make_model, make_observation
from test_graphs import _frames, _run
from test_rtc_engine import _frames as _rtc_frames

from oxygen_ros.engine import ENGINE_MODES
from oxygen_ros.engine.backends.precision import CUDA_MATH, apply_cuda_math, apply_precision, cuda_math_state
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.rtc import RTCConfig

CUDA = torch.cuda.is_available()
REHEARSAL = not CUDA and os.environ.get("OXYGEN_CUDA_REHEARSAL") == "1"
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not (CUDA or REHEARSAL), reason="needs CUDA (OXYGEN_CUDA_REHEARSAL=1: on the CPU)")]
DEVICE = torch.device("cuda" if CUDA else "cpu")
BACKEND = "cuda" if CUDA else "static"
FP32_ATOL = 1e-4  # float32, TF32 off, other GEMM shapes: summation order only
BF16_REL = 2e-2  # bf16 operands: 1e-3 .. 1e-2 expected (docs/gpu.md), twice the top as the bound


def report(test: str, **values) -> None:
    """One JSON line per measurement into $OXYGEN_CUDA_REPORT (the GPU script's cuda_tests.jsonl)."""
    path = os.environ.get("OXYGEN_CUDA_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": test, "device": str(DEVICE), "backend": BACKEND, "time": time.time(),
                                **values}) + "\n")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.fixture(autouse=True)
def _ieee_fp32():
    """float32 tests run IEEE float32 (no TF32), whatever an earlier cast set; restored after."""
    before = cuda_math_state()
    apply_cuda_math("float32")
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before["matmul_tf32"], before["cudnn_tf32"]


def _heads_and_lora_on(device: torch.device):
    """test_graphs' extra head and LoRA adapter, moved to ``device`` (they are made on the CPU)."""
    import test_graphs

    from oxygen_ros.engine.lora import LoraAdapter

    made = test_graphs.make_heads_and_lora

    def on_device(model, *args, **kwargs):
        heads, lora = made(model, *args, **kwargs)
        moved = {key: (a.to(device), b.to(device)) for key, (a, b) in lora.weights.items()}
        return heads.to(device), LoraAdapter(moved, lora.scale, lora.name)

    return on_device


@pytest.mark.parametrize("mode", ENGINE_MODES)
def test_captured_steps_equal_eager_in_every_mode(mode: str, monkeypatch) -> None:
    import test_graphs

    monkeypatch.setattr(test_graphs, "make_heads_and_lora", _heads_and_lora_on(DEVICE))
    fl = _frames(make_model().config, 7)
    rough, smooth = make_model(seed=5, std=0.3).to(DEVICE), make_model(seed=0, std=0.1).to(DEVICE)
    for name, m in (("rough", rough), ("smooth", smooth)):
        (act_g, tok_g, eng), (act_e, tok_e, _) = (_run(m, fl, g, mode=mode) for g in (BACKEND, "off"))
        workers = [eng.action_worker, eng.language_worker] if mode == "parallel" else [eng]
        assert all(w.runner.graphs is not None and w.runner.graphs.backend == BACKEND for w in workers)
        diff = max(float((x - y).abs().max()) for a, b in zip(act_g, act_e, strict=True)
                   for x, y in zip(a, b, strict=True))
        report("captured_vs_eager", mode=mode, model=name, dtype="float32", tokens_equal=tok_g == tok_e,
               requests=len(tok_e), actions_max_abs=diff)
        assert tok_g == tok_e and len(tok_g) >= 8
        if name == "smooth":
            assert diff <= FP32_ATOL


def test_rtc_runs_as_a_captured_step() -> None:
    model = make_model(seed=0, std=0.1).to(DEVICE)
    frames = _rtc_frames(model.config, 6)
    rtc = RTCConfig()
    got, calls = {}, []
    for g in (BACKEND, "off"):
        eng = build_engine(model, EngineConfig(k=2, eos_id=-1, max_new_tokens=8, max_inflight=6, graph_stages="all",
                                               graphs=g, rtc=rtc))
        if g != "off":
            fg = eng.runner.graphs
            assert fg._denoise_rtc is not None  # identity guidance has its own captured step
            plain = fg.denoise
            fg.denoise = lambda prefix, noises, guide=None, plain=plain: (calls.append(guide is not None)
                                                                          or plain(prefix, noises, guide))
        got[g] = [eng.step(fr) for fr in frames]
    assert sum(calls) == len(frames) - 1  # every frame with a remainder ran the guided captured step
    diffs = [float((x - y).abs().max()) for a, b in zip(got[BACKEND], got["off"], strict=True)
             for x, y in zip(a.actions, b.actions, strict=True)]
    guided = [r.guided for r in got[BACKEND]]
    report("rtc_captured", dtype="float32", actions_max_abs=max(diffs), guided_frames=sum(guided))
    assert guided == [r.guided for r in got["off"]] and sum(guided) == len(frames) - 1
    assert max(diffs) <= FP32_ATOL


def test_bfloat16_islands_on_the_device() -> None:
    """openpi's islands on the device: the flags openpi runs with, the float32 islands kept, actions within the bf16
    tolerance of the float32 CPU reference (eager) and captured within it of eager on the device."""
    ref_model = make_model(seed=0, std=0.1)
    cfg = ref_model.config
    obs = make_observation(cfg, prompt_lens=[9], seed=3)
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(4))
    from oxygen_ros.engine.requests import Frame, LanguageRequest

    frames = [Frame(obs, [LanguageRequest("memory", 5, [17])], noise, stamp=0)]
    ref = build_engine(ref_model, EngineConfig(graphs="off", eos_id=-1, kernels="keep")).step(frames[0]).actions[0]
    island = apply_precision(make_model(seed=0, std=0.1), "bfloat16_islands").to(DEVICE)
    assert cuda_math_state() == CUDA_MATH["bfloat16_islands"]  # openpi's "high" matmul precision: TF32
    assert island.action_in_proj.weight.dtype == torch.float32 and island.dtype == torch.bfloat16
    out = {}
    for g in ("off", BACKEND):
        eng = build_engine(island, EngineConfig(graphs=g, eos_id=-1, kernels="keep", graph_stages="all"))
        res = eng.step(frames[0])
        out[g] = res.actions[0]
    rel_ref, rel_cap = _rel(out["off"], ref), _rel(out[BACKEND], out["off"])
    report("islands", eager_vs_fp32_cpu_rel=rel_ref, captured_vs_eager_rel=rel_cap,
           cuda_math=cuda_math_state(), bitwise_captured_eager=bool(torch.equal(out[BACKEND], out["off"])))
    assert rel_ref <= BF16_REL and rel_cap <= BF16_REL


@pytest.mark.skipif(not CUDA or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_gpu_captures_and_times_on_its_own_device() -> None:
    """cuda:1 while the thread's current device stays cuda:0: the captured graph computes (not empty)."""
    model = make_model(seed=0, std=0.1).to("cuda:1")
    fl = _frames(model.config, 3, adapted=False)
    act_g, tok_g, _ = _run(model, fl, "cuda")
    act_e, tok_e, _ = _run(model, fl, "off")
    assert torch.cuda.current_device() == 0 and tok_g == tok_e
    assert all((x - y).abs().max() <= FP32_ATOL for a, b in zip(act_g, act_e, strict=True)
               for x, y in zip(a, b, strict=True))
