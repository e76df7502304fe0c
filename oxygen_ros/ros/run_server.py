"""The ``~/run`` action (``oxygen_ros/action/RunTask``): a task a planner or behaviour tree can drive.

A goal names the instruction, an optional time-out, a success rule and what happens at the end (docs/tasks.md):

- **accept**: every goal is accepted; one that cannot run (empty instruction, negative time-out, unknown success
  rule or end behaviour, a pattern that does not compile, a stream that does not exist, the gate closed by
  ``~/halt`` or disabled without ``run.may_enable``, the node inactive) is aborted at once with outcome
  ``rejected`` and the reason in ``result.reason`` (a ROS 2 goal rejection cannot carry a reason), counted in
  ``/diagnostics`` (``run.rejected``, and ``rejected_inputs`` by reason) and logged. A valid goal preempts the running
  one, which ends canceled (reason ``preempted``); then the goal owns the instruction (topic instructions are
  ignored while it runs), releases a previous goal's hold and, with ``run.may_enable``, enables the gate.
- **each frame** (inference thread, after the frame): feedback with the frames and chunks since acceptance, the
  elapsed time, the newest subtask, narration and memory observed after acceptance, the deadline misses and the
  gate; then the success rule: ``subtask_done`` (the subtask stream, the one ``subtask_conditioning`` names or else
  ``subtask``, says ``done``), ``pattern`` (an output of ``stream`` matches ``pattern``), ``external`` (never).
- **a 20 Hz steady timer**: the time-out, the gate closed under the goal (``~/halt`` true or ``~/enable`` false:
  aborted) and stale inputs (no frame ran for ``run.stall_s``: aborted with the skip reason).
- **cancel**: accepted at once; before the cancel callback returns the gate is held, under the node's publish lock,
  so no chunk is published after the cancel is accepted (the executor then holds). The goal ends canceled.
- **end**: ``hold`` (default) holds the gate (no chunk until a new goal or ``~/enable``); ``continue`` leaves it;
  a cancel always holds. The goal's instruction stays current until the topic sends a newer one.

The node creates the server on configure and destroys it on cleanup; the goal in progress is aborted when the node
stops processing (deactivate, max_consecutive_faults).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.action.server import ServerGoalHandle
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node
from rclpy.task import Future

from oxygen_ros.action import RunTask
from oxygen_ros.engine.requests import FrameResult

__all__ = ["END_BEHAVIOURS", "OUTCOMES", "RUN_ACTION", "SUCCESS_RULES", "RunHooks", "RunTaskServer", "check_goal",
           "is_done"]

RUN_ACTION = "~/run"
SUCCESS_RULES = ("subtask_done", "external", "pattern")
END_BEHAVIOURS = ("hold", "continue")
OUTCOMES = ("succeeded", "timed_out", "canceled", "aborted", "rejected")
_CHECK_PERIOD_S = 0.05


def is_done(text: str) -> bool:
    """The subtask stream says the task is finished (the embedded model's ``done``, any case and end
    punctuation)."""
    return text.strip().strip(".!").strip().lower() == "done"


def check_goal(goal: RunTask.Goal, streams: tuple[str, ...], subtask_stream: str | None) -> str | None:
    """Why ``goal`` cannot run (None: it can). ``streams``: the node's language streams; ``subtask_stream``: the
    stream ``subtask_done`` listens to (None: the node has none)."""
    if not goal.instruction.strip():
        return "empty instruction"
    if not goal.timeout_s >= 0.0:  # NaN too
        return f"timeout_s must be >= 0 (0 = none), got {goal.timeout_s}"
    success, on_end = goal.success or "subtask_done", goal.on_end or "hold"
    if success not in SUCCESS_RULES:
        return f"unknown success rule {goal.success!r} (one of {list(SUCCESS_RULES)})"
    if on_end not in END_BEHAVIOURS:
        return f"unknown on_end {goal.on_end!r} (one of {list(END_BEHAVIOURS)})"
    if success == "subtask_done" and subtask_stream is None:
        return "success subtask_done needs a subtask stream (language_streams has no 'subtask' and " \
               "subtask_conditioning names none)"
    if success == "pattern":
        if goal.stream not in streams:
            return f"stream {goal.stream!r} is not one of the node's language streams {list(streams)}"
        if not goal.pattern:
            return "success pattern needs a pattern"
        try:
            re.compile(goal.pattern)
        except re.error as e:
            return f"bad pattern {goal.pattern!r}: {e}"
    return None


@dataclass
class RunHooks:
    """What the server needs from the node (each call is cheap and thread-safe)."""

    is_active: Callable[[], bool]
    why_closed: Callable[[], str | None]  # the gate: None = open, else halted / disabled / held
    new_task: Callable[[], None]  # the next frame starts a task: unconditioned, then task_begins(frame index)
    enable: Callable[[], None]  # ~/enable true (run.may_enable)
    hold: Callable[[bool], None]  # hold (True) or release (False) the gate; holding waits for a chunk being published
    own_instruction: Callable[[str], bool]  # set and own the instruction (False: no input store)
    release_instruction: Callable[[], None]
    deadline_misses: Callable[[], int]
    last_skip: Callable[[float], str | None]  # the most frequent skip reason of the last seconds
    now_ns: Callable[[], int]  # node clock (observation stamps are on it)
    on_reject: Callable[[str, str], None] | None = None


@dataclass
class _Goal:
    handle: ServerGoalHandle
    key: bytes
    outcome: Future
    instruction: str = ""
    success: str = "subtask_done"
    stream: str = ""
    pattern: re.Pattern | None = None
    on_end: str = "hold"
    timeout_s: float = 0.0
    started: float = 0.0  # time.monotonic() at acceptance
    started_ns: int = 0  # node clock at acceptance: language observed before it does not count
    first_frame: int | None = None  # the task's first frame (task_begins): language of earlier frames does not count
    misses0: int = 0
    frames: int = 0
    chunks: int = 0
    last_frame: float = 0.0
    latest: dict[str, tuple[int, str]] = field(default_factory=dict)  # stream -> (stamp, text) of the newest
    # observation after acceptance (requests of several frames finish in one frame, not in stamp order)

    def text(self, stream: str | None) -> str:
        return self.latest.get(stream or "", (0, ""))[1]
    ended_by: str = ""  # the outcome decided (the first decision wins)


class RunTaskServer:
    """The node's ``~/run`` action server (see the module docstring). One goal runs at a time.

    Args:
        node: the node that owns it.
        streams: the node's language stream names.
        subtask_stream: the stream ``subtask_done`` listens to (None: none).
        may_enable: ``run.may_enable``.
        stall_s: ``run.stall_s`` (0 = never).
        hooks: the node's side (:class:`RunHooks`).
    """

    def __init__(self, node: Node, streams: tuple[str, ...], subtask_stream: str | None, may_enable: bool,
                 stall_s: float, hooks: RunHooks) -> None:
        self._node, self._streams, self._subtask_stream = node, tuple(streams), subtask_stream
        self._may_enable, self._stall_s, self._hooks = may_enable, stall_s, hooks
        self._log = node.get_logger()
        self._lock = threading.Lock()
        self._current: _Goal | None = None
        self.counts = {k: 0 for k in ("goals", *OUTCOMES)}  # goals received, and how each ended
        self._server = ActionServer(node, RunTask, RUN_ACTION, self._execute, callback_group=ReentrantCallbackGroup(),
                                    goal_callback=lambda _goal: GoalResponse.ACCEPT,
                                    handle_accepted_callback=lambda handle: handle.execute(),
                                    cancel_callback=self._on_cancel)
        self._timer = node.create_timer(_CHECK_PERIOD_S, self._check, MutuallyExclusiveCallbackGroup(),
                                        clock=Clock(clock_type=ClockType.STEADY_TIME))

    # ------------------------------------------------------------------------------------------ state
    @property
    def running(self) -> bool:
        """A goal runs now."""
        with self._lock:
            return self._current is not None and not self._current.ended_by

    def diagnostics(self) -> dict[str, str]:
        with self._lock:
            values = {f"run.{k}": str(v) for k, v in self.counts.items()}
            goal = self._current
            values["run.goal"] = goal.instruction[:200] if goal is not None and not goal.ended_by else ""
        return values

    def abort(self, reason: str) -> None:
        """Abort the running goal (the node stops processing); no hold: the node publishes nothing anyway."""
        with self._lock:
            goal = self._current
        if goal is not None:
            self._end(goal, "aborted", reason, hold=False)

    def destroy(self) -> None:
        self.abort("the node is shutting down")
        self._node.destroy_timer(self._timer)
        self._server.destroy()

    # ------------------------------------------------------------------------------------------ executor thread
    async def _execute(self, handle: ServerGoalHandle) -> RunTask.Result:
        request: RunTask.Goal = handle.request
        key = bytes(handle.goal_id.uuid)
        with self._lock:
            self.counts["goals"] += 1
        why = self._refusal(request)
        if why is not None:
            with self._lock:
                self.counts["rejected"] += 1
            if self._hooks.on_reject is not None:
                self._hooks.on_reject("run_goal_rejected", why)
            self._log.warning(f"~/run: goal refused: {why}")
            handle.abort()
            return RunTask.Result(outcome="rejected", reason=why)
        outcome: Future = Future(executor=self._node.executor)
        outcome.add_done_callback(lambda _: None)  # set_result from another thread wakes this coroutine
        success = request.success or "subtask_done"
        goal = _Goal(handle, key, outcome, instruction=request.instruction.strip(), success=success,
                     stream=self._subtask_stream if success == "subtask_done" else request.stream,
                     pattern=re.compile(request.pattern, re.IGNORECASE) if success == "pattern" else None,
                     on_end=request.on_end or "hold", timeout_s=float(request.timeout_s))
        self._start(goal)
        status, result = await outcome
        with self._lock:
            self.counts[status] += 1
            if self._current is goal:
                self._current = None
        if status == "succeeded":
            handle.succeed()
        elif status == "canceled":
            if not handle.is_cancel_requested:  # preempted: no cancel request came, the goal is moved to canceling
                try:
                    handle._update_state(_rclpy.GoalEvent.CANCEL_GOAL)
                except Exception as e:  # a state the transition is not valid from
                    self._log.debug(f"~/run: preempted goal not moved to canceling: {e}")
            if handle.is_cancel_requested:
                handle.canceled()
            else:
                handle.abort()
        else:
            handle.abort()
        self._log.info(f"~/run: goal {status} ({result.reason}) after {result.frames} frames, "
                       f"{result.elapsed_s:.1f} s")
        return result

    def _refusal(self, request: RunTask.Goal) -> str | None:
        why = check_goal(request, self._streams, self._subtask_stream)
        if why is not None:
            return why
        if not self._hooks.is_active():
            return "the node is not active"
        closed = self._hooks.why_closed()
        if closed == "halted":
            return "~/halt is true: release it first"
        if closed == "disabled" and not self._may_enable:
            return "the gate is disabled (start_enabled false or ~/enable false) and run.may_enable is false: " \
                   "call ~/enable with true first"
        return None

    def _start(self, goal: _Goal) -> None:
        """Make ``goal`` the running one (atomically: of two goals arriving at once, one preempts the other), end
        the one it preempts, then take the instruction and the gate."""
        hooks = self._hooks
        goal.started = goal.last_frame = time.monotonic()
        goal.started_ns = hooks.now_ns()
        goal.misses0 = hooks.deadline_misses()
        with self._lock:
            previous, self._current = self._current, goal
        if previous is not None:  # gives the instruction back before this goal takes it
            self._end(previous, "canceled", "preempted by a new goal", hold=False)
        if not hooks.own_instruction(goal.instruction):
            self._end(goal, "aborted", "the instruction could not be set (the node stopped processing?)", hold=False)
            return
        hooks.new_task()
        hooks.hold(False)  # a previous goal's hold
        if self._may_enable and hooks.why_closed() == "disabled":
            hooks.enable()
        self._log.info(f"~/run: goal accepted: {goal.instruction!r} (success {goal.success}, timeout "
                       f"{goal.timeout_s:g} s, on_end {goal.on_end})")

    def _on_cancel(self, handle: ServerGoalHandle) -> CancelResponse:
        key = bytes(handle.goal_id.uuid)
        with self._lock:
            goal = self._current if self._current is not None and self._current.key == key else None
        if goal is not None:  # hold before the cancel is accepted: no chunk after it
            self._end(goal, "canceled", "canceled by the client", hold=True)
        return CancelResponse.ACCEPT

    def _check(self) -> None:
        """Steady timer: time-out, the gate closed under the goal, stale inputs."""
        with self._lock:
            goal = self._current
        if goal is None or goal.ended_by:
            return
        now = time.monotonic()
        if goal.timeout_s and now - goal.started >= goal.timeout_s:
            self._end(goal, "timed_out", f"no success within {goal.timeout_s:g} s")
            return
        closed = self._hooks.why_closed()
        if closed in ("halted", "disabled"):
            self._end(goal, "aborted", "halted (~/halt is true)" if closed == "halted" else
                      "disabled (~/enable false)", hold=False)
            return
        if self._stall_s and now - goal.last_frame >= self._stall_s:
            skip = self._hooks.last_skip(self._stall_s)
            self._end(goal, "aborted", f"stale inputs: no frame ran for {now - goal.last_frame:.1f} s"
                      + (f" (frames skipped: {skip})" if skip else ""))

    # ------------------------------------------------------------------------------------------ inference thread
    def task_begins(self, frame_index: int) -> None:
        """The inference thread starts the running goal's task with frame ``frame_index`` (unconditioned)."""
        with self._lock:
            goal = self._current
            if goal is not None and goal.first_frame is None:
                goal.first_frame = frame_index

    def on_chunk(self) -> None:
        """A chunk was published (inside the publish lock)."""
        with self._lock:
            goal = self._current
            if goal is not None and not goal.ended_by:
                goal.chunks += 1

    def on_frame(self, result: FrameResult) -> None:
        """After a frame: the newest language, the feedback, the success rule."""
        with self._lock:
            goal = self._current
        if goal is None or goal.ended_by:
            return
        goal.frames += 1
        goal.last_frame = time.monotonic()
        updated = False
        first = goal.first_frame
        for done in result.finished:
            if first is None or done.frame_index < first or done.dropped or done.cancelled or not done.stream \
                    or int(done.stamp or 0) < goal.started_ns:
                continue  # from a frame before the task began (another instruction, the last subtask): not counted
            text, stamp = (done.text or "").strip(), int(done.stamp or 0)
            if stamp >= goal.latest.get(done.stream, (0, ""))[0]:
                goal.latest[done.stream] = (stamp, text)
                updated |= done.stream == goal.stream
        matched = None
        if updated:  # the rule looks at the stream's output from the newest observation
            text = goal.text(goal.stream)
            if goal.success == "subtask_done" and is_done(text):
                matched = f"the {goal.stream} stream says {text!r}"
            elif goal.pattern is not None and goal.pattern.search(text):
                matched = f"{goal.stream} {text!r} matches {goal.pattern.pattern!r}"
        closed = self._hooks.why_closed()
        feedback = RunTask.Feedback(
            frames=goal.frames, chunks=goal.chunks, elapsed_s=time.monotonic() - goal.started,
            subtask=goal.text(self._subtask_stream or "subtask"), narration=goal.text("narration"),
            memory=goal.text("memory"),
            deadline_misses=max(0, self._hooks.deadline_misses() - goal.misses0),
            gate="published" if closed is None else f"withheld: {closed}")
        try:
            goal.handle.publish_feedback(feedback)
        except Exception as e:  # a goal that just ended
            self._log.debug(f"~/run: feedback not published: {e}")
        if matched is not None:
            self._end(goal, "succeeded", matched)

    # ------------------------------------------------------------------------------------------ endings
    def _end(self, goal: _Goal, status: str, reason: str, hold: bool | None = None) -> None:
        """Decide the goal's outcome once (any thread): apply the end behaviour (hold: ``on_end`` unless given),
        give the instruction back, then resolve (its execute coroutine ends the goal)."""
        with self._lock:
            if goal.ended_by:
                return
            goal.ended_by = status
        if hold if hold is not None else goal.on_end == "hold":
            self._hooks.hold(True)
        self._hooks.release_instruction()
        self._resolve(goal, status, reason)

    def _resolve(self, goal: _Goal, status: str, reason: str) -> None:
        result = RunTask.Result(outcome=status, reason=reason, frames=goal.frames, chunks=goal.chunks,
                                elapsed_s=time.monotonic() - goal.started if goal.started else 0.0,
                                last_memory=goal.text("memory"),
                                last_subtask=goal.text(self._subtask_stream or "subtask"),
                                last_narration=goal.text("narration"))
        with self._lock:
            if goal.outcome.done():
                return
            goal.outcome.set_result((status, result))
