"""The unified-KV-cache engine against its baselines: identical outputs, scheduling invariants, adapters."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import make_model, make_observation

from oxygen_ros.engine import ENGINE_MODES
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.lora import LoraAdapter, random_lora_weights
from oxygen_ros.engine.requests import Frame, LanguageRequest
from oxygen_ros.engine.scheduler import BudgetController
from oxygen_ros.study.heads import make_extra_heads
from oxygen_ros.study.workload import Workload

NO_EOS = -1


@pytest.fixture(scope="module")
def model():
    return make_model(seed=5, std=0.3)


def frames(cfg, schedule, seed=0):
    """Frames with distinct observations and fixed noise for a list of per-frame request lists."""
    out = []
    for f, reqs in enumerate(schedule):
        obs = make_observation(cfg, prompt_lens=[8 + (f % 5)], seed=seed + f)
        noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(f))
        out.append(Frame(obs, reqs, noise, stamp=f))
    return out


def run(model, mode, frame_list, **cfg):
    cfg.setdefault("eos_id", NO_EOS)
    cfg.setdefault("max_new_tokens", 16)
    eng = build_engine(model, EngineConfig(mode=mode, **cfg))
    results = [eng.step(fr) for fr in frame_list]
    finished = {(f.frame_index, i): f for r in results for i, f in enumerate(sorted(r.finished,
                                                                                    key=lambda x: x.request_id))}
    return eng, results, finished


def by_origin(results):
    """Tokens of finished requests per originating frame, in request order."""
    out: dict[int, list] = {}
    for f in sorted((f for r in results for f in r.finished), key=lambda x: x.request_id):
        out.setdefault(f.frame_index, []).append(f.tokens)
    return out


def test_actions_identical_across_engines(model) -> None:
    fl = frames(model.config, Workload(max_new_tokens=5).schedule(4))
    chunks = {}
    for mode in ("isolated", "shared_kv", "parallel", "oxygen"):
        _, results, _ = run(model, mode, fl, k=2)
        chunks[mode] = torch.stack([r.actions[0] for r in results])
    for mode in ("shared_kv", "parallel", "oxygen"):
        assert torch.equal(chunks[mode], chunks["isolated"]), mode
    assert chunks["oxygen"].shape == (4, model.config.action_horizon, model.config.action_dim)


@pytest.mark.parametrize("n,k", [(6, 1), (6, 6), (7, 3), (9, 2), (5, 10)])
def test_tokens_identical_to_isolated(model, n, k) -> None:
    fl = frames(model.config, Workload(max_new_tokens=n).schedule(2 * n + 2))
    _, iso, _ = run(model, "isolated", fl)
    _, oxy, _ = run(model, "oxygen", fl, k=k)
    a, b = by_origin(iso), by_origin(oxy)
    assert b and all(len(t[0]) == n for t in b.values())
    assert all(b[f] == a[f] for f in b), "batched tokens differ from isolated"
    # steady state: ceil(N/k) requests in flight during a frame
    assert max(r.inflight + len(r.finished) for r in oxy) == min(math.ceil(n / k), len(fl))


def test_prompts_bursts_and_random_lengths_match_isolated(model) -> None:
    wl = Workload(kind="random_length", min_tokens=2, max_tokens=9, seed=3).schedule(10)
    for f in (2, 5):  # bursts of several requests on one frame, some with their own prompt tokens
        wl[f] = wl[f] + [LanguageRequest("narration", 4, [17, 23]), LanguageRequest("subtask", 6, [99])]
    fl = frames(model.config, wl, seed=10)
    _, iso, _ = run(model, "isolated", fl)
    _, shared, _ = run(model, "shared_kv", fl)
    _, parallel, _ = run(model, "parallel", fl)
    assert by_origin(parallel) == by_origin(iso)
    assert all("language_prefill" in r.timings for r in parallel if r.finished)
    _, oxy, _ = run(model, "oxygen", fl + frames(model.config, [[]] * 8, seed=50), k=3)
    a = by_origin(iso)
    assert by_origin(shared) == a
    b = by_origin(oxy)
    assert sum(len(v) for v in b.values()) == sum(len(v) for v in a.values())
    assert all(sorted(b[f]) == sorted(a[f]) for f in a)


def test_scheduling_invariants(model) -> None:
    n, k = 7, 3
    fl = frames(model.config, Workload(max_new_tokens=n).schedule(20))
    eng, results, finished = run(model, "oxygen", fl, k=k, max_inflight=8)
    for r in results:
        assert r.decode_steps <= k
        assert r.inflight + len(r.finished) <= math.ceil(n / k)
    done = [f for r in results for f in r.finished]
    assert len(done) == 20 - (math.ceil(n / k) - 1)
    assert all(f.frames == math.ceil(n / k) and len(f.tokens) == n and not f.eos for f in done)
    # every request advanced at most k tokens per frame: n tokens over exactly ceil(n/k) frames
    assert sum(r.tokens_generated for r in results) == n * len(done) + sum(
        len(s.tokens) for s in eng.inflight)


def test_pool_slots_are_reused_over_1000_frames(model) -> None:
    cfg = model.config
    obs = make_observation(cfg, seed=1)
    wl = Workload(kind="random_length", min_tokens=1, max_tokens=12, seed=7)
    eng = build_engine(model, EngineConfig(mode="oxygen", k=2, max_inflight=6, num_steps=1, max_new_tokens=12,
                                           eos_id=NO_EOS))
    finished = 0
    for f in range(1000):
        r = eng.step(Frame(obs, wl.requests(f)))
        finished += len(r.finished)
        assert eng.backlog <= 6
        assert eng.slots.num_free + eng.backlog == eng.slots.num_slots
    assert finished + eng.backlog + eng.totals["rejected"] == 1000
    assert len({s.slot for s in eng.inflight}) == eng.backlog  # no slot shared by two live requests


def test_eos_stops_a_request_early(model) -> None:
    fl = frames(model.config, Workload(max_new_tokens=8).schedule(6))
    _, iso, _ = run(model, "isolated", fl)
    free = by_origin(iso)
    eos = free[0][0][3]  # a token that request 0 emits 4th
    _, oxy, _ = run(model, "oxygen", fl + frames(model.config, [[]] * 4), k=2, eos_id=eos)
    ended = {f.frame_index: f for r in oxy for f in r.finished}
    assert ended[0].eos and ended[0].tokens == free[0][0][: free[0][0].index(eos) + 1]
    assert ended[0].frames == 2
    for f, toks in free.items():
        expect = toks[0][: toks[0].index(eos) + 1] if eos in toks[0] else toks[0]
        assert ended[f].tokens == expect and ended[f].eos == (eos in toks[0])


def test_action_callback_fires_before_decode(model, monkeypatch) -> None:
    events: list[str] = []
    real_decode, real_logits = model.decode_step, model.lm_logits
    monkeypatch.setattr(model, "decode_step", lambda *a, **k: events.append("decode") or real_decode(*a, **k))
    monkeypatch.setattr(model, "lm_logits", lambda *a, **k: events.append("logits") or real_logits(*a, **k))
    fl = frames(model.config, Workload(max_new_tokens=6).schedule(4))
    eng = build_engine(model, EngineConfig(mode="oxygen", k=3, eos_id=NO_EOS, max_new_tokens=6))
    for fr in fl:
        events.append("frame")
        eng.step(fr, on_actions=lambda i, chunks: events.append("actions"))
    per_frame = "".join("F" if e == "frame" else e[0] for e in events).split("F")[1:]
    assert all(s.startswith("a") and s.count("a") == 1 and "d" in s for s in per_frame), per_frame


@pytest.mark.parametrize("policy", ["reject_newest", "drop_oldest"])
def test_full_pool_policy(model, policy) -> None:
    fl = frames(model.config, Workload(max_new_tokens=10).schedule(6))
    eng, results, _ = run(model, "oxygen", fl, k=1, max_inflight=2, overflow=policy, max_new_tokens=10)
    assert all(r.inflight <= 2 for r in results)
    if policy == "reject_newest":
        assert eng.totals["rejected"] == 4 and eng.totals["dropped"] == 0
        assert sorted(s.frame_index for s in eng.inflight) == [0, 1]
    else:
        assert eng.totals["dropped"] == 4 and eng.totals["rejected"] == 0
        assert sorted(s.frame_index for s in eng.inflight) == [4, 5]
        assert all(f.dropped for r in results for f in r.finished)


def test_drop_oldest_with_more_new_requests_than_the_pool(model) -> None:
    """A frame bringing more requests than the pool holds: the frame's own requests are dropped in turn, the
    survivors keep the prefix (same tokens as decoding them alone) and nothing raises (N=1 requests too)."""
    cfg = model.config
    for n in (1, 6):
        fl = frames(cfg, [[LanguageRequest(max_new_tokens=n) for _ in range(4)], []])
        eng, results, _ = run(model, "oxygen", fl, k=8, max_inflight=2, overflow="drop_oldest", max_new_tokens=8)
        kept = [f for r in results for f in r.finished if not f.dropped]
        assert len(kept) == 2 and results[0].dropped == 2, n
        alone = model.generate(fl[0].observation, n, eos_id=NO_EOS)[0]
        assert all(f.tokens == alone for f in kept), (n, [f.tokens for f in kept], alone)
        assert eng.backlog == 0 and eng.slots.num_free == eng.slots.num_slots, n


def test_oversized_request_is_rejected_not_fatal(model) -> None:
    fl = frames(model.config, [[LanguageRequest(max_new_tokens=999)], [LanguageRequest(max_new_tokens=3)]])
    eng, results, _ = run(model, "oxygen", fl, k=3, max_new_tokens=8)
    assert results[0].rejected == 1 and results[1].rejected == 0 and len(results[1].finished) == 1


def test_multiple_action_heads_read_one_prefix(model) -> None:
    cfg = model.config
    heads = make_extra_heads(cfg, 3)
    for h in heads:
        h.apply(lambda m: torch.nn.init.normal_(m.weight, std=0.1) if isinstance(m, torch.nn.Linear) else None)
    fl = frames(cfg, Workload(max_new_tokens=4).schedule(3))
    single = [r.actions for r in run(model, "oxygen", fl, k=2)[1]]
    eng = build_engine(model, EngineConfig(mode="oxygen", k=2, eos_id=NO_EOS), heads=heads)
    multi = [eng.step(fr).actions for fr in fl]
    assert all(len(m) == 4 for m in multi)
    assert all(torch.equal(m[0], s[0]) for m, s in zip(multi, single, strict=True))
    # each extra head equals running that head alone on a fresh prefill
    from oxygen_ros.engine import KVCache

    cache = KVCache.for_model(cfg, 1)
    prefix = model.prefill(fl[0].observation, cache)
    for i, h in enumerate(heads):
        alone = model.denoise(prefix, cache, fl[0].noise, cfg.num_steps, h.parts())[0]
        assert torch.equal(alone, multi[0][i + 1])
    assert len({tuple(m.flatten()[:3].tolist()) for m in multi[0]}) == 4  # the heads differ


def test_lora_adapter_is_suffix_only(model, tmp_path) -> None:
    wl = [[LanguageRequest("memory", 6, [17, 23]), LanguageRequest("narration", 6)] for _ in range(5)] + [[]] * 5
    fl = frames(model.config, wl)
    base_eng, base, _ = run(model, "oxygen", fl, k=2)
    zero = LoraAdapter.load(LoraAdapter.save(tmp_path / "zero", random_lora_weights(model, zero=True), 4, 8))
    live = LoraAdapter.load(LoraAdapter.save(tmp_path / "live", random_lora_weights(model, std=0.3, seed=1), 4, 8))
    for adapter, same_tokens in ((zero, True), (live, False)):
        eng = build_engine(model, EngineConfig(mode="oxygen", k=2, eos_id=NO_EOS, max_new_tokens=16), adapter=adapter)
        res = [eng.step(fr) for fr in fl]
        assert all(torch.equal(r.actions[0], b.actions[0]) for r, b in zip(res, base, strict=True))
        got, ref = by_origin(res), by_origin(base)
        mem = {f: [t for t, x in zip(v, wl[f], strict=False) if x.task == "memory"] for f, v in got.items()}
        assert (got == ref) == same_tokens
        if not same_tokens:  # narration rows (no adapter) were batched with adapted rows and are unchanged
            assert all(got[f][1] == ref[f][1] for f in got) and mem
        # batched with the adapter == alone (isolated) with the adapter
        iso = build_engine(model, EngineConfig(mode="isolated", eos_id=NO_EOS, max_new_tokens=16), adapter=adapter)
        assert by_origin([iso.step(fr) for fr in fl]) == got


def test_auto_budget_fits_the_deadline() -> None:
    b = BudgetController("auto", deadline_s=0.100)
    assert b.budget(0.02, batch=4, backlog_steps=50) == 1  # nothing measured yet
    b.observe(4, 0.010)
    assert b.budget(0.040, batch=4, backlog_steps=50) == 5  # 60 ms left * 0.9 / 10 ms
    assert b.budget(0.040, batch=4, backlog_steps=3) == 3  # never more than the backlog needs
    assert b.budget(0.099, batch=4, backlog_steps=50) == 1  # k_min keeps language moving
    assert b.budget(0.040, batch=8, backlog_steps=50) == 2  # unmeasured batch: extrapolated cost
    with pytest.raises(ValueError):
        BudgetController("auto")
    with pytest.raises(ValueError):
        BudgetController(0)


def test_auto_budget_plans_for_slow_steps_and_the_ticks_deadline() -> None:
    """k = auto budgets with a high percentile of the recent step times (one slow step in ten does not count, two
    do), and to the frame's own deadline when it has one (a frame that started late decodes less)."""
    import time

    b = BudgetController("auto", deadline_s=0.100)
    for _ in range(9):
        b.observe(2, 0.010)
    b.observe(2, 0.040)
    assert b.step_cost(2) == 0.010
    b.observe(2, 0.040)
    assert b.step_cost(2) == 0.040, "the p90 follows the slow steps, not the mean"
    assert b.budget(0.0, 2, 50) == 2  # 100 ms * 0.85 / 40 ms
    # 220 ms left to the tick's deadline: 4.7 steps fit; floor 4 unless over 31 ms pass between the two clock reads
    # (at + 0.2 s, a 12 ms stall of a busy host between them gave 3)
    assert b.budget(0.0, 2, 50, deadline=time.perf_counter() + 0.22) == 4
    assert b.budget(0.0, 2, 50, deadline=time.perf_counter() - 0.01) == 1  # past the deadline: k_min
    for _ in range(40):
        b.observe(2, 0.010)
    assert b.step_cost(2) == 0.010, "a window of recent steps: old slow ones age out"


