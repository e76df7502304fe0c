"""Questions over the ``~/ask`` action (issue 12): the engine's request tags, per-request rejection reasons,
cancel and partial in every mode; the frame runner's ad-hoc requests (submit by priority, cancel); the node's
action server over real DDS (feedback, result, cancel, pool-full rejection, batching of concurrent goals).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_model, make_observation, random_policy, require_ros, ros_domain

from oxygen_ros.engine import ENGINE_MODES
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.requests import Frame, LanguageRequest
from oxygen_ros.policy import Policy, RawObservation
from oxygen_ros.policy.language import LanguageSchedule
from oxygen_ros.policy.runner import FrameRunner, seeded_noise
from oxygen_ros.testing.probe import wait_for

REPO = Path(__file__).resolve().parents[1]
CAMS = ("base_0_rgb", "left_wrist_0_rgb")
JOINTS = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
SEC = 1_000_000_000
NO_EOS = -1


# ---------------------------------------------------------------------------------------------- engine
@pytest.fixture(scope="module")
def model():
    return make_model(seed=5, std=0.3)


def frame(cfg, i: int, requests=()) -> Frame:
    """Frame ``i``: its own observation and noise, stamped 1000 + i."""
    obs = make_observation(cfg, prompt_lens=[8 + i % 3], seed=i)
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(i))
    return Frame(obs, list(requests), noise, stamp=1000 + i)


def engine(model, mode: str, **cfg):
    cfg.setdefault("eos_id", NO_EOS)
    cfg.setdefault("max_new_tokens", 8)
    cfg.setdefault("max_prompt_tokens", 4)
    return build_engine(model, EngineConfig(mode=mode, num_steps=2, **cfg))


def close(eng) -> None:
    getattr(eng, "close", lambda: None)()


@pytest.mark.parametrize("mode", ENGINE_MODES)
def test_tags_and_rejection_reasons_in_every_mode(model, mode) -> None:
    eng = engine(model, mode, k=2, max_inflight=1)
    try:
        reqs = [LanguageRequest("answer", 4, [5, 6], tag="a"),
                LanguageRequest("answer", 9, tag="long"),
                LanguageRequest("answer", 0, tag="zero"),
                LanguageRequest("answer", 2, [5, 6, 7, 8, 9], tag="prompt"),
                LanguageRequest("memory", 3, tag="b")]
        first = eng.step(frame(model.config, 0, reqs))
        expected = {"long": "max_new_tokens out of range", "zero": "max_new_tokens out of range",
                    "prompt": "prompt too long"}
        if mode == "oxygen":  # "a" (5 steps at k=2) holds the only slot: the pool is full for "b"
            expected["b"] = "pool full"
        assert {req.tag: why for req, why in first.rejected_requests} == expected
        assert first.rejected == len(expected) == eng.totals["rejected"]
        finished = list(first.finished)
        for i in range(1, 4):
            finished += eng.step(frame(model.config, i)).finished
        assert sorted(f.tag for f in finished) == (["a"] if mode == "oxygen" else ["a", "b"])
        assert all(f.stamp == 1000 and not f.cancelled and not f.dropped for f in finished)
        assert [len(f.tokens) for f in finished if f.tag == "a"] == [4]
    finally:
        close(eng)


def test_cancel_evicts_between_frames_frees_the_slot_and_reports_the_tokens_so_far(model) -> None:
    cfg = model.config
    eng = engine(model, "oxygen", k=1, max_inflight=1)
    full = engine(model, "oxygen", k=1, max_inflight=1)  # the same request, not cancelled
    for e in (eng, full):
        e.step(frame(cfg, 0, [LanguageRequest("answer", 4, [7, 8], tag="q")]))
        e.step(frame(cfg, 1))
        e.step(frame(cfg, 2))
    so_far = eng.partial("q")
    assert so_far is not None and len(so_far) == 2, "k=1: prompt 7 (frame 0), prompt 8 -> token (1), token (2)"
    assert eng.slots.num_free == eng.slots.num_slots - 1
    assert eng.cancel("q") and not eng.cancel("q") and not eng.cancel("nothing") and not eng.cancel(None)
    assert eng.partial("q") is None and eng.backlog == 0 and eng.slots.num_free == eng.slots.num_slots

    r = eng.step(frame(cfg, 3, [LanguageRequest("answer", 2, tag="next")]))
    [cancelled] = [f for f in r.finished if f.cancelled]
    assert (cancelled.tag, cancelled.tokens, cancelled.dropped, cancelled.frame_index, cancelled.stamp,
            cancelled.frames) == ("q", so_far, False, 0, 1000, 3)
    assert not r.rejected_requests and r.dropped == 0 and eng.totals["dropped"] == 0, "the freed slot took it"
    assert eng.partial("next") is not None
    later = [f for i in range(3, 5) for f in full.step(frame(cfg, i)).finished if f.tag == "q"]
    assert later[0].tokens[:2] == so_far, "what it had so far is what it would have generated"


def test_a_dropped_request_keeps_its_tag(model) -> None:
    eng = engine(model, "oxygen", k=1, max_inflight=1, overflow="drop_oldest")
    eng.step(frame(model.config, 0, [LanguageRequest("answer", 8, tag="old")]))
    r = eng.step(frame(model.config, 1, [LanguageRequest("answer", 8, tag="new")]))
    assert [(f.tag, f.dropped, f.cancelled) for f in r.finished] == [("old", True, False)]
    assert eng.partial("new") is not None and not r.rejected_requests


@pytest.mark.parametrize("mode", [m for m in ENGINE_MODES if m != "oxygen"])
def test_modes_that_decode_within_the_frame_have_nothing_to_cancel(model, mode) -> None:
    eng = engine(model, mode)
    try:
        r = eng.step(frame(model.config, 0, [LanguageRequest("answer", 3, tag="q")]))
        assert [(f.tag, len(f.tokens)) for f in r.finished] == [("q", 3)]
        assert eng.partial("q") is None and not eng.cancel("q")
        assert not any(f.cancelled for f in eng.step(frame(model.config, 1)).finished)
    finally:
        close(eng)


# ---------------------------------------------------------------------------------------------- frame runner
@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Policy:
    return random_policy(tmp_path_factory, max_token_len=64)


def raw(i: int) -> RawObservation:
    rng = np.random.default_rng(i)
    return RawObservation({c: rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for c in CAMS},
                          rng.uniform(-1, 1, 8), "pick up the red block")


def test_runner_admits_submitted_requests_by_priority_and_cancels_them(policy) -> None:
    tok = policy.tokenizer
    runner = FrameRunner(policy, lambda: build_engine(policy.model, EngineConfig(
        mode="oxygen", num_steps=2, k=2, max_new_tokens=6, max_prompt_tokens=32, eos_id=NO_EOS),
        detokenize=tok.decode), LanguageSchedule(every_n_frames=1, task="memory", max_new_tokens=2, name="memory"),
        seeded_noise(0))
    question = tok.tokenize_question("what is on the table?")
    runner.submit(LanguageRequest("answer", 6, question, stream="ask", priority=10, tag="q"))
    runner.submit(LanguageRequest("answer", 6, stream="ask", priority=10, tag="gone"))
    runner.submit(LanguageRequest("answer", 1, stream="ask", priority=-1, tag="late"))
    assert runner.cancel("gone"), "still queued: dropped, it never runs"
    out = runner.step(raw(0), stamp_ns=SEC)
    ids = {f.tag or f.stream: f.request_id for f in out.result.finished}
    ids |= {s.tag or s.request.stream: s.request_id for s in runner.engine.inflight}
    assert ids == {"q": 0, "memory": 1, "late": 2}, "the question first (priority 10), the stream (0), then -1"
    assert out.new_requests == 3 and runner.engine.partial("q") is not None
    assert not runner.cancel("q"), "in flight: the engine evicts it before the next frame"
    out = runner.step(raw(1), stamp_ns=2 * SEC)
    [q] = [f for f in out.result.finished if f.tag == "q"]
    assert q.cancelled and q.stamp == SEC and isinstance(q.text, str) and not out.result.dropped
    assert not runner.engine.inflight or all(s.tag is None for s in runner.engine.inflight)
    assert all(f.tag != "gone" for f in out.result.finished)


# ---------------------------------------------------------------------------------------------- over DDS
@dataclass
class Sent:
    """One goal sent by the test's action client."""

    accepted: object  # rclpy Future of the goal handle
    feedback: list = field(default_factory=list)
    handle: object = None
    result: object = None  # rclpy Future of the GetResult response


