"""The demo's person at the table: asks the node a question about the scene over its ``~/ask`` action every few
seconds, streams the feedback and scores the answer against the simulator's truth at the observation it was
answered from."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
from rclpy.action import ActionClient

from oxygen_ros.action import Ask
from oxygen_ros.ros.stamps import stamp_to_ns
from oxygen_ros.testing.probe import Probe
from oxygen_ros.toy.sim.node import TabletopSimNode
from oxygen_ros.toy.world import sample_questions

__all__ = ["Answer", "QuestionAsker"]


@dataclass
class Answer:
    """One question asked and what came back."""

    question: str
    text: str = ""
    truth: str | None = None
    exact: bool | None = None
    feedback: int = 0  # feedback messages received (the text so far, once per frame in flight)
    latency_frames: int = 0
    error: str = ""


@dataclass
class _Totals:
    """Questions sent, and every one that came back (answered or failed): the counts are read off the answers."""

    asked: int = 0
    answers: list[Answer] = field(default_factory=list)

    @property
    def answered(self) -> int:
        return sum(not a.error for a in self.answers)

    @property
    def failed(self) -> int:
        return sum(bool(a.error) for a in self.answers)

    @property
    def exact(self) -> int:
        return sum(bool(a.exact) for a in self.answers)


class QuestionAsker:
    """Sends one goal at a time to ``<node>/ask`` (at most one every ``every_s`` seconds); thread-safe counters."""

    def __init__(self, probe: Probe, node: str, sim: TabletopSimNode, every_s: float = 3.0, seed: int = 0) -> None:
        self._client = ActionClient(probe.node, Ask, f"{node}/ask")
        self._sim, self._every_s = sim, every_s
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._pending: Answer | None = None
        self._last_sent = 0.0
        self.totals = _Totals()

    def tick(self) -> None:
        """Ask the next question when the last one is done and ``every_s`` passed (called about once a second)."""
        with self._lock:
            if self._pending is not None or time.monotonic() - self._last_sent < self._every_s:
                return
        if not self._client.server_is_ready():
            return
        question, _ = sample_questions(self._sim.world, self._rng)[0]
        answer = Answer(question)
        with self._lock:
            self._pending, self._last_sent = answer, time.monotonic()
            self.totals.asked += 1
        goal = Ask.Goal(question=question)
        future = self._client.send_goal_async(goal, feedback_callback=lambda fb: self._on_feedback(answer, fb))
        future.add_done_callback(lambda f: self._on_goal_response(answer, f))

    def _on_feedback(self, answer: Answer, feedback) -> None:
        with self._lock:
            answer.feedback += 1
            answer.text = feedback.feedback.text

    def _on_goal_response(self, answer: Answer, future) -> None:
        handle = future.result()
        if handle is None or not handle.accepted:
            self._done(answer, error="goal rejected")
            return
        handle.get_result_async().add_done_callback(lambda f: self._on_result(answer, f))

    def _on_result(self, answer: Answer, future) -> None:
        response = future.result()
        result = response.result
        if result.error:
            self._done(answer, error=result.error)
            return
        truth = self._sim.answer_truth(stamp_to_ns(result.observation_stamp), answer.question)
        with self._lock:
            answer.text, answer.truth = result.text.strip(), truth
            answer.latency_frames = int(result.latency_frames)
            answer.exact = None if truth is None else answer.text == truth
        self._done(answer)

    def _done(self, answer: Answer, error: str = "") -> None:
        with self._lock:
            answer.error = error
            self.totals.answers.append(answer)
            self._pending = None

    def rows(self) -> list[tuple[str, str]]:
        """The live table's rows: answers exact, and the last question with its answer."""
        with self._lock:
            t, pending = self.totals, self._pending
            last = t.answers[-1] if t.answers else None
            exact, answered, failed = t.exact, t.answered, t.failed
        rows = [("answers exact / asked (~/ask)", f"{exact} / {answered}" + (f", {failed} failed" if failed else ""))]
        if pending is not None:
            rows.append(("asking", f"{pending.question!r} ... {pending.text!r} ({pending.feedback} feedback)"))
        if last is not None:
            verdict = last.error or ("= truth" if last.exact else f"truth: {last.truth}")
            rows.append(("last answer", f"{last.question!r} -> {last.text!r} ({verdict}, "
                                        f"{last.latency_frames} frames, {last.feedback} feedback)"))
        return rows

    def close(self) -> None:
        self._client.destroy()
