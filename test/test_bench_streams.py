"""oxygen-bench streams on the tiny config: the multi-stream workload through real engines, JSON and plots,
every stream's requests finished, oxygen == isolated token for token on every request."""

from __future__ import annotations

import json
import statistics

import pytest
from conftest import assert_plot, make_model

from oxygen_ros.bench.streams import REFERENCE_STREAMS, request_keys, run_streams, stream_schedule
from oxygen_ros.bench.streams_report import write_results
from oxygen_ros.engine import get_config

ENGINES = ("oxygen", "isolated", "shared_kv")


def test_schedule_is_seeded_prioritised_and_per_stream() -> None:
    a = stream_schedule(REFERENCE_STREAMS, 40, vocab_size=512, seed=3)
    b = stream_schedule(REFERENCE_STREAMS, 40, vocab_size=512, seed=3)
    def content(schedule: list) -> list:
        return [[(r.stream, r.prompt_tokens, r.max_new_tokens) for r in f] for f in schedule]

    assert content(a) == content(b) != content(stream_schedule(REFERENCE_STREAMS, 40, vocab_size=512, seed=4))
    assert a[0][0] is not b[0][0]  # fresh requests for every engine
    memory = [i for i, f in enumerate(a) if any(r.stream == "memory" for r in f)]
    narration = [i for i, f in enumerate(a) if any(r.stream == "narration" for r in f)]
    assert memory == list(range(0, 40, 5)) and narration == list(range(0, 40, 2))
    questions = [r for f in a for r in f if r.stream == "question"]
    assert questions and all(len(r.prompt_tokens) == 8 and r.max_new_tokens == 24 for r in questions)
    assert len({tuple(r.prompt_tokens) for r in questions}) > 1  # a prompt of its own per question
    rank = {"question": 0, "memory": 1, "narration": 2}
    for f in a:  # highest priority first
        assert [rank[r.stream] for r in f] == sorted(rank[r.stream] for r in f)
        assert all(3 <= t < 512 for r in f for t in r.prompt_tokens)


def test_streams_bench_finishes_every_request_with_identical_texts(tmp_path) -> None:
    model = make_model(get_config("tiny", "libero", num_steps=2), std=0.3)
    res = run_streams(model, ENGINES, frames=6, warmup=2, k=4, calibration_frames=1, seed=1)
    assert list(res["engines"]) == list(ENGINES)
    sched = stream_schedule(REFERENCE_STREAMS, 8, model.config.vocab_size, seed=1)
    for name, e in res["engines"].items():
        assert e["frames"] == 6 and len(e["frame_ms_all"]) == 6 and e["rejected"] == 0
        assert e["frame_ms_median"] == pytest.approx(statistics.median(e["frame_ms_all"]))
        assert e["frame_ms_p99"] >= e["frame_ms_median"] and e["p99_over_median"] >= 1
        assert abs(e["action_hz"] - e["frames"] * model.config.action_horizon * 1e3 / sum(e["frame_ms_all"])) < 1e-6
        for spec in REFERENCE_STREAMS:
            st = e["streams"][spec.name]
            submitted = sum(r.stream == spec.name for f in sched[2:] for r in f)
            assert st["submitted"] == submitted and st["finished"] == submitted, (name, spec.name)
            assert st["tokens"] == submitted * spec.max_new_tokens  # eos never: every request runs to N
            if submitted:
                assert 1 <= st["latency_frames_p50"] <= st["latency_frames_p99"]
                assert 0 < st["latency_s_p50"] <= st["latency_s_p99"]
        if name != "oxygen":  # each request to completion within its own frame (latency in engine time)
            assert e["tokens_per_s"] == pytest.approx(sum(s["tokens"] for s in e["streams"].values()) * 1e3
                                                      / sum(e["frame_ms_all"]))
            assert all(v == 1 for s in e["streams"].values() for v in s.get("latency_frames", []))
            assert all(0 < v <= max(e["frame_ms_all"]) / 1e3 for s in e["streams"].values()
                       for v in s.get("latency_s", []))
    assert res["engines"]["oxygen"]["drain_frames"] > 0  # 24 + 7 positions at k=4 outlive the last frame
    total = sum(len(f) for f in sched)
    for name in ("oxygen", "shared_kv"):
        t = res["texts_vs_isolated"][name]
        assert t["identical"] and t["compared"] == total and t["differ"] == 0, (name, t)
    assert {t["name"].split()[0] for t in res["targets"]} == {"oxygen"} and len(res["targets"]) == 2
    assert res["ratios"]["oxygen_over_isolated_action_hz"] == pytest.approx(
        res["engines"]["oxygen"]["action_hz"] / res["engines"]["isolated"]["action_hz"])

    write_results(res, tmp_path)
    stored = json.loads((tmp_path / "results.json").read_text())
    assert stored["engines"]["oxygen"]["streams"]["memory"]["finished"] == res["engines"]["oxygen"]["streams"][
        "memory"]["finished"]
    assert "| oxygen | question |" in (tmp_path / "summary.md").read_text()
    assert_plot(tmp_path / "frame_times.png")
    assert_plot(tmp_path / "stream_latency.png")


