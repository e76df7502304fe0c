"""Steps compiled ahead of time (``graphs='aot'``: engine/backends/aot_steps.py, compiled_store.py) against the
eager reference.

The packages are built once into a module-scoped cache directory (about a minute of AOTInductor compiling on this
CPU) and every later engine loads them: in every engine mode, with an extra action head (the same package bound to
other weights), a LoRA adapter (its rows stay eager) and real-time chunking (the guided denoise). A corrupt package
is rebuilt with a warning; an entry of another model size, torch version or thread count is never loaded."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_heads_and_lora, make_model, make_observation

from oxygen_ros.engine import ENGINE_MODES, Pi05Model, get_config
from oxygen_ros.engine.backends.aot_steps import export_step, step_key
from oxygen_ros.engine.backends.compiled_store import CompiledStore, full_key
from oxygen_ros.engine.backends.graphs import FrameGraphs
from oxygen_ros.engine.backends.step_weights import StepWeights
from oxygen_ros.engine.config import GemmaConfig
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.kv_cache import KVCache
from oxygen_ros.engine.requests import Frame, LanguageRequest
from oxygen_ros.engine.rtc import RTCConfig, RTCPrefix

ATOL = 1e-5


@pytest.fixture(scope="module")
def model() -> Pi05Model:
    """Greedy text that varies token to token (std 0.3); actions are compared on ``smooth`` (test_graphs.py)."""
    return make_model(seed=5, std=0.3)


@pytest.fixture(scope="module")
def smooth() -> Pi05Model:
    return make_model(seed=0, std=0.1)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("compiled")


def _frames(cfg, count: int) -> list[Frame]:
    out = []
    for f in range(count):
        reqs = [LanguageRequest("memory", 6, [17, 23]), LanguageRequest("narration", 5 + f % 3)] if f % 3 != 2 else []
        if f % 2:
            reqs.append(LanguageRequest("subtask", 4, [9], adapter="a"))
        noise = [torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(s))
                 for s in (f, 100 + f)]
        rem = np.random.default_rng(f).normal(size=(cfg.action_horizon - 2, 5)).astype(np.float32)
        out.append(Frame(make_observation(cfg, prompt_lens=[8 + f % 4], seed=f), reqs, noise, stamp=f,
                         rtc=RTCPrefix(rem, 2) if f else None))
    return out


def _run(model: Pi05Model, frames: list[Frame], graphs: str, cache_dir: Path, mode: str = "oxygen"):
    heads, lora = make_heads_and_lora(model)
    config = EngineConfig(k=8, eos_id=-1, max_new_tokens=8, max_inflight=1, mode=mode, graphs=graphs,
                          graph_stages="all", rtc=RTCConfig(), compile_cache_dir=str(cache_dir))
    eng = build_engine(model, config, heads=heads, adapters={"a": lora})
    results = [eng.step(fr) for fr in frames]
    close = getattr(eng, "close", None)
    if close:
        close()
    toks = sorted((f.request_id, f.frame_index, tuple(f.tokens)) for r in results for f in r.finished)
    workers = [eng.action_worker, eng.language_worker] if mode == "parallel" else [eng]
    reports = [step for w in workers for step in (w.runner.graphs.load_report if w.runner.graphs else [])]
    return [r.actions for r in results], toks, reports


def _assert_equal(got, ref, actions: bool) -> None:
    (act_a, tok_a, _), (act_e, tok_e, _) = got, ref
    assert tok_a == tok_e and len(tok_a) >= 3  # k=8: an admitted request finishes in its frame
    if actions:
        for a, b in zip(act_a, act_e, strict=True):
            assert len(a) == 2 and all((x - y).abs().max() <= ATOL for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("mode", ENGINE_MODES)
def test_loaded_steps_equal_eager_in_every_mode(model: Pi05Model, smooth: Pi05Model, cache_dir: Path,
                                                mode: str) -> None:
    fl = _frames(model.config, 5)
    for m in (model, smooth):
        got, ref = _run(m, fl, "aot", cache_dir, mode), _run(m, fl, "off", cache_dir, mode)
        _assert_equal(got, ref, actions=m is smooth)
        names = {r["step"] for r in got[2]}
        assert {"prefill", "denoise", "denoise_rtc", "decode1"} <= names
        if m is smooth:  # the second model of the same size: every step comes from the cache, bound to its weights
            assert all(r["how"] == "loaded" for r in got[2]), got[2]


def test_a_corrupt_entry_is_rebuilt_with_a_warning(smooth: Pi05Model, cache_dir: Path, caplog) -> None:
    fl = _frames(smooth.config, 4)
    first = _run(smooth, fl, "aot", cache_dir)  # builds what the mode tests did not (or loads it)
    victim = Path(next(r["path"] for r in first[2] if r["step"] == "decode1"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = b"\0" * 64
    victim.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="oxygen_ros.engine.backends.compiled_store"):
        again = _run(smooth, fl, "aot", cache_dir)
    assert any("checksum mismatch" in r.getMessage() and "rebuilding" in r.getMessage() for r in caplog.records)
    how = {r["step"]: r["how"] for r in again[2]}
    assert how["decode1"] == "built" and how["prefill"] == how["denoise"] == "loaded"
    _assert_equal(again, _run(smooth, fl, "off", cache_dir), actions=True)


def _keys(model: Pi05Model) -> dict[str, dict]:
    cache = KVCache.for_model(model.config, 2, 24)
    fg = FrameGraphs(model, cache, [model.head_parts()], 10, "aot")
    base = {"config": model.config.to_dict(), "dtype": str(model.dtype)}
    return {run.name: step_key({**base, **run.spec}, run.weights, run.args, {}) for run in fg.steps()}


def test_another_model_size_torch_version_or_thread_count_never_loads_an_entry(monkeypatch, tmp_path) -> None:
    tiny = make_model()
    keys = _keys(tiny)
    wider = make_model(get_config("tiny").replace(expert=GemmaConfig(48, 2, 64, num_heads=4, num_kv_heads=1,
                                                                      head_dim=16)))
    store = CompiledStore(tmp_path)
    for other in (_keys(wider),):
        assert other["denoise"] != keys["denoise"]
        assert store.paths("denoise", other["denoise"]) != store.paths("denoise", keys["denoise"])
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert _keys(tiny)["prefill"]["torch"] == "0.0.0" and _keys(tiny)["prefill"] != keys["prefill"]
    monkeypatch.undo()
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert _keys(tiny)["decode1"] != keys["decode1"]
    finally:
        torch.set_num_threads(threads)
    assert _keys(tiny) == keys  # the same model and settings: the same entries


def test_the_store_rebuilds_stale_unreadable_or_unloadable_entries(tmp_path: Path, caplog) -> None:
    """The store's rules on real files (a step's build is a file write here; the engine tests compile real ones)."""
    store = CompiledStore(tmp_path)
    key = full_key({"step": "toy", "n": 1})
    builds: list[Path] = []

    def build(path: Path) -> None:
        builds.append(path)
        path.write_bytes(b"package %d" % len(builds))

    def load(path: Path) -> bytes:
        data = path.read_bytes()
        if data.startswith(b"bad"):
            raise RuntimeError("not a package")
        return data

    assert store.get("toy", key, build, load).how == "built" and store.get("toy", key, build, load).how == "loaded"
    package, manifest = store.paths("toy", key)
    meta = json.loads(manifest.read_text())
    meta["key"]["torch"] = "0.0.0"  # an entry some other torch wrote at this name
    manifest.write_text(json.dumps(meta))
    assert store.check("toy", key).startswith("stale key (differs in torch)")
    with caplog.at_level(logging.WARNING, logger="oxygen_ros.engine.backends.compiled_store"):
        assert store.get("toy", key, build, load).how == "built"
        manifest.write_text("{")
        assert store.get("toy", key, build, load).how == "built"
        package.write_bytes(b"bad")
        meta = json.loads(manifest.read_text())
        meta["sha256"] = hashlib.sha256(b"bad").hexdigest()  # intact bytes, yet it fails to load
        manifest.write_text(json.dumps(meta))
        entry = store.get("toy", key, build, load)
    assert entry.how == "built" and entry.value == b"package 4"
    reasons = " | ".join(r.getMessage() for r in caplog.records)
    assert "stale key" in reasons and "unreadable manifest" in reasons and "load failed" in reasons
    assert store.check("toy", key) is None and not list(tmp_path.glob(".*"))  # no temporary files left behind


def test_a_step_that_reads_an_unlisted_tensor_is_not_exported() -> None:
    """A weight reached other than through the step's StepWeights would be baked into the package: refused."""
    m = make_model()
    stray = torch.randn(4)
    weights = StepWeights({"action_in_proj": m.action_in_proj}, [])
    export_step(lambda x: m.action_in_proj(x), weights, [torch.zeros(1, 8)])  # reads only its weights: fine
    with pytest.raises(RuntimeError, match="neither its weights nor its arguments"):
        export_step(lambda x: m.action_in_proj(x)[..., :4] + stray, weights, [torch.zeros(1, 8)])


