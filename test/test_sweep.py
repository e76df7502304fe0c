"""The evaluation sweep on the tiny config: records, resumability, stable ids, summary, plots, headless run."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import assert_plot

from oxygen_ros.bench.points import Point
from oxygen_ros.bench.suites import GRIDS, SUITES, build_plan
from oxygen_ros.bench.sweep import main

TINY = ["--config", "tiny", "--device", "cpu", "--frames", "2", "--threads", "1"]
REPO = Path(__file__).resolve().parents[1]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_point_ids_are_stable_and_unique() -> None:
    base = Point(suite="", engine="", config="tiny")
    plan = build_plan(SUITES, GRIDS["quick"], base)
    assert [p.id for p in plan] == [p.id for p in build_plan(SUITES, GRIDS["quick"], base)]
    assert len({p.id for p in plan}) == len(plan)
    assert plan[0].engine == "profile"  # stage profiles first: predictions and the auto deadline need them
    p = replace(base, suite="tradeoff", engine="oxygen", k=5, N=30, frames=4)
    assert p.id == ("tradeoff:N=30,S=10,burst=0,compile=off,config=tiny,deadline=None,device=cpu,dtype=float32,"
                    "engine=oxygen,frames=4,heads=1,k=5,min_tokens=0,onednn=True,period=1,preset=libero,rate=1.0,"
                    "seed=0,workload=every_frame")
    assert p.key == p.id.removeprefix("tradeoff:")  # the measurement key: every parameter but the suite
    full = build_plan(["speedup"], GRIDS["full"], base)
    assert {(q.preset, q.S, q.k) for q in full if q.N == 30 and q.engine == "oxygen"} == {
        (pr, s, k) for pr in ("libero", "droid", "aloha") for s in (5, 10, 15, 20) for k in (1, 5)}


def test_quick_sweep_writes_records_summary_plots_and_resumes(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "sweep"
    summary = main([*TINY, "--suite", "headline", "ablation", "--out", str(out)])
    records = lines(out / "points.jsonl")
    plan_ids = [p["id"] for p in summary["points"]]
    assert sorted(r["id"] for r in records) == sorted(plan_ids)
    for r in records:
        assert r["machine"]["device"] == "cpu" and r["model"]["config"]["name"] == "tiny"
        assert r["params"]["config"] == "tiny" and r["key"] in r["id"]
    shared = [r for r in records if r.get("shared_with")]
    assert shared and all(r["suite"] == "ablation" for r in shared)  # N=5 and N=30 isolated etc. measured once
    runs = [r for r in records if "profile" not in r]
    assert all(r["frames"] == 2 for r in runs)

    saved = json.loads((out / "summary.json").read_text())
    assert set(saved["tables"]) == {"headline", "ablation"} and saved["machine"]["device"] == "cpu"
    oxy = next(r for r in saved["points"] if r["suite"] == "headline" and r["params"]["k"] == 1)
    iso = next(r for r in saved["points"] if r["suite"] == "headline" and r["engine"] == "isolated"
               and r["N"] == oxy["N"])  # the ratios are against isolated at the same N
    assert oxy["speedup_vs_isolated"] == pytest.approx(iso["frame_ms_mean"] / oxy["frame_ms_mean"])
    assert oxy["token_rate_vs_isolated"] == pytest.approx(oxy["tokens_per_s"] / iso["tokens_per_s"])
    assert oxy["predicted_speedup"] == pytest.approx(iso["predicted_frame_ms"] / oxy["predicted_frame_ms"])
    assert oxy["predicted_speedup"] > 1, "the cost model: one shared prefix beats N isolated requests"
    assert set(saved["headline"]["off"]) >= {"N30_k1", "N30_k5", "N5_shared_kv"}
    oracle = [r for r in saved["tables"]["ablation"] if r["N"] == 0]
    assert len(oracle) == 1 and oracle[0]["tokens_per_s"] == 0  # frames with no language request
    assert "## ablation" in (out / "summary.md").read_text()
    for png in ("headline.png", "ablation.png"):
        assert_plot(out / png)

    # a killed run leaves a torn last line: ignored; finished points are not measured again
    with (out / "points.jsonl").open("a") as f:
        f.write('{"id": "torn')
    monkeypatch.setattr("oxygen_ros.bench.sweep.measure", lambda *a, **k: pytest.fail("a finished point ran again"))
    again = main([*TINY, "--suite", "headline", "ablation", "--out", str(out)])
    assert [p["id"] for p in again["points"]] == plan_ids
    assert (out / "points.jsonl").read_text().count("\n") == len(records) + 1


def test_auto_suite_records_per_frame_trace(tmp_path: Path) -> None:
    out = tmp_path / "auto"
    summary = main([*TINY, "--suite", "auto", "--out", str(out), "--no-plots"])
    auto = [r for r in summary["points"] if r["suite"] == "auto"]
    assert {r["params"]["k"] for r in auto} == {"auto", 1, 5}
    for r in auto:
        tr = r["trace"]
        assert len(tr["frame_ms"]) == len(tr["backlog"]) == len(tr["decode_steps"]) == tr["warmup"] + 2
        assert max(tr["backlog"]) >= 1  # bursts of 8 every 8 frames
        measured = tr["frame_ms"][tr["warmup"]:]  # the misses count the measured frames (trace: rounded to 1 us)
        assert (sum(t > r["deadline_ms"] + 1e-3 for t in measured) <= r["deadline_misses"]
                <= sum(t > r["deadline_ms"] - 1e-3 for t in measured)), (r["deadline_misses"], measured)
    assert len({r["deadline_ms"] for r in auto}) == 1, "one relative deadline (of one profile) for every k"
    rows = summary["tables"]["auto"]
    assert all(row["backlog_max"] >= 1 for row in rows)


def test_compile_option_traces_with_the_eager_backend(tmp_path: Path) -> None:
    out = tmp_path / "compiled"
    summary = main([*TINY, "--suite", "headline", "--compile", "default", "--compile-backend", "eager",
                    "--out", str(out), "--no-plots"])
    runs = [r for r in summary["points"] if "profile" not in r]
    assert runs and all(r["model"]["compile"] == "default" and r["model"]["compiled_modules"] > 0 for r in runs)


HEADLESS = """
import importlib.abc, sys
BLOCKED = {"rclpy", "sentencepiece", "matplotlib", "tqdm", "transformers", "cv2", "rosbags", "launch"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not installed here")
sys.meta_path.insert(0, Block())
from oxygen_ros.bench.sweep import main
main(sys.argv[1:])
loaded = {m for m in BLOCKED & set(sys.modules) if getattr(sys.modules[m], "__file__", None)}
assert not loaded, loaded  # only the sweep's tqdm stand-in, which has no file
"""


def test_runs_without_tqdm_matplotlib_or_ros(tmp_path: Path) -> None:
    """The bare GPU machine: no tqdm, no matplotlib, no ROS; JSON still written, no plots."""
    out = tmp_path / "headless"
    args = [*TINY, "--suite", "headline", "--out", str(out)]
    res = subprocess.run([sys.executable, "-c", HEADLESS, *args], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "no plots" in res.stdout
    assert json.loads((out / "summary.json").read_text())["tables"]["headline"]
    assert not list(out.glob("*.png"))