class Asker:
    """An rclpy ActionClient for ``/oxygen/ask`` on ``node`` (which an executor spins in another thread)."""

    def __init__(self, node) -> None:
        from oxygen_ros.action import Ask
        from rclpy.action import ActionClient

        self.Ask = Ask
        self.client = ActionClient(node, Ask, "/oxygen/ask")

    def send(self, question: str = "what is on the table?", **fields) -> Sent:
        sent = Sent(None)
        sent.accepted = self.client.send_goal_async(self.Ask.Goal(question=question, **fields),
                                                    feedback_callback=lambda m: sent.feedback.append(m.feedback))
        return sent

    def accepted(self, sent: Sent, timeout: float = 10.0) -> bool:
        assert wait_for(sent.accepted.done, timeout), "no goal response"
        sent.handle = sent.accepted.result()
        if sent.handle.accepted:
            sent.result = sent.handle.get_result_async()
        return sent.handle.accepted

    def result(self, sent: Sent, timeout: float = 20.0):
        """(status, Ask.Result) of an accepted goal."""
        if sent.handle is None:
            assert self.accepted(sent), "goal rejected"
        assert wait_for(sent.result.done, timeout), "no result"
        response = sent.result.result()
        return response.status, response.result


@pytest.fixture(scope="module")
def ask_node():
    """The node (a separate process, random tiny model) with no language streams: only questions use its pool of
    two slots; k=4 tokens per frame, so an answer takes several frames (the question prompt alone takes ~5)."""
    require_ros()
    from oxygen_ros.testing import NodeProcess, Probe

    domain = ros_domain()
    node = NodeProcess(REPO / "config" / "synthetic.yaml", {
        "control_rate_hz": 10.0, "num_steps": 2, "request_every_n_frames": 0, "max_inflight": 2, "k": 4,
        "max_new_tokens": 30, "ask.max_new_tokens": 12, "ask.max_pending": 4,  # questions fit ask.max_prompt_tokens
    }, domain_id=domain)
    probe = Probe([(c, f"/cameras/{c}/image_raw") for c in CAMS], JOINTS, image_size=48, domain_id=domain)
    try:
        node.start()
        if not probe.wait_for_subscribers(60) or "configure failed" in node.output():
            pytest.fail(node.output()[-3000:])
        probe.start_stream(10.0)
        probe.publish_instruction("put the red block on the blue plate")
        asker = Asker(probe.node)
        assert asker.client.wait_for_server(timeout_sec=20), node.output()[-3000:]
        assert probe.wait_for(lambda: len(probe.chunks()) >= 2, 20), node.output()[-3000:]
        yield node, probe, asker
    finally:
        probe.close()
        assert node.stop() == 0


