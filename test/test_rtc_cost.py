"""The real-time-chunking cost benchmark (``rtc_cost`` of bench/experiments.py) on the tiny config: its files,
and that the guided denoises it times really guide (their chunks differ from the unguided one)."""

from __future__ import annotations

import json
import statistics

import pytest
from conftest import assert_plot


def test_rtc_cost_cli_writes_json_table_and_plot(tmp_path) -> None:
    from oxygen_ros.bench.cli import main

    out = tmp_path / "rc"
    main(["experiment", "rtc_cost", "--config", "tiny", "--repeats", "2", "--out", str(out)])
    res = json.loads((out / "results.json").read_text())
    assert set(res["median_ms"]) == {"eager", "eager_identity", "fused", "fused_identity", "vjp", "static",
                                     "static_identity"}
    assert all(len(s) == 2 for s in res["samples_ms"].values())
    assert set(res["ratio"]) == {"eager_identity", "fused_identity", "static_identity", "vjp", "vjp_vs_eager"}
    for name, (variant, base) in res["baseline"].items():  # the median of the paired rounds' ratios
        paired = [a / b for a, b in zip(res["samples_ms"][variant], res["samples_ms"][base], strict=True)]
        assert res["ratio"][name] == pytest.approx(statistics.median(paired)), name
    assert res["guided_max_change"]["identity"] > 1e-3 and res["guided_max_change"]["vjp"] > 1e-3
    assert res["config"]["threads"] == 1 and res["config"]["remainder"] == res["config"]["H"] - 2
    table = (out / "summary.md").read_text()
    assert "| fused |" in table and "| static |" in table
    assert_plot(out / "rtc_cost.png")
