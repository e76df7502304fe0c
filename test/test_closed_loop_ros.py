"""The README's demo as a test: the oxygen node (a separate process, the committed toy model) drives the tabletop
simulator node over real DDS topics; the robot must complete tasks while the node's memories, narration and subtasks
(which also condition its actions) and its answers to questions over ``~/ask`` are scored against the world's truth."""

from __future__ import annotations

import io

import pytest
from conftest import require_ros, ros_domain

require_ros()

from rich.console import Console  # noqa: E402

from oxygen_ros.policy.shipped_model import TOY_MODEL_DIR, toy_model_available  # noqa: E402
from oxygen_ros.toy.demo import main, print_summary, run_demo  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

DOMAIN = ros_domain()


def test_committed_model_is_present() -> None:
    assert toy_model_available(), f"the package's default model is missing from {TOY_MODEL_DIR}"


def enough(s: dict) -> bool:
    """The counts the test scores (at the 10 Hz target, 20 s give them; a busy host's node needs longer)."""
    scored = [s.get("language_exact", {}).get(task, (0, 0))[1] for task in ("narration", "subtask")]
    return (s["tasks_completed"] >= 1 and s["frames"] >= 50 and s["language_outputs"] >= 20
            and s["memories_scored"] >= 20 and min(scored) >= 10 and s.get("answers_scored", 0) >= 2)


def test_demo_completes_tasks_over_ros() -> None:
    console = Console(file=io.StringIO(), width=140)
    # 20 s, then on until the counts below are in (at most 90 s): waits for them instead of racing the frame rate
    summary = run_demo(duration=20.0, domain_id=DOMAIN, console=console, until=enough, max_duration=90.0)
    log = console.file.getvalue()
    assert summary.node_exit_code == 0, log
    assert summary.tasks_completed >= 1, log
    assert summary.frames >= 50 and summary.language_outputs >= 20, log
    assert summary.memories_scored >= 20 and summary.memories_exact / summary.memories_scored >= 0.7, log
    # the preset's other streams and the questions over ~/ask (asked every 3 s), all scored against the world
    for task in ("narration", "subtask"):
        exact, scored = summary.language_exact[task]
        assert scored >= 10 and exact / scored >= 0.7, (task, log)
    assert summary.answers_scored >= 2 and summary.answers_exact / summary.answers_scored >= 0.5, log
    print_summary(summary, console)
    assert "tasks done / episodes" in console.file.getvalue() and "answers exact" in console.file.getvalue()


def test_demo_rejects_an_unknown_scene(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--scene", "mars"])
    assert "invalid choice" in capsys.readouterr().err


def test_node_builds_the_same_model_input_as_training_and_evaluation() -> None:
    """The simulator's messages through the node's observation builder == the training/evaluation conversion, and
    the node's action post-processing == the evaluation's, for the committed model."""
    import numpy as np
    import torch
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String

    from oxygen_ros.policy import load_policy
    from oxygen_ros.ros.diagnostics import ReasonCounter
    from oxygen_ros.ros.image_conversion import array_to_image_msg
    from oxygen_ros.ros.input_store import InputStore
    from oxygen_ros.ros.observation_builder import ObservationBuilder
    from oxygen_ros.ros.stamps import time_msg
    from oxygen_ros.toy.train.policy import NormStats, to_model_observation
    from oxygen_ros.toy.world import CAMERAS, JOINT_NAMES, TabletopWorld

    policy = load_policy(TOY_MODEL_DIR)
    tok = policy.tokenizer
    stats = NormStats.load(TOY_MODEL_DIR)
    world = TabletopWorld()
    for seed in range(5):
        obs = world.reset(1_000_000 + seed)
        world.step(np.array([0.3 + 0.1 * seed, 0.6, 0.5, 0.0]))
        obs = world.observation()
        store = InputStore(CAMERAS, JOINT_NAMES, ReasonCounter(None, "rejected"))
        stamp = 10**9
        for i, cam in enumerate(CAMERAS):
            store.on_image(i, array_to_image_msg(obs.images[cam], stamp))
        js = JointState(name=list(JOINT_NAMES), position=[float(v) for v in obs.state])
        js.header.stamp = time_msg(stamp)
        store.on_joint_state(js)
        store.on_instruction(String(data=obs.instruction))
        built = ObservationBuilder(store, policy, 0.5).build(stamp)
        ref = to_model_observation(obs, tok, stats)
        node_obs = built.prepared.observation
        assert torch.equal(node_obs.images, ref.images)
        # the same valid prompt tokens (the node leaves out the masked padding the training batches carry)
        assert torch.equal(node_obs.tokens[node_obs.token_mask], ref.tokens[ref.token_mask])
        assert torch.equal(node_obs.state, ref.state)
        chunk = np.random.default_rng(seed).uniform(-1, 1, (8, 4))
        np.testing.assert_array_equal(policy.postprocess(chunk, built.prepared),
                                      stats.actions_from_model(chunk, obs.state))