def _status():
    from action_msgs.msg import GoalStatus

    return GoalStatus


@pytest.mark.ros
@pytest.mark.slow
def test_feedback_streams_the_answer_then_the_result_names_its_observation(ask_node) -> None:
    from oxygen_ros.ros.stamps import stamp_to_ns

    node, probe, asker = ask_node
    sent = asker.send()
    status, result = asker.result(sent)
    assert status == _status().STATUS_SUCCEEDED, (result, node.output()[-2000:])
    fb = sent.feedback
    assert len(fb) >= 3, fb
    assert [f.frames for f in fb] == list(range(1, len(fb) + 1)), "one feedback per frame in flight"
    tokens = [f.tokens for f in fb]
    assert tokens == sorted(tokens) and len({t for t in tokens if t}) >= 2, tokens
    assert len({f.text for f in fb if f.tokens}) >= 2, "the text grows"
    assert result.error == "" and result.stream == "ask" and result.latency_frames > len(fb) - 1 >= 1
    assert result.latency_s > 0 and result.text
    stamp = stamp_to_ns(result.observation_stamp)
    assert stamp in probe.stamps_sent(), "stamped with the observation it was answered from"
    assert probe.wait_for(lambda: any(o.stream == "ask" and o.request_id == result.request_id
                                      for o in probe.language()), 6)
    [out] = [o for o in probe.language() if o.stream == "ask" and o.request_id == result.request_id]
    assert (out.text, out.task, stamp_to_ns(out.header.stamp)) == (result.text, "answer", stamp)
    chunk = [c for c in probe.chunks() if c.frame_index == out.frame_index]
    assert chunk and stamp_to_ns(chunk[0].header.stamp) == stamp, "the frame whose chunk has that stamp"