def test_oxygen_compile_builds_what_the_engine_loads(smooth: Pi05Model, cache_dir: Path, capsys) -> None:
    """``oxygen-compile --config tiny`` with the engine's settings: its entries are the ones an engine of that size
    loads (built here when this test runs alone, loaded when the mode tests built them)."""
    from oxygen_ros.tools.compile import main

    argv = ["--config", "tiny", "--cache-dir", str(cache_dir), "--max-inflight", "1", "--max-new-tokens", "8",
            "--max-prompt-tokens", "16", "--rtc"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {s["step"] for s in summary["steps"]} == {"decode1", "decode2", "prefill", "denoise", "denoise_rtc"}
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert all(s["how"] == "loaded" for s in again["steps"]) and again["seconds"] < 30
    report = _run(smooth, _frames(smooth.config, 2), "aot", cache_dir)[2]
    assert {r["path"] for r in report} <= {s["path"] for s in summary["steps"]}
    assert all(r["how"] == "loaded" for r in report)


def test_auto_on_cpu_loads_compiled_steps_only_when_the_cache_holds_them(smooth: Pi05Model, cache_dir: Path,
                                                                        tmp_path: Path) -> None:
    """``graphs: auto`` on CPU: the steps of ``oxygen-compile`` / an earlier ``aot`` engine when every one is in the
    cache (loaded, never built), else eager; the same actions and tokens either way."""
    from oxygen_ros.tools.compile import main

    assert main(["--config", "tiny", "--cache-dir", str(cache_dir), "--max-inflight", "1", "--max-new-tokens", "8",
                 "--max-prompt-tokens", "16", "--rtc"]) == 0  # (loaded when the tests above built them)
    frames = _frames(smooth.config, 5)
    cached = _run(smooth, frames, "auto", cache_dir)
    assert cached[2] and all(r["how"] == "loaded" for r in cached[2])
    empty = _run(smooth, frames, "auto", tmp_path)
    assert empty[2] == [] and not list(tmp_path.glob("*.pt2"))  # eager: nothing built
    _assert_equal(cached, empty, actions=True)
