"""Rehearse scripts/gpu_bench.sh on the CPU (DEVICE=cpu CONFIG=tiny GRAPHS=static), with a timeout in the middle: the
suite hangs at its ``node`` stage (``OXYGEN_GPU_SUITE_HANG_AT``) and the script's own timeout kills it; the CUDA
test results and every stage before the hang are on disk, the summary is still written, and what comes back is at
most 8 files, none in a folder (the device returns at most 8 files, 2 folders deep)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_bench_rehearsal_keeps_results_across_a_timeout(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    env = {**os.environ, "DEVICE": "cpu", "CONFIG": "tiny", "GRAPHS": "static", "FRAMES": "1", "REPEATS": "1",
           "TESTS_SELECT": "islands", "STAGES": "stages node memory", "SUITE_BUDGET": "300", "SUITE_TIMEOUT": "45",
           "OXYGEN_GPU_SUITE_HANG_AT": "node", "OUT": str(out), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "scripts/gpu_bench.sh")], env=env, capture_output=True, text=True,
                          timeout=400)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "gpu_suite failed or timed out (rc=124)" in log, log[-3000:]  # the timeout hit the hanging stage
    files = sorted(p for p in out.rglob("*"))
    assert all(p.is_file() and p.parent == out for p in files) and len(files) <= 8, files
    assert {p.name for p in files} >= {"env.txt", "tests.xml", "cuda_tests.jsonl", "results.jsonl", "summary.md"}
    tests = [json.loads(line) for line in (out / "cuda_tests.jsonl").read_text().splitlines()]
    assert [t["test"] for t in tests] == ["islands"] and tests[0]["backend"] == "static"
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    kinds = [(r["stage"], r["kind"]) for r in recs]
    assert kinds[0] == ("build", "model")
    names = [r["name"] for r in recs if r["kind"] == "stage"]
    assert names == ["prefill", "denoise", "decode_B1", "decode_B6", "decode_B30"]  # written before the hang
    assert ("stages", "done") in kinds and not any(s in ("node", "memory") for s, _ in kinds)
    assert all(r["graphs_s"] > 0 and r["eager_s"] > 0 for r in recs if r["kind"] == "stage")
    summary = (out / "summary.md").read_text()
    assert "Stages finished: stages." in summary and "| decode_B30 |" in summary
