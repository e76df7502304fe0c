"""``oxygen-compile --params-file``: the node's own engine key from its params file (dtype incl. islands, ask, pool,
RTC, threads), so the node (``graphs: auto`` on CPU) loads the steps without building; and a node whose settings
differ logs the key it looked for and the field that differed. Short: the tiny random model with a 2-slot pool
(4 steps, about a minute of AOTInductor)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from oxygen_ros.evaluation.cli import parse_overrides, read_params_file
from oxygen_ros.runtime.model_loader import build_runner, load_node_policy
from oxygen_ros.runtime.params import validate
from oxygen_ros.tools.compile import main

REPO = Path(__file__).resolve().parents[1]
PARAMS = REPO / "config" / "synthetic.yaml"  # model: random_tiny, torch_threads: 1
SHORT = ["max_inflight:=1", "max_new_tokens:=4", "ask.enabled:=false"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("compiled_params")


def node_engine(cache_dir: Path, *overrides: str):
    """The engine the node builds at configure (its loader, its runner) from the same params file."""
    values = {**read_params_file(PARAMS), **parse_overrides([*SHORT, *overrides]),
              "compile_cache_dir": str(cache_dir)}
    p = validate(values)
    torch.set_num_threads(p.torch_threads)  # as the node's configure does
    loaded = load_node_policy(p)
    try:
        return build_runner(loaded).engine
    finally:
        loaded.release()


def test_params_file_compiles_what_the_node_loads(cache_dir: Path, capsys, caplog) -> None:
    argv = ["--params-file", str(PARAMS), *(a for o in SHORT for a in ("-p", o)), "--cache-dir", str(cache_dir)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["threads"] == 1 and summary["engine"]["max_inflight"] == 1 and summary["dtype"] == "float32"
    assert {s["step"] for s in summary["steps"]} == {"decode1", "decode2", "prefill", "denoise"}
    assert "node: precision float32 (own checkpoint on cpu)" in out
    engine = node_engine(cache_dir)
    assert engine.graphs_backend == "aot", engine.graph_stages
    report = engine.runner.graphs.load_report
    assert report and all(r["how"] == "loaded" for r in report)  # nothing built at configure
    assert {r["path"] for r in report} == {s["path"] for s in summary["steps"]}

    # the node in another precision: eager, and its log names the key it looked for and what differed
    with caplog.at_level(logging.INFO, logger="oxygen_ros.engine.model_runner"):
        other = node_engine(cache_dir, "dtype:=bfloat16_islands")
    assert other.graphs_backend == "off"
    text = caplog.text
    assert "looked for" in text and "differs in" in text, text
    assert 'dtype: "torch.bfloat16" wanted, "torch.float32" found' in text, text
    assert not list(cache_dir.glob("*.pt2.tmp"))


def test_dtype_accepts_islands_and_bad_params_are_clear(capsys, tmp_path: Path) -> None:
    from oxygen_ros.tools.compile import parse

    assert parse(["--config", "tiny", "--dtype", "bfloat16_islands"]).dtype == "bfloat16_islands"
    assert main(["--params-file", str(PARAMS), "-p", "dtype:=bfloat17", "--cache-dir", str(tmp_path)]) == 2
    assert "dtype" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["--config", "tiny", "-p", "mode:=isolated"])  # -p without a params file
