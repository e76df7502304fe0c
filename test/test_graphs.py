"""Static shapes and captured graphs (engine/backends/graphs.py) against the eager reference: the padded prefill, the
denoise and the decode steps, in every engine mode with a LoRA adapter (its rows stay eager) and an extra action head,
k=auto, a pool filled and reused over many frames; the static steps trace as one graph each (nothing inside syncs
with the host, so CUDA can capture them); torch.compile of them gives the same tokens. CUDA capture itself runs in
``scripts/gpu_bench.sh`` (no GPU here)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from conftest import make_heads_and_lora, make_model, make_observation

from oxygen_ros.engine import ENGINE_MODES, Pi05Model
from oxygen_ros.engine.backends.cpu_kernels import use_onednn
from oxygen_ros.engine.backends.graphs import FrameGraphs, decode_buckets, resolve_backend
from oxygen_ros.engine.backends.packed_linear import packed_available
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.requests import Frame, LanguageRequest

ATOL = 1e-5


@pytest.fixture(scope="module")
def model() -> Pi05Model:
    """Greedy text varies token to token (std 0.3); the actions' rounding sensitivity is a trained model's (0.1
    would be too; 0.3 makes them chaotic, so actions are compared on ``smooth``)."""
    return make_model(seed=5, std=0.3)


@pytest.fixture(scope="module")
def smooth() -> Pi05Model:
    return make_model(seed=0, std=0.1)


def _noise(cfg, seed: int) -> torch.Tensor:
    return torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(seed))


def _frames(cfg, count: int, adapted: bool = True) -> list[Frame]:
    out = []
    for f in range(count):
        reqs = [LanguageRequest("memory", 6, [17, 23]), LanguageRequest("narration", 5 + f % 3)] if f % 3 != 2 else []
        if adapted and f % 2:
            reqs.append(LanguageRequest("subtask", 4, [9], adapter="a"))
        obs = make_observation(cfg, prompt_lens=[8 + f % 4], seed=f)
        out.append(Frame(obs, reqs, [_noise(cfg, f), _noise(cfg, 100 + f)], stamp=f))
    return out


def _run(model: Pi05Model, frames: list[Frame], graphs: str, stance: str = "default", **cfg):
    heads, lora = make_heads_and_lora(model)
    config = EngineConfig(**{"k": 2, "eos_id": -1, "max_new_tokens": 8, "max_inflight": 6, "kernels": "keep",
                             "graph_stages": "all", **cfg,
                             "graphs": graphs})
    eng = build_engine(model, config, heads=heads, adapters={"a": lora})
    with torch.compiler.set_stance(stance):  # fail_on_recompile: the engine's warm-up compiled every step
        results = [eng.step(fr) for fr in frames]
    close = getattr(eng, "close", None)
    if close:
        close()
    toks = sorted((f.request_id, f.frame_index, tuple(f.tokens)) for r in results for f in r.finished)
    return [r.actions for r in results], toks, eng


@pytest.mark.parametrize("mode", ENGINE_MODES)
def test_static_shapes_equal_eager_in_every_mode(model: Pi05Model, smooth: Pi05Model, mode: str) -> None:
    fl = _frames(model.config, 7)
    for m in (model, smooth):
        (act_s, tok_s, eng), (act_e, tok_e, _) = (_run(m, fl, g, mode=mode) for g in ("static", "off"))
        assert tok_s == tok_e and len(tok_s) >= 8
        if m is smooth:
            for a, b in zip(act_s, act_e, strict=True):
                assert len(a) == 2 and all((x - y).abs().max() <= ATOL for x, y in zip(a, b, strict=True))
        workers = [eng.action_worker, eng.language_worker] if mode == "parallel" else [eng]
        assert all(w.runner.graphs is not None and w.runner.graphs.backend == "static" for w in workers)
        assert eng.graphs_backend == "static"


def test_static_decode_over_a_reused_pool_and_k_auto(model: Pi05Model) -> None:
    """Requests of many lengths fill the pool (rejections included) and free it in every order: rows before the
    active range, idle rows, free slots padded into a bucket; tokens equal eager frame by frame."""
    cfg = model.config
    frames = []
    for f in range(40):
        reqs = [LanguageRequest("memory", 2 + (f * 7) % 9, [17] * (f % 3)) for _ in range(1 + f % 4)]
        frames.append(Frame(make_observation(cfg, prompt_lens=[6 + f % 5], seed=f), reqs, _noise(cfg, f)))
    for k in (1, "auto"):
        extra = {"deadline_s": 0.05} if k == "auto" else {}
        got = {}
        for g in ("static", "off"):
            eng = build_engine(model, EngineConfig(k=k, eos_id=-1, max_new_tokens=10, max_inflight=5, graphs=g,
                                                   graph_stages="all",
                                                   **extra))
            if g == "static":
                eng.runner.graphs.warm_up()  # what a CUDA engine does when built: leaves the pool as it found it
            rs = [eng.step(fr) for fr in frames]
            got[g] = [sorted((f.request_id, f.frame_index, tuple(f.tokens)) for f in r.finished) for r in rs], \
                [r.rejected for r in rs]
        if k == 1:
            assert got["static"] == got["off"]
        else:  # budgets follow measured times, so admissions differ; a frame's requests are alike (same tokens)
            by_frame = {g: {(fi, t) for r in got[g][0] for _, fi, t in r} for g in got}
            frames_s = {fi for fi, _ in by_frame["static"]} & {fi for fi, _ in by_frame["off"]}
            assert len(frames_s) >= 5
            assert {x for x in by_frame["static"] if x[0] in frames_s} == \
                {x for x in by_frame["off"] if x[0] in frames_s}
        assert sum(got["static"][1]) > 0, "the pool filled up"


def test_buckets_and_backends() -> None:
    assert decode_buckets(1) == [1] and decode_buckets(7) == [1, 2, 4, 7] and decode_buckets(33)[-2:] == [32, 33]
    assert resolve_backend("auto", torch.device("cpu")) == "off"
    with pytest.raises(ValueError, match="CUDA"):
        resolve_backend("cuda", torch.device("cpu"))
    with pytest.raises(ValueError, match="graphs must be one of"):
        EngineConfig(graphs="fast").validate()


def test_graph_stages_are_chosen_by_measurement_and_routed(smooth: Pi05Model, monkeypatch) -> None:
    """``graph_stages: auto`` times each action stage's graph step against the fused eager path when the engine is
    built and keeps the graph step only where it is not slower; frames then run each stage where it was kept, with
    the same actions and tokens as all-eager."""
    frames = [Frame(f.observation, f.requests, f.noise[0], stamp=f.stamp)
              for f in _frames(smooth.config, 3, adapted=False)]
    config = EngineConfig(k=2, eos_id=-1, max_new_tokens=8, max_inflight=6)
    ref = _run_on(build_engine(smooth, config), frames)
    assert len(ref[1]) >= 1
    for prefill_on, denoise_on in ((True, False), (False, True)):
        eng = build_engine(smooth, dataclasses.replace(config, graphs="static"))
        runner = eng.runner
        assert [t.stage for t in runner.graph_timings] == ["prefill", "denoise"]
        for t in runner.graph_timings:
            assert t.plain_ms > 0 and t.packed_ms > 0 and runner.graph_stages[t.stage] == (t.ratio <= 1.0)
        assert not runner.cache.valid.any()  # the measurement left the pool empty
        calls = []
        for name in ("prefill", "denoise"):
            original = getattr(runner.graphs, name)
            monkeypatch.setattr(runner.graphs, name,
                                lambda *a, _o=original, _n=name, _c=calls, **k: _c.append(_n) or _o(*a, **k))
        runner.graph_stages = {"prefill": prefill_on, "denoise": denoise_on}
        got = _run_on(eng, frames)
        assert calls == [s for _ in frames for s, on in (("prefill", prefill_on), ("denoise", denoise_on)) if on]
        assert eng.graph_stages == (f"prefill {'static' if prefill_on else 'off'}, "
                                    f"denoise {'static' if denoise_on else 'off'}")
        assert got[1] == ref[1]
        for a, b in zip(got[0], ref[0], strict=True):
            assert all((x - y).abs().max() <= ATOL for x, y in zip(a, b, strict=True))


def _run_on(eng, frames: list[Frame]):
    results = [eng.step(fr) for fr in frames]
    return [r.actions for r in results], sorted(tuple(f.tokens) for r in results for f in r.finished)


@torch.no_grad()
def test_static_steps_trace_as_one_graph_each(smooth: Pi05Model) -> None:
    """fullgraph tracing fails on anything that reads a value back to the host (``.item()``, ``int(t)``,
    data-dependent shapes): none of that may be inside what CUDA captures."""
    eng = build_engine(smooth, EngineConfig(k=2, eos_id=-1, max_new_tokens=6, max_inflight=3, graphs="static"))
    graphs: FrameGraphs = eng.runner.graphs
    eng.step(Frame(make_observation(smooth.config, prompt_lens=[9]), [LanguageRequest("memory", 6)], _noise(
        smooth.config, 0)))
    torch._dynamo.reset()
    for step in (graphs._prefill, graphs._denoise[0], graphs._decode[graphs.buckets[-1]]):
        fn, args = step.fn, step.args
        expect = [t.clone() for t in torch.utils._pytree.tree_leaves(fn(*args))]
        got = torch.utils._pytree.tree_leaves(torch.compile(fn, backend="eager", fullgraph=True)(*args))
        assert len(got) == len(expect) and all(torch.equal(g, e) for g, e in zip(got, expect, strict=True))


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_compiled_steps_give_the_same_tokens_and_actions(smooth: Pi05Model, packed: bool) -> None:
    """Inductor's C++ kernels (a minute or two of compiling here): a 2-slot pool keeps it to buckets 1 and 2. The
    engine compiles every step when built; its frames then never recompile (the eager prefill between them must
    not invalidate a compiled step's guards). ``packed``: the benchmark's oneDNN-packed weights, which a compiled
    step calls through an opaque operator (``packed_linear``); compared with the unpacked model run eagerly."""
    if packed and not packed_available():
        pytest.skip("this torch build has no oneDNN reordered-weight linear")
    fl = _frames(smooth.config, 4, adapted=False)
    compiled = smooth
    if packed:
        compiled = copy.deepcopy(smooth)
        use_onednn(compiled)
    (act_c, tok_c, _), (act_e, tok_e, _) = (_run(m, fl, g, stance, max_inflight=1, k=8) for m, g, stance in
                                            ((compiled, "compile", "fail_on_recompile"), (smooth, "off", "default")))
    assert tok_c == tok_e and len(tok_c) >= 3  # k=8: each admitted request finishes on its frame
    for a, b in zip(act_c, act_e, strict=True):
        assert all((x - y).abs().max() <= ATOL for x, y in zip(a, b, strict=True))


def test_auto_falls_back_to_eager_when_its_steps_fail(smooth: Pi05Model, monkeypatch, caplog) -> None:
    """A default must not stop a node: ``graphs: auto`` whose steps fail to load (or capture) runs eagerly with a
    warning; an explicit backend raises."""
    monkeypatch.setattr(FrameGraphs, "compiled_ready", lambda self: True)

    def broken(self):
        raise RuntimeError("package unloadable")

    monkeypatch.setattr(FrameGraphs, "warm_up", broken)
    with caplog.at_level("WARNING"):
        eng = build_engine(smooth, EngineConfig(max_new_tokens=6, max_inflight=2, graphs="auto"))
    assert eng.runner.graphs is None and eng.graphs_backend == "off"
    assert "running eager" in caplog.text and "package unloadable" in caplog.text
    obs = make_observation(smooth.config, prompt_lens=[9])
    assert eng.step(Frame(obs, [], _noise(smooth.config, 0))).actions[0].shape[-2:] == (
        smooth.config.action_horizon, smooth.config.action_dim)
    with pytest.raises(RuntimeError, match="package unloadable"):
        build_engine(smooth, EngineConfig(max_new_tokens=6, max_inflight=2, graphs="aot"))
