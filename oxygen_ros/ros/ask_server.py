"""The ``~/ask`` action (``oxygen_ros/action/Ask``): a question answered from the node's current observation.

A goal becomes a tagged :class:`~oxygen_ros.engine.requests.LanguageRequest` (task ``answer`` unless the goal names
one, stream ``ask``, priority ``ask.priority``) that :meth:`FrameRunner.submit` queues for the next frame: it is
decoded from that frame's shared prefix, batched with the in-flight stream requests under the per-frame budget k,
so the answer takes several control frames, like any language stream, and never delays an action chunk.

Threads and goal states (nothing here blocks the executor or the control frames):

- executor thread: the goal callback accepts or rejects (inactive node, empty or oversized question or prompt, too
  many goals in progress); the execute callback, a coroutine, tokenizes the goal into a request, submits it, and
  awaits the goal's outcome (a Future; rclpy resumes such a coroutine when the executor wakes, which the Future's
  completion triggers) to set the terminal state: succeed, abort or canceled. The cancel callback accepts: a
  request still queued is dropped at once, one in flight is evicted by the engine before the next frame
  (``Engine.cancel``: its KV slot is freed), and the goal ends canceled with the text so far.
- inference thread: :meth:`AskServer.on_frame`, after every frame, publishes feedback for each answer in flight
  (text and tokens so far, frames) and completes the goals whose request finished, was rejected at admission
  (``FrameResult.rejected_requests``: "pool full", ...) or dropped (``overflow: drop_oldest``).

The node creates the server on configure (with the frame runner) and destroys it on cleanup / shutdown; goals are
accepted while the node is active, and the goals in progress are aborted when it stops processing (deactivate, a
failed frame whose engine is replaced).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.action.server import ServerGoalHandle
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.node import Node
from rclpy.task import Future

from oxygen_ros.action import Ask
from oxygen_ros.engine.requests import FinishedRequest, FrameResult, LanguageRequest
from oxygen_ros.engine.tokenizer import LANGUAGE_TEMPLATES
from oxygen_ros.policy.runner import FrameRunner
from oxygen_ros.runtime.params import NodeParams

from .stamps import time_msg

__all__ = ["ASK_ACTION", "ASK_STREAM", "ASK_TASK", "AskServer"]

ASK_ACTION = "~/ask"
ASK_STREAM = "ask"  # LanguageOutput.stream (and the drafts' stream) of the answers
ASK_TASK = "answer"  # the request task of a goal that names none
_NO_LIMIT = 1 << 20  # tokenize without cutting: an overlong prompt is refused, not answered truncated


@dataclass
class _Goal:
    """One accepted goal: its handle, its outcome (``(status, Ask.Result)``, status succeeded / aborted /
    canceled) and how far its answer got."""

    handle: ServerGoalHandle
    key: bytes  # the goal id: the request's tag
    outcome: Future
    submitted: bool = False
    cancel_requested: bool = False
    frames: int = 0  # frames it has been in flight


class AskServer:
    """The node's ``~/ask`` action server (see the module docstring).

    Args:
        node: the node that owns it (the action lives under its name).
        runner: the node's frame runner (submit / cancel; its engine's ``partial``; the tokenizer).
        params: the node's validated parameters (``ask.*``, ``max_new_tokens``, ``max_prompt_tokens``).
        is_active: whether the node processes frames now (goals are rejected otherwise).
        on_reject: ``on_reject(reason, detail)`` for each rejected goal (the node's diagnostics counter).
    """

    def __init__(self, node: Node, runner: FrameRunner, params: NodeParams, is_active: Callable[[], bool],
                 on_reject: Callable[[str, str], None] | None = None) -> None:
        self._node, self._runner, self._params = node, runner, params
        self._is_active = is_active
        self._on_reject = on_reject
        self._log = node.get_logger()
        self._lock = threading.Lock()
        self._goals: dict[bytes, _Goal] = {}
        self.counts = {"accepted": 0, "rejected": 0, "succeeded": 0, "aborted": 0, "canceled": 0}
        self.max_batch = 0  # largest decode batch of a frame that advanced two answers or more
        self._server = ActionServer(node, Ask, ASK_ACTION, self._execute, callback_group=ReentrantCallbackGroup(),
                                    goal_callback=self._on_goal, handle_accepted_callback=self._on_accepted,
                                    cancel_callback=self._on_cancel)

    # ------------------------------------------------------------------------------------------ state
    @property
    def pending(self) -> int:
        """Goals in progress (accepted, not finished)."""
        with self._lock:
            return len(self._goals)

    def diagnostics(self) -> dict[str, str]:
        """Key/values for ``/diagnostics``."""
        with self._lock:
            values = {f"ask.{k}": str(v) for k, v in self.counts.items()}
            values["ask.pending"] = str(len(self._goals))
        values["ask.max_batch"] = str(self.max_batch)
        return values

    def abort_all(self, reason: str) -> None:
        """Abort every goal in progress (the node stops processing; their requests are lost or never admitted)."""
        with self._lock:
            goals = list(self._goals.values())
        for goal in goals:
            if goal.submitted:
                self._runner.cancel(goal.key)  # drops it from the runner's queue if it is still there
            self._resolve(goal, "aborted", self._error(reason))

    def destroy(self) -> None:
        """Abort what is in progress and destroy the action server."""
        self.abort_all("the node is shutting down")
        self._server.destroy()

    # ------------------------------------------------------------------------------------------ executor thread
    def _reject(self, reason: str, detail: str) -> GoalResponse:
        with self._lock:
            self.counts["rejected"] += 1
        if self._on_reject is not None:
            self._on_reject(reason, detail)
        self._log.info(f"ask: goal rejected: {detail}")
        return GoalResponse.REJECT

    def _on_goal(self, goal: Ask.Goal) -> GoalResponse:
        p = self._params
        if not self._is_active():
            return self._reject("ask_inactive", "the node is not active")
        cap = p.ask_max_question_chars
        if len(goal.question) > cap or len(goal.prompt) > cap:
            return self._reject("ask_too_long", f"question or prompt longer than ask.max_question_chars={cap}")
        if not goal.question.strip() and not goal.prompt and (goal.task or ASK_TASK) not in LANGUAGE_TEMPLATES:
            return self._reject("ask_empty", "no question, no prompt and no built-in task")
        if self.pending >= p.ask_max_pending:
            return self._reject("ask_busy", f"ask.max_pending={p.ask_max_pending} goals in progress")
        return GoalResponse.ACCEPT

    def _on_accepted(self, handle: ServerGoalHandle) -> None:
        key = bytes(handle.goal_id.uuid)
        outcome: Future = Future(executor=self._node.executor)
        # a done callback makes set_result (from the inference thread) schedule a task, which wakes the executor
        # and with it the execute coroutine awaiting the outcome
        outcome.add_done_callback(lambda _: None)
        with self._lock:
            self._goals[key] = _Goal(handle, key, outcome)
            self.counts["accepted"] += 1
        handle.execute()

    def _on_cancel(self, handle: ServerGoalHandle) -> CancelResponse:
        key = bytes(handle.goal_id.uuid)
        with self._lock:
            goal = self._goals.get(key)
            if goal is not None:
                goal.cancel_requested = True
        if goal is not None and goal.submitted and self._runner.cancel(key):  # still queued: it never runs
            self._resolve(goal, "canceled", Ask.Result(stream=ASK_STREAM))
        return CancelResponse.ACCEPT  # in flight: the engine evicts it before the next frame (on_frame ends it)

    async def _execute(self, handle: ServerGoalHandle) -> Ask.Result:
        key = bytes(handle.goal_id.uuid)
        with self._lock:
            goal = self._goals.get(key)
        if goal is None:  # cannot happen (accepted goals are registered first); never leave a goal hanging
            handle.abort()
            return self._error("unknown goal")
        self._submit(goal, handle.request)
        status, result = await goal.outcome
        with self._lock:
            self._goals.pop(key, None)
            self.counts[status] += 1
        if status == "succeeded":
            handle.succeed()
        elif status == "canceled" and handle.is_cancel_requested:
            handle.canceled()
        else:
            handle.abort()
        return result

    def _submit(self, goal: _Goal, request: Ask.Goal) -> None:
        if goal.outcome.done():  # aborted before it started (the node stopped)
            return
        if goal.cancel_requested or goal.handle.is_cancel_requested:
            self._resolve(goal, "canceled", Ask.Result(stream=ASK_STREAM))
            return
        try:
            req = self._request(request, goal.key)
        except ValueError as e:
            self._resolve(goal, "aborted", self._error(str(e)))
            return
        with self._lock:
            if goal.outcome.done():
                return
            goal.submitted = True
        self._runner.submit(req)

    def _request(self, goal: Ask.Goal, key: bytes) -> LanguageRequest:
        """The goal's language request (ValueError: it cannot be served)."""
        p, tok = self._params, self._runner.policy.tokenizer
        ec = self._runner.engine.config
        task = goal.task or ASK_TASK
        if goal.prompt:
            tokens = tok.encode(goal.prompt)
        elif goal.question.strip():
            question = getattr(tok, "tokenize_question", None)
            tokens = question(goal.question, _NO_LIMIT) if question is not None else \
                tok.encode(f"Question: {goal.question.strip()}\nAnswer: ")
        else:
            tokens = tok.tokenize_request(task, None, max_len=_NO_LIMIT)
        if len(tokens) > ec.max_prompt_tokens:
            raise ValueError(f"prompt too long: {len(tokens)} tokens > max_prompt_tokens={ec.max_prompt_tokens}")
        n = int(goal.max_new_tokens) or p.ask_max_new_tokens or p.max_new_tokens
        if n > ec.max_new_tokens:
            raise ValueError(f"max_new_tokens out of range: {n} > max_new_tokens={ec.max_new_tokens}")
        return LanguageRequest(task, n, tokens, stream=ASK_STREAM, priority=p.ask_priority, tag=key)

    # ------------------------------------------------------------------------------------------ inference thread
    def on_frame(self, result: FrameResult) -> None:
        """After a frame: feedback for the answers in flight, outcomes for those that ended (its results)."""
        with self._lock:
            goals = {k: g for k, g in self._goals.items() if g.submitted and not g.outcome.done()}
        if not goals:
            return
        for done in result.finished:
            goal = goals.pop(done.tag, None) if isinstance(done.tag, bytes) else None
            if goal is not None:
                self._finish(goal, done)
        for req, reason in result.rejected_requests:
            goal = goals.pop(req.tag, None) if isinstance(req.tag, bytes) else None
            if goal is not None:
                if reason == "pool full":
                    reason += f" (max_inflight={self._runner.engine.config.max_inflight} requests in flight)"
                self._resolve(goal, "aborted", self._error(reason))
        engine, decode = self._runner.engine, self._runner.policy.tokenizer.decode
        live = 0
        for goal in goals.values():
            tokens = engine.partial(goal.key)
            if tokens is None:
                continue  # not admitted yet (submitted during the frame)
            live += 1
            goal.frames += 1
            try:
                goal.handle.publish_feedback(Ask.Feedback(text=decode(tokens), tokens=len(tokens),
                                                          frames=goal.frames))
            except Exception as e:  # a goal that just ended: nothing to report to
                self._log.debug(f"ask: feedback not published: {e}")
        answering = live + sum(1 for d in result.finished if isinstance(d.tag, bytes))
        if answering >= 2 and result.batch_sizes:
            self.max_batch = max(self.max_batch, max(result.batch_sizes))

    def _finish(self, goal: _Goal, done: FinishedRequest) -> None:
        result = Ask.Result(text=done.text or "", observation_stamp=time_msg(int(done.stamp or 0)),
                            latency_frames=int(done.frames), latency_s=float(done.latency_s), eos=bool(done.eos),
                            stream=done.stream or ASK_STREAM, request_id=int(done.request_id))
        if done.cancelled:
            self._resolve(goal, "canceled", result)
        elif done.dropped:
            result.error = "dropped: the KV pool was full (overflow=drop_oldest)"
            self._resolve(goal, "aborted", result)
        else:
            self._resolve(goal, "succeeded", result)

    # ------------------------------------------------------------------------------------------ helpers
    @staticmethod
    def _error(reason: str) -> Ask.Result:
        return Ask.Result(text=reason, error=reason, stream=ASK_STREAM)

    def _resolve(self, goal: _Goal, status: str, result: Ask.Result) -> None:
        """Set the goal's outcome once (any thread); its execute coroutine then ends the goal."""
        with self._lock:
            if goal.outcome.done():
                return
            goal.outcome.set_result((status, result))
