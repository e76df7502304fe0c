"""Language streams: several language tasks at their own cadences from one shared prefix, configured in the
plugin-list style (``language_streams: [memory, narration]`` + ``<name>.<field>``). The frame runner's schedule,
oxygen == isolated per stream, the parameters (flat ROS names and nested YAML), and the node over real DDS.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from conftest import random_policy, require_ros, ros_domain

from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.policy import Policy, RawObservation
from oxygen_ros.policy.language import LanguageSchedule
from oxygen_ros.policy.runner import FrameRunner, seeded_noise

REPO = Path(__file__).resolve().parents[1]
CAMS = ("base_0_rgb", "left_wrist_0_rgb")
SEC = 1_000_000_000


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Policy:
    return random_policy(tmp_path_factory, max_token_len=64)


STREAMS = (
    LanguageSchedule(every_n_frames=2, task="memory", max_new_tokens=3, name="memory"),
    LanguageSchedule(task="narration", max_new_tokens=3, name="narration", period_s=0.25),
    LanguageSchedule(task="custom", prompt="Question: {instruction}? ", max_new_tokens=3, name="ask",
                     trigger="on_instruction_change", priority=5),
)


def run(policy: Policy, mode: str, frames: int = 8) -> tuple[list, list[np.ndarray]]:
    """Frames 0.1 s apart (stamps from 1 s), the instruction changing at frame 4; every request finishes on its
    frame (k covers N), so the finished list shows which frame started what."""
    tok = policy.tokenizer
    runner = FrameRunner(policy, lambda: build_engine(policy.model, EngineConfig(
        mode=mode, num_steps=2, k=8, max_new_tokens=3, max_prompt_tokens=16, eos_id=tok.eos_id),
        detokenize=tok.decode), STREAMS, seeded_noise(3))
    finished, actions = [], []
    rng = np.random.default_rng(0)
    for i in range(frames):
        instruction = "pick up the red block" if i < 4 else "put it on the plate"
        raw = RawObservation({c: rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for c in CAMS},
                             rng.uniform(-1, 1, 8), instruction)
        out = runner.step(raw, stamp_ns=SEC + i * SEC // 10)
        finished += out.result.finished
        actions.append(out.chunk.actions)
    return finished, actions


def test_each_stream_starts_requests_at_its_own_cadence(policy) -> None:
    finished, _ = run(policy, "oxygen")
    frames = defaultdict(list)
    for f in finished:
        frames[f.stream].append(f.frame_index)
    assert frames["memory"] == [0, 2, 4, 6], "every 2nd frame"
    assert frames["narration"] == [0, 3, 6], "every 0.25 s of observation time (frames 0.1 s apart)"
    assert frames["ask"] == [0, 4], "once per new instruction"
    assert {f.task for f in finished if f.stream == "ask"} == {"custom"}
    first = sorted((f for f in finished if f.frame_index == 0), key=lambda f: f.request_id)
    assert [f.stream for f in first] == ["ask", "memory", "narration"], "admitted by priority, then in order"


def test_a_continuous_stream_starts_its_next_request_the_frame_after_the_last_finished(policy) -> None:
    """k=2: a request (its prompt, then 5 tokens) spans several frames; with one always in flight, the next starts
    on the frame after the last finished, and never earlier."""
    tok = policy.tokenizer
    stream = LanguageSchedule(task="narration", max_new_tokens=5, name="narration", trigger="continuous")
    runner = FrameRunner(policy, lambda: build_engine(policy.model, EngineConfig(
        mode="oxygen", num_steps=2, k=2, max_new_tokens=5, max_prompt_tokens=16, eos_id=-1),
        detokenize=tok.decode), stream, seeded_noise(3))
    rng = np.random.default_rng(0)
    started, ended = [], []
    for i in range(10):
        raw = RawObservation({c: rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for c in CAMS},
                             rng.uniform(-1, 1, 8), "pick up the red block")
        out = runner.step(raw, stamp_ns=SEC + i * SEC // 10)
        if out.new_requests:
            started.append(i)
        ended += [i for f in out.result.finished if f.stream == "narration"]
        assert runner.backlog <= 1, "one in flight at a time"
    assert len(started) >= 3 and started[0] == 0
    assert started[1:] == [e + 1 for e in ended[:len(started) - 1]]
    runner.reset()
    assert runner._due_requests(0, "x"), "a fresh engine has nothing in flight: the stream starts again"


def test_oxygen_equals_isolated_on_every_stream_and_the_actions(policy) -> None:
    oxygen, a = run(policy, "oxygen")
    isolated, b = run(policy, "isolated")
    key = lambda f: (f.frame_index, f.stream)  # noqa: E731
    assert [(key(f), f.tokens) for f in sorted(oxygen, key=key)] == [(key(f), f.tokens) for f in
                                                                      sorted(isolated, key=key)]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5)


def test_stream_names_are_unique() -> None:
    with pytest.raises(ValueError, match="unique"):
        FrameRunner.__init__(object.__new__(FrameRunner), None, lambda: None,  # type: ignore[arg-type]
                             [LanguageSchedule(1, "memory"), LanguageSchedule(2, "memory")])


# ---------------------------------------------------------------------------------------------- parameters
def test_streams_from_flat_and_nested_parameters() -> None:
    from oxygen_ros.runtime.params import ParamError, validate

    base = {"model": "toy", "joint_names": ["a"], "max_new_tokens": 20}
    p = validate({**base, "language_streams": ["memory", "narration", "where"], "memory.every_n_frames": 10,
                  "request_task": "subtask",  # the one-stream shorthand: ignored once language_streams is set
                  "narration": {"period_s": 0.5, "max_new_tokens": 8},  # a YAML file's nested form
                  "where.prompt": "Where is the {instruction}? ", "where.trigger": "on_instruction_change",
                  "where.priority": 3})
    memory, narration, where = p.streams
    assert (memory.task, memory.every_n_frames) == ("memory", 10)
    assert (narration.task, narration.period_s, narration.max_new_tokens) == ("narration", 0.5, 8)
    assert (where.task, where.trigger, where.priority) == ("custom", "on_instruction_change", 3)
    assert p.extra == {}, "stream parameters are consumed, not reported as unknown"
    assert [s.name for s in validate(base).streams] == ["memory"], "the one-stream shorthand"

    with pytest.raises(ParamError) as e:
        validate({**base, "language_streams": ["memory", "x y", "chat"], "memory.every_n_frames": -1,
                  "chat.every_n_frames": 1})
    problems = "\n".join(e.value.problems)
    for expected in ("memory.every_n_frames: must be >= 0", "'x y' is not a valid stream name",
                     "chat.prompt: required"):
        assert expected in problems, problems
    with pytest.raises(ParamError, match="max_new_tokens: 99 > max_new_tokens=20"):
        validate({**base, "language_streams": ["memory"], "memory.every_n_frames": 1,
                  "memory.max_new_tokens": 99})
    with pytest.raises(ParamError, match="needs memory.every_n_frames or memory.period_s"):
        validate({**base, "language_streams": ["memory"]})


# ---------------------------------------------------------------------------------------------- over DDS
@pytest.mark.ros
@pytest.mark.slow
def test_the_node_publishes_every_stream_with_its_name() -> None:
    require_ros()
    from oxygen_ros.msg import LanguageOutput

    from oxygen_ros.testing import NodeProcess, Probe

    domain = ros_domain()
    joints = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
    node = NodeProcess(REPO / "config" / "synthetic.yaml", {
        "control_rate_hz": 5.0, "max_new_tokens": 4, "k": 4, "language_topic_per_stream": True,
        "language_streams": ["memory", "narration"], "memory.every_n_frames": 2, "narration.period_s": 0.6,
        "memory.priority": 1, "speculate": 3,  # drafts from each stream's last output (exact)
    }, domain_id=domain)
    probe = Probe([(c, f"/cameras/{c}/image_raw") for c in CAMS], joints, image_size=48, domain_id=domain)
    per_stream: list = []
    try:
        node.start()
        assert probe.wait_for_subscribers(60) or "configure failed" in node.output(), node.output()
        if "configure failed" in node.output():
            pytest.fail(node.output())
        probe.node.create_subscription(LanguageOutput, "/oxygen/language/narration", per_stream.append, 50)
        probe.start_stream(10.0)
        probe.publish_instruction("put the red block on the blue plate")
        assert probe.wait_for(lambda: len({o.stream for o in probe.language()}) == 2 and len(per_stream) >= 2,
                              20), node.output()[-3000:]
        assert probe.wait_for(lambda: sum(o.stream == "memory" for o in probe.language()) >= 2, 20), \
            node.output()[-3000:]
        outs = probe.language()
        memory = [o.frame_index for o in outs if o.stream == "memory"]
        narration = [o.frame_index for o in outs if o.stream == "narration"]
        assert all(i % 2 == 0 for i in memory) and len(memory) >= 2
        assert all(b - a >= 3 for a, b in zip(narration, narration[1:], strict=False)), narration
        assert {o.stream for o in per_stream} == {"narration"}, "the per-stream topic carries only its stream"
        assert {(o.stream, o.task) for o in outs} == {("memory", "memory"), ("narration", "narration")}
        # /diagnostics is periodic (1 Hz): wait for the status that counts the outputs already received
        assert probe.wait_for(lambda: probe.diagnostic_count("stream.memory.outputs") >= 1, 5), probe.diagnostics()
        assert probe.wait_for(lambda: 0.0 <= float(probe.diagnostics().get("draft_acceptance", "-1")) <= 1.0, 6), \
            probe.diagnostics().get("draft_acceptance")
    finally:
        probe.close()
        assert node.stop() == 0
