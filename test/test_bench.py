"""oxygen-bench end to end on the tiny config: JSON, table, plots, and the metric arithmetic."""

from __future__ import annotations

import json

import pytest
from conftest import assert_plot

from oxygen_ros.bench.cli import main
from oxygen_ros.bench.cost_model import decode_cost
from oxygen_ros.bench.runner import pool_size


def test_bench_cli_writes_json_table_and_plots(tmp_path) -> None:
    out = tmp_path / "bench"
    main(["--config", "tiny", "--engines", "isolated", "shared_kv", "oxygen", "--N", "4", "--k", "1", "2",
          "--frames", "3", "--out", str(out)])
    result = json.loads((out / "results.json").read_text())
    points = result["points"]
    assert [(p["engine"], p["k"]) for p in points] == [("isolated", 1), ("shared_kv", 1), ("oxygen", 1), ("oxygen", 2)]
    for p in points:
        assert p["frames"] == 3
        assert abs(p["action_hz"] - p["H"] * 1e3 / p["frame_ms_mean"]) < 1e-6 * p["action_hz"]
        # every engine generates one 4-token request per frame in steady state
        assert abs(p["tokens_per_s"] - 4 * 1e3 / p["frame_ms_mean"]) < 0.35 * p["tokens_per_s"]
        assert 0 <= p["manager_share"] < 1
        assert p["speedup_vs_isolated"] == pytest.approx(points[0]["frame_ms_mean"] / p["frame_ms_mean"])
    oxy = points[2]
    assert oxy["batch_max"] == 3  # ceil(N/k) - 1 rows decode; the newest request's first token is free
    assert result["machine"]["device"] == "cpu" and result["profile"]["decode_step_s"]
    assert (out / "summary.md").read_text().count("| oxygen |") == 2
    assert_plot(out / "frame_breakdown.png")
    assert_plot(out / "tradeoff.png")


def test_decode_cost_interpolates_and_pool_size() -> None:
    profile = {"decode_step_s": {1: 1.0, 4: 2.5, 8: 3.0}}
    assert decode_cost(profile, 1) == 1.0 and decode_cost(profile, 2) == 1.5 and decode_cost(profile, 6) == 2.75
    assert decode_cost(profile, 12) == 3.5  # extrapolated from the last two sizes
    assert pool_size(30, 5) == 8 and pool_size(30, "auto") == 32