@pytest.mark.ros
@pytest.mark.slow
def test_concurrent_questions_decode_in_one_batch(ask_node) -> None:
    node, probe, asker = ask_node
    sent = [asker.send("what is on the table?", max_new_tokens=8), asker.send("where is the red block?",
                                                                               max_new_tokens=8)]
    results = [asker.result(s) for s in sent]
    assert [s for s, _ in results] == [_status().STATUS_SUCCEEDED] * 2, results
    assert results[0][1].request_id != results[1][1].request_id
    assert probe.wait_for(lambda: probe.diagnostic_count("ask.max_batch") >= 2 and probe.diagnostic_count(
        "ask.succeeded") >= 2 and probe.diagnostic_count("ask.pending") == 0, 8), probe.diagnostics()  # at 1 Hz


@pytest.mark.ros
@pytest.mark.slow
def test_cancel_ends_the_goal_canceled_and_frees_its_slot(ask_node) -> None:
    node, probe, asker = ask_node
    status = _status()
    a, b = asker.send(max_new_tokens=30), asker.send("where is the red block?", max_new_tokens=30)
    assert asker.accepted(a) and asker.accepted(b)
    assert probe.wait_for(lambda: a.feedback and b.feedback, 10), "both in flight: the pool (2 slots) is full"
    cancel = a.handle.cancel_goal_async()
    assert probe.wait_for(cancel.done, 5) and cancel.result().goals_canceling
    got, result = asker.result(a, 10)
    assert got == status.STATUS_CANCELED, (result, node.output()[-2000:])
    assert result.latency_frames >= 1 and result.error == ""
    assert not b.result.done(), "b still holds the other slot"
    c = asker.send(max_new_tokens=4)
    got, result = asker.result(c)
    assert got == status.STATUS_SUCCEEDED, (result, "the cancelled goal's slot was not freed")
    assert asker.result(b)[0] == status.STATUS_SUCCEEDED


