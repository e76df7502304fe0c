"""Bad parameters are reported by name, never half-taken: the node's parameter validation (no ROS graph needed), the
config presets and the executor's config, the parameter table. test_node_bad_input.py sends bad input to a node.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import NODE_PRESETS

from oxygen_ros.runtime.params import PARAMS, ParamError, markdown_table, validate

REPO = Path(__file__).resolve().parents[1]
JOINTS = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
BASE = {"model": "random_tiny", "joint_names": JOINTS}


# ---------------------------------------------------------------------------------------------- parameters
def test_defaults_need_a_model_and_joints() -> None:
    with pytest.raises(ParamError) as e:
        validate({})
    assert {p.split(":")[0] for p in e.value.problems} == {"checkpoint_path", "joint_names"}
    p = validate(BASE)
    assert p.period_s == pytest.approx(0.1) and p.robot_action_names(len(JOINTS)) == tuple(JOINTS)
    assert p.robot_action_names(3) == ("action_0", "action_1", "action_2")


@pytest.mark.parametrize("name, value", [
    ("mode", "parallel_universe"), ("num_steps", -1), ("actions_per_chunk", -2), ("k", -1), ("k", 2.5),
    ("max_new_tokens", "30"),
    ("control_rate_hz", 0.0), ("control_rate_hz", "fast"), ("max_image_age_s", -1.0), ("overflow", "explode"),
    ("camera_reliability", "sometimes"), ("device", "tpu"), ("dtype", "float8"), ("model", "gpt5"),
    ("camera_topics", ["/a"]), ("camera_compressed", [True]), ("camera_names", ["a", "a"]),
    ("joint_names", []), ("joint_names", "joint_1"), ("request_task", "poetry"), ("request_prompt", "{task}"),
    ("request_prompt", "{unclosed"), ("publish_trajectory", "yes"), ("action_rate_hz", -5.0),
    ("delta_action_mask", [True] * 9), ("max_instruction_chars", -1), ("normalization", "zscore"),
    ("max_joint_age_s", -0.1),
])
def test_bad_parameters_are_reported_by_name(name: str, value) -> None:
    with pytest.raises(ParamError) as e:
        validate({**BASE, "camera_names": ["base_0_rgb", "left_wrist_0_rgb"], name: value})
    assert any(p.startswith(f"{name}:") for p in e.value.problems), e.value.problems


def test_parameter_types_are_coerced_where_unambiguous() -> None:
    p = validate({**BASE, "control_rate_hz": 3, "k": 4.0, "camera_names": ("base_0_rgb",)})
    assert p.control_rate_hz == 3.0 and isinstance(p.control_rate_hz, float) and p.k == 4
    assert p.camera_topic(0) == "/cameras/base_0_rgb/image_raw"
    p = validate({**BASE, "camera_names": ["a"], "camera_compressed": [True]})
    assert p.camera_topic(0) == "/cameras/a/image_raw/compressed"
    assert validate({**BASE, "request_task": "custom", "request_prompt": "Why {instruction}? "}).request_prompt
    # `camera_names: []` in a --params-file reaches the node unset (None): an empty list, not a type error
    assert validate({**BASE, "camera_names": None}).camera_names == ()
    with pytest.raises(ParamError, match="joint_names: required"):
        validate({**BASE, "joint_names": None})




@pytest.mark.parametrize("preset", NODE_PRESETS, ids=lambda p: p.stem)
def test_config_presets_are_valid(preset: Path) -> None:
    params = yaml.safe_load(preset.read_text())["/**"]["ros__parameters"]
    if not params.get("model"):
        params["checkpoint_path"] = "/models/pi05"
    p = validate(params)
    assert not p.extra, f"unknown parameters in {preset.name}: {p.extra}"
    if preset.stem == "humanoid":
        assert (len(p.camera_names), p.max_new_tokens, p.k, p.control_rate_hz) == (3, 30, 5, 3.0)


def test_the_executor_config_is_valid_for_the_executor() -> None:
    """config/executor.yaml is the chunk executor's (not a node preset): its own parameters validate it."""
    from oxygen_ros.executor.params import validate as validate_executor

    params = yaml.safe_load((REPO / "config" / "executor.yaml").read_text())["/**"]["ros__parameters"]
    assert validate_executor(params).switch == "replace"


def test_parameter_table_lists_every_parameter() -> None:
    table = markdown_table()
    assert all(f"`{s.name}`" in table for s in PARAMS)
