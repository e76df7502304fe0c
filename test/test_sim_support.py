"""The ROS-free parts of the simulator and the demo: chunk validation and latency alignment, memory truth
bookkeeping, and where the demo finds its config presets (source checkout, ament index, sys.prefix)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from oxygen_ros.toy.sim.chunks import aligned_actions, chunk_problem
from oxygen_ros.toy.sim.scoring import MemoryTruth, SimCounters

JOINTS = ("ee_x", "ee_y", "ee_z", "gripper")


def test_chunk_problem_names_what_is_wrong() -> None:
    good = np.zeros(3 * 5)
    assert chunk_problem(good, 3, 5, [], JOINTS) is None
    assert chunk_problem(good, 3, 5, [*JOINTS, "extra"], JOINTS) is None
    assert "shape" in chunk_problem(good, 5, 3, [], JOINTS)  # fewer dims than joints
    assert "shape" in chunk_problem(good[:-1], 3, 5, [], JOINTS)
    assert "joint_names" in chunk_problem(good, 3, 5, ["a", "b", "c", "d", "e"], JOINTS)
    assert "non-finite" in chunk_problem(np.full(15, np.nan), 3, 5, [], JOINTS)


def test_aligned_actions_skip_what_is_due_and_cut_extra_dims() -> None:
    actions = np.arange(4 * 6, dtype=np.float64)  # horizon 4 x dim 6
    rows = aligned_actions(actions, 4, 6, 4, stamp_ns=0, now_ns=25, dt_ns=10)
    assert rows.shape == (2, 4) and rows[0, 0] == 12  # actions 0 and 1 are due by t = 25
    assert aligned_actions(actions, 4, 6, 4, 0, 10_000, 10).shape == (1, 4)  # the last one is always kept


def test_memory_truth_keeps_the_newest() -> None:
    truth = MemoryTruth(capacity=2)
    for stamp in (1, 2, 3):
        truth.record(stamp, f"t{stamp}")
    assert (truth.get(1), truth.get(3), len(truth)) == (None, "t3", 2)
    c = SimCounters(memories=5, memory_unscored=2, memory_exact=3)
    assert c.memories_scored == 3 and "memory exact 3/3" in c.summary()


def test_scene_truth_states_every_task_and_answers() -> None:
    from oxygen_ros.toy.sim.scoring import TaskScore, scene_truth
    from oxygen_ros.toy.world import TabletopWorld, answer, expert_subtask, narration_text

    world = TabletopWorld(seed=3)
    truth = scene_truth(world)
    assert truth["memory"] == world.memory_text() and truth["subtask"] == expert_subtask(world)
    assert truth["narration"] == narration_text(world)
    assert truth["answers"] and all(answer(world, q) == a for q, a in truth["answers"].items())
    score = TaskScore()
    assert (score.add(" a ", "a"), score.add("b", "a"), score.add("c", None)) == (True, False, None)
    assert (score.received, score.scored, score.exact, score.last) == (3, 2, 1, ("b", "a"))


def test_find_config_prefers_the_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from oxygen_ros.toy.demo import config

    repo = Path(__file__).resolve().parents[1]
    assert config.find_config("tabletop") == repo / "config" / "tabletop.yaml"
    # an install: no checkout, no ament index; <sys.prefix>/share/oxygen_ros/config
    monkeypatch.setattr(config, "source_checkout", lambda: None)
    monkeypatch.setattr(config, "_ament_share", lambda: None)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "share" / "oxygen_ros" / "config")):
        config.find_config("tabletop")
    (tmp_path / "share" / "oxygen_ros" / "config").mkdir(parents=True)
    (tmp_path / "share" / "oxygen_ros" / "config" / "tabletop.yaml").write_text("{}\n")
    assert config.find_config("tabletop.yaml") == tmp_path / "share" / "oxygen_ros" / "config" / "tabletop.yaml"
    # the ament index (a sourced colcon install) comes before sys.prefix
    share = tmp_path / "ws" / "share" / "oxygen_ros"
    (share / "config").mkdir(parents=True)
    (share / "config" / "tabletop.yaml").write_text("{}\n")
    monkeypatch.setattr(config, "_ament_share", lambda: share)
    assert config.find_config("tabletop") == share / "config" / "tabletop.yaml"