@pytest.mark.ros
@pytest.mark.slow
def test_a_full_pool_aborts_the_goal_with_the_reason_and_bad_goals_are_refused(ask_node) -> None:
    node, probe, asker = ask_node
    status = _status()
    sent = [asker.send(max_new_tokens=30), asker.send(max_new_tokens=30), asker.send(max_new_tokens=4)]
    results = [asker.result(s) for s in sent]
    aborted = [r for s, r in results if s == status.STATUS_ABORTED]
    assert len(aborted) == 1 and "pool full" in aborted[0].error and aborted[0].text == aborted[0].error, results
    assert sum(s == status.STATUS_SUCCEEDED for s, _ in results) == 2
    assert probe.wait_for(lambda: probe.diagnostic_count("requests_rejected") >= 1, 6)

    assert not asker.accepted(asker.send("")), "no question, no prompt, no built-in task: rejected"
    assert not asker.accepted(asker.send("x" * 2000)), "longer than ask.max_question_chars"
    got, result = asker.result(asker.send(max_new_tokens=99))
    assert got == status.STATUS_ABORTED and "max_new_tokens out of range" in result.error
    got, result = asker.result(asker.send("why " * 40))
    assert got == status.STATUS_ABORTED and "prompt too long" in result.error
    got, result = asker.result(asker.send("", task="narration", max_new_tokens=3))
    assert got == status.STATUS_SUCCEEDED and result.stream == "ask", "a built-in task's prompt, asked now"
    assert probe.wait_for(lambda: probe.diagnostic_count("rejected.ask_empty") >= 1, 6)


@pytest.mark.ros
@pytest.mark.slow
def test_the_oxygen_ask_command_prints_feedback_and_the_answer(ask_node) -> None:
    """``oxygen-ask`` (the venv's stand-in for ``ros2 action send_goal --feedback``) in its own process."""
    import subprocess
    import sys

    node, _, _ = ask_node
    run = subprocess.run([sys.executable, "-m", "oxygen_ros.tools.ask", "where is the red block?",
                          "--max-new-tokens", "8", "--timeout", "60"], env=node.env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.strip().splitlines()
    assert sum(line.startswith("  [") for line in lines) >= 1, run.stdout  # feedback while it decoded
    assert "frames," in lines[-1] and "request" in lines[-1], run.stdout
    bad = subprocess.run([sys.executable, "-m", "oxygen_ros.tools.ask", "x", "--max-new-tokens", "999",
                          "--timeout", "60"], env=node.env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "max_new_tokens" in bad.stderr, bad.stdout + bad.stderr


@pytest.mark.ros
def test_goals_follow_the_node_lifecycle() -> None:
    """In-process node, no camera input (every frame is skipped, so a question waits): rejected while inactive,
    aborted on deactivate, and no server after cleanup."""
    require_ros()
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.node import Node
    from rclpy.parameter import Parameter

    from oxygen_ros.ros.node import OxygenNode

    status, ok = _status(), TransitionCallbackReturn.SUCCESS
    threads = torch.get_num_threads()
    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain())
    values = {"autostart": False, "model": "random_tiny", "device": "cpu", "torch_threads": 1, "joint_names": JOINTS,
              "max_prompt_tokens": 32, "request_every_n_frames": 0}
    node = OxygenNode(context=ctx, parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])
    client_node = Node("ask_client", context=ctx)
    executor = SingleThreadedExecutor(context=ctx)
    executor.add_node(node)
    executor.add_node(client_node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        asker = Asker(client_node)
        assert node.trigger_configure() == ok
        assert asker.client.wait_for_server(timeout_sec=10)
        assert not asker.accepted(asker.send()), "inactive: rejected"
        assert node.trigger_activate() == ok
        waiting = asker.send()
        assert asker.accepted(waiting), "active: accepted (it waits for a frame: no images arrive)"
        assert not waiting.result.done()
        assert node.trigger_deactivate() == ok
        got, result = asker.result(waiting, 5)
        assert got == status.STATUS_ABORTED and "deactivated" in result.error
        assert node.trigger_cleanup() == ok
        assert wait_for(lambda: not asker.client.server_is_ready(), 5), "the server is gone with the model"
    finally:
        executor.shutdown(timeout_sec=2)
        node.destroy_node()
        client_node.destroy_node()
        rclpy.try_shutdown(context=ctx)
        spinner.join(timeout=2)
        torch.set_num_threads(threads)
