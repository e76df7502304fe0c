"""Subtask conditioning: the subtask stream's latest finished output enters the action prompt of later frames
(pi0.5's two-stage inference, run asynchronously beside the action loop); off by default."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import random_policy, require_ros, ros_domain

from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.policy import Policy, RawObservation
from oxygen_ros.policy.language import LanguageSchedule
from oxygen_ros.policy.runner import FrameRunner, seeded_noise

CAMS = ("base_0_rgb", "left_wrist_0_rgb")
SEC = 1_000_000_000


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Policy:
    return random_policy(tmp_path_factory, max_token_len=96)


def _runner(policy: Policy, mode: str = "oxygen", condition_on: str = "subtask", k: int = 2) -> FrameRunner:
    tok = policy.tokenizer
    streams = (LanguageSchedule(every_n_frames=3, task="subtask", max_new_tokens=4, name="subtask"),
               LanguageSchedule(every_n_frames=2, task="memory", max_new_tokens=3, name="memory"))
    return FrameRunner(policy, lambda: build_engine(policy.model, EngineConfig(
        mode=mode, num_steps=2, k=k, max_new_tokens=4, max_prompt_tokens=16, eos_id=-1),
        detokenize=tok.decode), streams, seeded_noise(1), condition_on=condition_on)


def _frames(n: int, change_at: int | None = None):
    rng = np.random.default_rng(0)
    for i in range(n):
        instruction = "put the red block on the blue plate" if change_at is None or i < change_at else "stop"
        yield i, RawObservation({c: rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for c in CAMS},
                                rng.uniform(-1, 1, 8), instruction)


def test_the_latest_finished_subtask_conditions_the_next_frames(policy) -> None:
    runner = _runner(policy)
    tok = policy.tokenizer
    latest, seen = "", []
    for i, raw in _frames(10):
        out = runner.step(raw, stamp_ns=SEC + i * SEC // 10)
        assert out.chunk.subtask == latest  # the chunk says what it was conditioned on
        want = tok.tokenize_action_prompt(raw.task, out.prepared.normalized_state, clip_state=True,
                                          **({"subtask": latest} if latest else {}))
        got = out.prepared.observation.tokens[0].tolist()
        assert got == want.ids[:want.num_tokens].tolist()
        for f in out.result.finished:
            if f.stream == "subtask":
                latest = f.text.strip()
                seen.append(latest)
    assert len(seen) >= 2 and all(seen)


def test_off_by_default_and_unknown_stream_is_an_error(policy) -> None:
    plain = _runner(policy, condition_on="")
    conditioned = _runner(policy)
    for i, raw in _frames(6):
        a = plain.step(raw, stamp_ns=SEC + i * SEC // 10)
        b = conditioned.step(raw, stamp_ns=SEC + i * SEC // 10)
        assert a.chunk.subtask == ""
        if not b.chunk.subtask:  # until the first subtask finished both prompts are upstream's
            assert np.array_equal(a.chunk.chunk, b.chunk.chunk)
    assert b.chunk.subtask  # by then a subtask conditioned the prompt
    with pytest.raises(ValueError, match="not configured"):
        _runner(policy, condition_on="planner")


def test_a_new_instruction_drops_the_old_subtask(policy) -> None:
    runner = _runner(policy, k=8)  # every request finishes on its own frame
    subtasks = [runner.step(raw, stamp_ns=SEC + i * SEC // 10).chunk.subtask for i, raw in _frames(8, change_at=4)]
    assert subtasks[1] and subtasks[3]  # from the subtask of frame 0 (frame 3 starts the next)
    assert subtasks[4] == ""  # the instruction changed: frame 3's subtask was made for the old one
    assert subtasks[5] == ""  # frame 4 started no subtask request (every 3rd frame); frame 6 does
    assert subtasks[7]


@pytest.mark.parametrize("mode", ["isolated", "shared_kv"])
def test_conditioned_actions_equal_across_engines(policy, mode) -> None:
    """Subtask texts are exact across engines, so the conditioned prompts and actions are too."""
    a, b = _runner(policy, "oxygen", k=8), _runner(policy, mode)
    for i, raw in _frames(8):
        x, y = a.step(raw, stamp_ns=SEC + i * SEC // 10), b.step(raw, stamp_ns=SEC + i * SEC // 10)
        assert x.chunk.subtask == y.chunk.subtask
        assert np.array_equal(x.chunk.chunk, y.chunk.chunk)


# ---------------------------------------------------------------------------------------------- the node
def test_parameters_name_a_configured_stream_and_a_real_adapter(tmp_path) -> None:
    from oxygen_ros.runtime.params import ParamError, validate

    base = {"model": "toy", "joint_names": ["a"], "language_streams": ["subtask", "memory"],
            "subtask.every_n_frames": 2, "memory.every_n_frames": 3}
    p = validate({**base, "subtask_conditioning": "subtask", "memory.adapter": "/some/lora"})
    assert p.subtask_conditioning == "subtask" and p.streams[1].adapter == "/some/lora"
    with pytest.raises(ParamError, match="'planner' is not one of language_streams"):
        validate({**base, "subtask_conditioning": "planner"})

    from oxygen_ros.engine.config import get_config
    from oxygen_ros.engine.lora import LoraAdapter, random_lora_weights
    from oxygen_ros.engine.model import Pi05Model
    from oxygen_ros.runtime.model_loader import load_adapter

    tiny, small = Pi05Model(get_config("tiny")), Pi05Model(get_config("small"))
    with pytest.raises(ValueError, match="memory.adapter: .* is not a PEFT adapter directory"):
        load_adapter(str(tmp_path / "missing"), "memory.adapter", tiny)
    path = LoraAdapter.save(tmp_path / "lora", random_lora_weights(tiny), 4, 8)
    assert load_adapter(str(path), "memory.adapter", tiny).weights
    with pytest.raises(ValueError, match="the model's projection is"):
        load_adapter(str(path), "memory.adapter", small)


@pytest.mark.ros
@pytest.mark.slow
def test_the_node_conditions_chunks_on_its_subtask_stream(tmp_path) -> None:
    """Over real DDS: a subtask stream conditions the action prompt, every chunk says which subtask it was
    conditioned on (one the node published on its language topic), and a memory stream decodes with its own
    adapter in the same node."""
    require_ros()
    from pathlib import Path

    from oxygen_ros.engine.config import get_config
    from oxygen_ros.engine.lora import LoraAdapter, random_lora_weights
    from oxygen_ros.engine.model import Pi05Model
    from oxygen_ros.testing import NodeProcess, Probe

    adapter = LoraAdapter.save(tmp_path / "memory_lora", random_lora_weights(Pi05Model(get_config("tiny"))), 4, 8)
    repo = Path(__file__).resolve().parents[1]
    domain = ros_domain()
    joints = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
    node = NodeProcess(repo / "config" / "synthetic.yaml", {
        "control_rate_hz": 5.0, "max_new_tokens": 4, "k": 4,
        "language_streams": ["subtask", "memory"], "subtask.every_n_frames": 2, "memory.every_n_frames": 3,
        "memory.adapter": str(adapter), "subtask_conditioning": "subtask",
        "graphs": "static",  # static-shape steps, the adapter's rows eager: both in one node
    }, domain_id=domain)
    probe = Probe([(c, f"/cameras/{c}/image_raw") for c in CAMS], joints, image_size=48, domain_id=domain)
    try:
        node.start()
        assert probe.wait_for_subscribers(60) or "configure failed" in node.output(), node.output()
        if "configure failed" in node.output():
            pytest.fail(node.output())
        probe.start_stream(10.0)
        probe.publish_instruction("put the red block on the blue plate")
        assert probe.wait_for(lambda: sum(bool(c.subtask) for c in probe.chunks()) >= 3, 30), node.output()[-3000:]
        conditioned = [c for c in probe.chunks() if c.subtask]

        def published() -> set[str]:
            return {o.text.strip() for o in probe.language() if o.stream == "subtask"}

        # a subtask's LanguageOutput and the chunks it conditions travel on two topics: wait for the outputs
        assert probe.wait_for(lambda: {c.subtask for c in conditioned} <= published(), 5), \
            ({c.subtask for c in conditioned}, published())
        first = min(c.frame_index for c in conditioned)
        assert all(c.subtask == "" for c in probe.chunks() if c.frame_index < first)
        assert probe.wait_for(lambda: any(o.stream == "memory" for o in probe.language()), 10)

        def diagnosed() -> bool:  # /diagnostics names the subtask the next chunks are conditioned on
            d = probe.diagnostics()
            return "subtask" in d and d["subtask"] in {o.text.strip() for o in probe.language()
                                                       if o.stream == "subtask"} | {""}

        assert probe.wait_for(diagnosed, 5), probe.diagnostics()
        assert probe.diagnostics().get("graphs") == "static"
        # kernels: auto measured the stages at configure (or read a stored verdict) and reports the choice
        assert re.fullmatch(r"prefill (packed|plain), decode (packed|plain), denoise (packed|plain) "
                            r"\((measured|cached|unavailable)\)", probe.diagnostics().get("kernels", ""))
    finally:
        probe.close()
        assert node.stop() == 0
