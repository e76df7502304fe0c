"""The CUDA path's review findings (issue 41), checked on the CPU: the engine's device (not the thread's current one)
is synchronised and captured on, every captured step of an engine shares one graph memory pool, each precision
policy sets and logs the TF32 flags, ``k_auto`` prices a decode step by the bucket a static step runs, a forward's
host inputs are one contiguous (pinnable) block, the fp32 model is cast before it is moved, and host-only stages do
not synchronise. What needs a GPU runs in test/test_cuda.py (``scripts/gpu_bench.sh`` runs it first)."""

from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace

import pytest
import torch
from conftest import make_model, make_observation

from oxygen_ros.engine import timing
from oxygen_ros.engine.backends import graphs as graphs_mod
from oxygen_ros.engine.backends.graphs import FrameGraphs
from oxygen_ros.engine.backends.precision import (
    CUDA_MATH,
    PRECISIONS,
    apply_cuda_math,
    apply_precision,
    cuda_math_state,
)
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.requests import Frame, LanguageRequest


class FakeCuda:
    """Records what ``torch.cuda`` is asked for; runs captures eagerly (CPU tensors stand for device ones)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.pools: list[object] = []

    def synchronize(self, device=None) -> None:
        self.calls.append(("synchronize", device))

    def device(self, dev):
        self.calls.append(("device", dev))
        return contextlib.nullcontext()

    def current_stream(self, device=None):
        self.calls.append(("current_stream", device))
        return SimpleNamespace(wait_stream=lambda s: None)

    def Stream(self, device=None):  # noqa: N802 (torch's name)
        self.calls.append(("Stream", device))
        return SimpleNamespace(wait_stream=lambda s: None)

    def stream(self, s):
        return contextlib.nullcontext()

    def graph_pool_handle(self):
        handle = object()
        self.pools.append(handle)
        return handle

    def CUDAGraph(self):  # noqa: N802
        return SimpleNamespace(replay=lambda: None)

    def graph(self, g, pool=None, capture_error_mode="global"):
        self.calls.append(("graph", pool))
        return contextlib.nullcontext()


@pytest.fixture()
def fake_cuda(monkeypatch) -> FakeCuda:
    fake = FakeCuda()
    for name in ("synchronize", "device", "current_stream", "Stream", "stream", "graph_pool_handle", "CUDAGraph",
                 "graph"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    return fake


def test_syncs_name_the_engines_device(fake_cuda: FakeCuda) -> None:
    """cuda:1 is synchronised as cuda:1, not as the thread's current device (which nothing sets)."""
    timing.synchronize("cuda:1")
    sw = timing.Stopwatch("cuda:1")
    with sw("decode"):
        pass
    with sw("manager", sync=False):  # a host-only stage: no device-wide sync
        pass
    assert fake_cuda.calls == [("synchronize", torch.device("cuda:1"))] * 3
    assert set(sw.times) == {"decode", "manager"}


def test_capture_runs_on_the_steps_device_and_shares_one_pool(fake_cuda: FakeCuda) -> None:
    """Every step is captured under its tensors' device, its side stream made on that device, and all steps of one
    FrameGraphs capture into one memory pool (not a pool per decode bucket)."""
    model = make_model()
    cache = build_engine(model, EngineConfig(graphs="static", max_inflight=5, kernels="keep")).runner.cache
    fg = FrameGraphs(model, cache, [model.head_parts()], model.config.num_steps, "static")
    steps = fg.steps()
    for st in steps:
        st.backend = "cuda"  # the capture path, with the fake torch.cuda
        st()
    devs = {c[1] for c in fake_cuda.calls if c[0] in ("device", "Stream", "current_stream")}
    assert devs == {torch.device("cpu")}  # the tensors' device (cuda:N on a GPU), passed explicitly every time
    pools = [c[1] for c in fake_cuda.calls if c[0] == "graph"]
    assert len(pools) == len(steps) >= 5 and len(fake_cuda.pools) == 1 and set(pools) == {fake_cuda.pools[0]}