def test_request_keys_match_across_engines_whatever_the_ids() -> None:
    from oxygen_ros.engine.requests import FinishedRequest

    def fin(rid: int, frame: int, stream: str) -> FinishedRequest:
        return FinishedRequest(rid, stream, frame, None, [rid], False, 0.1, 1, stream=stream)

    a = request_keys([fin(0, 0, "question"), fin(1, 0, "question"), fin(2, 0, "memory")])
    b = request_keys([fin(7, 0, "memory"), fin(9, 0, "question"), fin(8, 0, "question")])
    assert set(a) == set(b) == {(0, "question", 0), (0, "question", 1), (0, "memory", 0)}
    assert b[(0, "question", 0)].request_id == 8


def test_auto_deadline_modes() -> None:
    model = make_model(get_config("tiny", "libero", num_steps=2), std=0.3)
    res = run_streams(model, ["oxygen"], frames=4, warmup=2, k="auto", deadline_factor=2.0, calibration_frames=2)
    oxy, nl = res["engines"]["oxygen"], res["no_language_frame_ms"]
    # default: fixed while measuring, 2x the median of the calibration frames and the warm-up's prefill + denoise
    assert res["oxygen"]["deadline"] == "warmup" and res["oxygen"]["deadline_factor"] == 2.0
    assert nl["samples_with_warmup"] == 2 + 1  # each engine's first frame left out
    assert oxy["deadline_ms_all"] == [oxy["deadline_ms"]] * 4
    assert abs(oxy["deadline_ms"] - 2.0 * nl["median_with_warmup"]) < 1e-6
    assert 0 <= oxy["deadline_misses"] <= 4 and oxy["frame_over_deadline_p99"] >= oxy["frame_over_deadline_median"]
    assert len(oxy["action_part_ms_all"]) == 4 and oxy["action_part_p99_over_median"] >= 1
    assert all(s["finished"] == s["submitted"] for s in oxy["streams"].values())
    assert [t["name"].split()[-1] for t in res["targets"]] == ["excluded)"]  # no isolated: the p99 target only
    assert res["texts_vs_isolated"] == {} and res["ratios"] == {}
    track = run_streams(model, ["oxygen"], frames=3, warmup=1, k="auto", calibration_frames=1,
                        deadline_mode="tracking", deadline_window=2)
    assert track["oxygen"]["deadline"] == "tracking" and track["oxygen"]["deadline_window"] == 2
    assert len(track["engines"]["oxygen"]["deadline_ms_all"]) == 3
    fixed = run_streams(model, ["oxygen"], frames=2, warmup=1, k="auto", deadline_ms=50.0, calibration_frames=1)
    assert fixed["oxygen"]["deadline"] == "absolute" and fixed["engines"]["oxygen"]["deadline_ms_all"] == [50.0, 50.0]
