"""The one parameter schema (oxygen_ros/params/): the node's and the executor's shared parameters are declared once,
coercion and checks are the schema's, argparse flags come from the same specs, the schema and the executor's
process stay torch-free, and the node and oxygen-serve build their engine configuration with one function."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from oxygen_ros.executor.params import EXECUTOR_PARAMS
from oxygen_ros.executor.params import validate as validate_executor
from oxygen_ros.params import ROBOT_PARAMS, ParamError, ParamSpec, add_arguments, param, read_specs, specs_of
from oxygen_ros.runtime.params import PARAMS
from oxygen_ros.runtime.params import validate as validate_node

ROOT = Path(__file__).resolve().parents[1]


def test_shared_parameters_are_declared_once() -> None:
    node = {p.name: p for p in PARAMS}
    executor = {p.name: p for p in EXECUTOR_PARAMS}
    both = set(node) & set(executor)
    assert both == {s.name for s in ROBOT_PARAMS.values()}, "a parameter both declare is not in params/robot.py"
    for name in both:
        assert node[name] is executor[name], f"{name}: the node and the executor declare it separately"
    assert node["max_joint_age_s"].default == 0.25


def test_one_preset_gives_both_the_same_shared_values() -> None:
    preset = {"model": "toy", "joint_names": ["a", "b"], "action_names": ["x", "y"], "action_rate_hz": 50,
              "max_joint_age_s": 0.1, "limits": {"required": True, "robot_description": "urdf"}}
    node, executor = validate_node(preset), validate_executor(preset)
    for spec in ROBOT_PARAMS.values():
        assert getattr(node, spec.attr) == getattr(executor, spec.attr), spec.name
    assert executor.action_rate_hz == 50.0 and isinstance(executor.action_rate_hz, float)
    assert validate_executor({}).max_joint_age_s == validate_node({"model": "toy", "joint_names": ["a"]}) \
        .max_joint_age_s == 0.25


def test_both_report_a_bad_shared_value_the_same_way() -> None:
    bad = {"model": "toy", "joint_names": ["a"], "max_joint_age_s": -1.0, "limits.required": "yes"}
    with pytest.raises(ParamError) as node_error:
        validate_node(bad)
    with pytest.raises(ParamError) as executor_error:
        validate_executor(bad)
    expected = {"max_joint_age_s: must be >= 0.0; got -1.0", "limits.required: expected true/false, got str 'yes'"}
    assert expected <= set(node_error.value.problems)
    assert expected == set(executor_error.value.problems)


def test_coercion_and_checks() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class P:
        rate: float = param(1.0, "rate", positive=True)
        n: int = param(2, "n", minimum=0, ros_name="g.n")
        mode: str = param("a", "mode", choices=("a", "b"))
        delay: str = param("auto", "delay", int_ok=True)
        names: tuple[str, ...] = param((), "names")

    specs = specs_of(P)
    assert [s.name for s in specs] == ["rate", "g.n", "mode", "delay", "names"]
    out, problems = read_specs(specs, {"rate": 3, "g": {"n": 4.0}, "delay": 3, "names": None})
    assert out == {"rate": 3.0, "n": 4, "mode": "a", "delay": "3", "names": ()} and not problems
    out, problems = read_specs(specs, {"rate": 0.0, "g.n": 1.5, "mode": "c", "names": [1]})
    assert problems == ["rate: must be > 0; got 0.0", "g.n: expected an integer, got float 1.5",
                        "mode: must be one of a, b; got 'c'", "names: expected a list of strings, got list [1]"]
    assert out["rate"] == 1.0  # a bad value falls back to its default


def test_flags_come_from_the_specs() -> None:
    specs = (ParamSpec("rate", float, 1.0, "a rate", positive=True), ParamSpec("on", bool, False, "on"),
             ParamSpec("names", "str[]", (), "names"), ParamSpec("ask.n", int, 2, "n", minimum=1, attr="ask_n"))
    ap = argparse.ArgumentParser()
    add_arguments(ap, specs, aliases={"rate": ["--r"]})
    args = ap.parse_args(["--r", "2.5", "--on", "--names", "a", "b", "--ask-n", "3"])
    assert (args.rate, args.on, args.names, args.ask_n) == (2.5, True, ["a", "b"], 3)
    with pytest.raises(SystemExit):
        ap.parse_args(["--rate", "0"])  # positive
    with pytest.raises(SystemExit):
        ap.parse_args(["--ask-n", "0"])  # minimum


def test_serve_and_node_build_the_same_engine_config() -> None:
    """oxygen-serve's flags and the node's parameters, set alike, give the same EngineConfig through the one
    function (the node adds only k_auto's deadline)."""
    from oxygen_ros.policy.configure import engine_config, language_schedules
    from oxygen_ros.runtime.model_loader import engine_config as node_engine_config
    from oxygen_ros.serve.options import parse, runner_params

    args = parse(["--checkpoint", "x", "--k", "3", "--max-new-tokens", "12", "--num-steps", "4",
                  "--language-streams", "memory", "--stream", "memory.every_n_frames=2"])
    p, streams = runner_params(args)
    node = validate_node({"model": "toy", "joint_names": ["a"], "k": 3, "max_new_tokens": 12, "num_steps": 4,
                          "language_streams": ["memory"], "memory": {"every_n_frames": 2}})
    served = engine_config(p, 7, num_steps=10)
    from_node = node_engine_config(node, 7)
    assert served == from_node.__class__(**{**from_node.__dict__, "deadline_s": None})
    assert from_node.deadline_s == node.period_s
    assert language_schedules(p, streams) == language_schedules(node, node.streams)


ROBOT_MODULES = ", ".join(f"oxygen_ros.robot.{m}" for m in ("limits", "urdf", "limiter", "gate", "newest", "faults",
                                                            "watchdog", "camera_sync", "realtime"))


@pytest.mark.parametrize("module, forbidden", [("oxygen_ros.params", ("torch", "rclpy")),
                                               (ROBOT_MODULES, ("torch", "rclpy")),
                                               ("oxygen_ros.executor.main", ("torch",))])
def test_schema_robot_and_executor_process_import_no_torch(module: str, forbidden: tuple[str, ...]) -> None:
    code = f"import sys, {module}; print([m for m in {forbidden!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"{module} loads {out.stdout.strip()}"