def test_every_mode_is_deterministic_and_leaves_its_config_alone(model) -> None:
    wl = [[LanguageRequest("memory", 5), LanguageRequest("narration", 3, [17])]] * 3 + [[]] * 3
    fl = frames(model.config, wl, seed=20)

    def summary(results):
        return [(r.actions[0].tolist(), [(f.request_id, f.tokens, f.frames, f.dropped) for f in r.finished],
                 r.batch_sizes, r.tokens_generated, r.inflight, r.rejected, r.dropped) for r in results]

    for mode in ENGINE_MODES:
        ec = EngineConfig(mode=mode, k=2, max_inflight=2, overflow="drop_oldest", eos_id=NO_EOS, max_new_tokens=8)
        before = dataclasses.asdict(ec)
        runs = []
        for _ in range(2):
            eng = build_engine(model, ec)
            results = [eng.step(fr) for fr in fl]
            getattr(eng, "close", lambda: None)()
            assert eng.config.mode == mode and dataclasses.asdict(ec) == before, mode
            assert eng.totals == {"rejected": sum(r.rejected for r in results),
                                  "dropped": sum(r.dropped for r in results),
                                  "finished": sum(len(r.finished) for r in results),
                                  "tokens": sum(r.tokens_generated for r in results),
                                  "drafted": 0, "draft_accepted": 0}, mode
            runs.append(summary(results))
        assert runs[0] == runs[1], mode


def test_workloads_are_deterministic() -> None:
    for kind in ("every_frame", "every_n", "burst", "poisson", "random_length"):
        w = Workload(kind=kind, period=3, rate=1.5, seed=4)
        a = [[r.max_new_tokens for r in f] for f in w.schedule(30)]
        again = Workload(kind=kind, period=3, rate=1.5, seed=4).schedule(30)
        assert a == [[r.max_new_tokens for r in f] for f in again]
    assert sum(len(f) for f in Workload(kind="burst", period=5, burst_size=4).schedule(20)) == 16
    assert sum(len(f) for f in Workload(kind="every_n", period=4).schedule(20)) == 5