@pytest.mark.parametrize("precision", sorted(PRECISIONS))
def test_precision_sets_and_logs_the_tf32_flags(precision: str, caplog) -> None:
    before = cuda_math_state()
    try:
        for start in (True, False):  # whatever they were before
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = start
            with caplog.at_level(logging.INFO, logger="oxygen_ros.engine.backends.precision"):
                model = apply_precision(make_model(), precision)
            assert cuda_math_state() == CUDA_MATH[precision] == model.cuda_math
            on = CUDA_MATH[precision]["matmul_tf32"]
            assert f"precision {precision}: CUDA TF32 matmul {'on' if on else 'off'}" in caplog.text
    finally:
        apply_cuda_math("float32")
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = (before["matmul_tf32"],
                                                                                  before["cudnn_tf32"])
    # openpi sets matmul precision "high" (TF32); float32 is IEEE throughout; LeRobot eager keeps torch's defaults
    assert CUDA_MATH["bfloat16_islands"] == {"matmul_tf32": True, "cudnn_tf32": True}
    assert CUDA_MATH["float32"] == {"matmul_tf32": False, "cudnn_tf32": False}
    assert CUDA_MATH["bfloat16_lerobot"] == {"matmul_tf32": False, "cudnn_tf32": True}


def _states(slots: list[int]) -> list[SimpleNamespace]:
    return [SimpleNamespace(slot=s, done=False, steps=0, frame_steps=0, frames=0, request_id=i,
                            request=SimpleNamespace(total_steps=20, priority=0)) for i, s in enumerate(slots)]


def test_k_auto_prices_a_step_by_the_bucket_the_static_step_runs() -> None:
    """Rows at slots 20-21 run the 32-row static step: k_auto budgets with the 32-row cost, not the 2-row one."""
    model = make_model()
    cfg = EngineConfig(k="auto", deadline_s=1.0, graphs="static", max_inflight=40, kernels="keep",
                       graph_stages="all")
    eng = build_engine(model, cfg)
    sched = eng.scheduler
    assert sched.forward_rows(20, 22) == 32 and sched.forward_rows(0, 2) == 2
    sched.budget.observe(2, 0.001)
    sched.budget.observe(32, 0.050)
    sched.inflight = _states([20, 21])
    sched.begin_frame(0, 0, __import__("time").perf_counter())
    k = sched.frame_budget()
    assert k <= int(1.0 * sched.budget.safety / 0.050) < 20  # priced at 50 ms: 2-row pricing would allow 64
    eager = build_engine(model, EngineConfig(k="auto", deadline_s=1.0, max_inflight=40, kernels="keep"))
    assert eager.scheduler.forward_rows(20, 22) == 2  # eagerly the forward runs the span


def test_decode_inputs_are_one_contiguous_block_and_tokens_match() -> None:
    model = make_model(seed=5, std=0.3)
    cfg = model.config
    eng = build_engine(model, EngineConfig(k=2, eos_id=-1, max_new_tokens=6, max_inflight=6, kernels="keep"))
    seen = []
    orig = eng.runner.run_decode

    def spy(inputs):
        seen.append(inputs.block if inputs.block is not None else None)
        return orig(inputs)

    eng.runner.run_decode = spy
    for f in range(3):
        eng.step(Frame(make_observation(cfg, prompt_lens=[8], seed=f), [LanguageRequest("memory", 5, [3])],
                       stamp=f))
    assert seen and all(b is not None and b.is_contiguous() for b in seen)


def test_fp32_model_is_cast_before_it_is_moved(tmp_path, monkeypatch) -> None:
    """load_policy casts on the host and moves the cast model: every .to(device) sees bf16 weights already."""
    from oxygen_ros.engine.model import Pi05Model
    from oxygen_ros.policy import load_policy
    from oxygen_ros.policy.synthetic import make_random_checkpoint

    path = make_random_checkpoint(tmp_path, "tiny", None, tokenizer=True)
    moves = []
    orig = Pi05Model.to

    def to(self, *args, **kwargs):
        target = kwargs.get("device", args[0] if args else None)
        if isinstance(target, str | torch.device):
            moves.append(next(p for n, p in self.named_parameters() if "q_proj" in n or "qkv" in n).dtype)
        return orig(self, *args, **kwargs)

    monkeypatch.setattr(Pi05Model, "to", to)
    load_policy(path, generated=True, precision="bfloat16_islands", device="cpu")
    assert moves and all(d == torch.bfloat16 for d in moves)
    moves.clear()
    load_policy(path, generated=True, dtype=torch.bfloat16, device="cpu")
    assert moves and all(d == torch.bfloat16 for d in moves)


def test_parallel_language_worker_stream_only_on_cuda() -> None:
    eng = build_engine(make_model(), EngineConfig(mode="parallel", max_inflight=3, kernels="keep"))
    try:
        assert eng.language_stream is None  # CPU: no stream; on CUDA its own (test_cuda.py runs it)
        assert eng.language_worker.device == torch.device("cpu")
    finally:
        eng.close()


def test_decode_buckets_unchanged() -> None:
    assert graphs_mod.decode_buckets(33) == [1, 2, 4, 8, 16, 32, 33]
