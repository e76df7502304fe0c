"""The frame-overhead benchmark (fused vs eager stages, oxygen vs isolated, median statistics) on the tiny config."""

from __future__ import annotations

import json
import time

import pytest
import torch
from conftest import assert_plot

from oxygen_ros.bench.frame_overhead import compute_floor, main
from oxygen_ros.bench.runner import frame_statistics


def test_frame_overhead_cli_writes_json_table_and_plot(tmp_path) -> None:
    out = tmp_path / "fo"
    main(["--config", "tiny", "--batches", "1", "3", "--repeats", "1", "--N", "4", "--k", "1", "2", "--frames", "2",
          "--episodes", "0", "--speculate", "3", "--graphs", "static", "--engine-graphs", "static", "--out", str(out)])
    res = json.loads((out / "results.json").read_text())
    assert set(res["stages"]) == {"prefill", "denoise", "decode_B1", "decode_B3"}
    for s in res["stages"].values():
        assert s["fused_ops"] < s["eager_ops"] and len(s["samples"]["fused"]) == 1
        # one round: each speedup is that round's eager / its variant, the bound eager / floor (matrix products)
        assert s["speedup"] == pytest.approx(s["eager_s"] / s["fused_s"])
        assert s["graphs_speedup"] == pytest.approx(s["eager_s"] / s["graphs_s"])
        assert s["floor_s"] > 0 and s["bound"] == pytest.approx(s["samples"]["eager"][0] / s["floor_s"])
    assert res["stages"]["decode_B3"]["graphs_bucket"] == 3, "a pool of 3 slots: buckets 1, 2, 3"
    assert [(p["engine"], p["k"], p["speculate"], p["graphs"]) for p in res["points"]] == [
        ("isolated", 1, 0, "off"), ("oxygen", 1, 0, "off"), ("oxygen", 2, 0, "off"), ("oxygen", 2, 3, "off"),
        ("isolated", 1, 0, "static"), ("oxygen", 2, 0, "static")]
    isolated = {p["graphs"]: p for p in res["points"] if p["engine"] == "isolated"}
    for p in res["points"]:  # against isolated with the same graphs setting
        base = isolated[p["graphs"]]
        assert p["speedup_vs_isolated_median"] == pytest.approx(base["frame_ms_median"] / p["frame_ms_median"])
    assert "| denoise |" in (out / "summary.md").read_text() and "compute floor" in (out / "summary.md").read_text()
    assert_plot(out / "frame_overhead.png")


def test_frame_statistics_flag_host_stalls() -> None:
    st = frame_statistics([0.1] * 9 + [0.9], horizon=10)
    assert st["host_stalls"] == 1 and abs(st["frame_ms_median"] - 100) < 1e-9
    assert abs(st["action_hz_median"] - 100) < 1e-9 and abs(st["frame_ms_mean_without_stalls"] - 100) < 1e-9


def test_toy_graphs_cli_compares_static_shapes_on_the_closed_loop(tmp_path) -> None:
    from oxygen_ros.bench.toy_graphs import main as toy_main

    out = tmp_path / "tg"
    toy_main(["--graphs", "static", "--episodes", "1", "--stage-repeats", "1", "--out", str(out)])
    res = json.loads((out / "results.json").read_text())
    assert res["identical_texts"] and res["max_action_diff"] < 1e-4 and res["frames"] >= 2
    assert len(res["static"]["frame_ms"]) == res["frames"]
    assert res["speedup_median"] == pytest.approx(res["off"]["frame_ms_median"] / res["static"]["frame_ms_median"])
    denoise = res["stages"]["denoise"]
    assert denoise["graphs_speedup"] == pytest.approx(denoise["eager_s"] / denoise["graphs_s"])
    assert "| static |" in (out / "summary.md").read_text()
    assert_plot(out / "toy_graphs.png")


def test_compute_floor_counts_matrix_products_not_overhead() -> None:
    """The floor of a call is the time of its matrix products: thousands of tiny elementwise operations add
    nothing, one large product adds its time."""
    dev = torch.device("cpu")
    a, w, x = torch.randn(256, 256), torch.randn(256, 256), torch.randn(8)

    def elementwise() -> None:
        for _ in range(2000):
            x.add(1.0)

    assert compute_floor(elementwise, dev) == 0.0  # (no floor at all in a stage: no bound reported)
    t0 = time.perf_counter()
    for _ in range(20):
        a @ w
    assert 0 < compute_floor(lambda: [a @ w for _ in range(20)], dev) <= 5 * (time.perf_counter() - t0) + 0.01
