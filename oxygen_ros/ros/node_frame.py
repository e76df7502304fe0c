"""The node's control frame (mixed into :class:`~oxygen_ros.ros.node.OxygenNode`, whose attributes it uses): the
control timer wakes the inference thread, which builds the observation, runs one engine frame and publishes the
chunk (through the output guard) the moment it is denoised, then the frame's language outputs.
"""

from __future__ import annotations

import time
import traceback

from oxygen_ros.policy.runner import ChunkOutput
from oxygen_ros.runtime.model_loader import action_period_s
from oxygen_ros.runtime.params import NodeParams

from .observation_builder import BuiltObservation, Skip
from .publishers import language_output, make_action_chunk, make_trajectory

__all__ = ["ControlFrame", "LATE_TICK_S"]

LATE_TICK_S = 0.005  # a tick noticed this long after it fired waited for a frame: it may be skipped


class ControlFrame:
    """The inference thread's side of :class:`~oxygen_ros.ros.node.OxygenNode`."""

    def _on_timer(self) -> None:
        self._tick_at = time.perf_counter()
        self._tick.set()

    def _inference_loop(self) -> None:
        """The inference thread: one frame per control tick, due by the next tick. A tick noticed late (the frame
        before it overran) runs with the time left, which ``k = auto`` decodes into; with less time left than the
        action path took recently (p90), it is skipped (``late_tick``): a late frame never makes the next late.
        A tick noticed on time always runs."""
        tick, stop, run = self._tick, self._worker_stop, self._safe(self._on_tick, "control_tick")
        period = self.params.period_s
        while not stop.is_set():
            if tick.wait(0.2):
                tick.clear()
                if stop.is_set():
                    break
                deadline = self._tick_at + period
                left, need = deadline - time.perf_counter(), self._action_path_p90()
                if left < min(need, period - LATE_TICK_S):
                    self.stats.skipped.add("late_tick", f"{left * 1e3:.0f} ms of the control period left when the "
                                           f"previous frame ended; the action path needs {need * 1e3:.0f} ms")
                    continue
                run(deadline)

    def _action_path_p90(self) -> float:
        times = sorted(self._action_path_s)
        return times[min(len(times) - 1, int(0.9 * len(times)))] if times else 0.0

    def _on_tick(self, deadline: float | None = None) -> None:
        if not self._engine_lock.acquire(blocking=False):
            return  # being released
        try:
            if self._runner is None or self._builder is None:
                return
            self._frame_began = time.perf_counter()
            built = self._builder.build(self.get_clock().now().nanoseconds, self._runner.subtask)
            if isinstance(built, Skip):
                self.stats.skipped.add(built.reason, built.detail)
                return
            if built.stamp_ns < self.born_ns:  # observed before this process: never acted on (respawn)
                self.stats.skipped.add("observed_before_start", f"observation stamped {built.stamp_ns} ns, before "
                                       f"this node started ({self.born_ns} ns)")
                return
            self._run_frame(built, deadline)
        finally:
            self._engine_lock.release()

    def _run_frame(self, built: BuiltObservation, deadline: float | None = None) -> None:
        p = self.params
        if built.prompt_truncated:
            self.stats.rejected_inputs.add("prompt_truncated", "the state alone exceeds the model's "
                                           "max_token_len; the prompt end is cut")
        if built.instruction_cut and built.instruction != self._cut_instruction:  # once per instruction
            self._cut_instruction = built.instruction
            self.stats.rejected_inputs.add("instruction_truncated", f"{len(built.instruction)} chars do not fit "
                                           "the model's prompt beside the state; the instruction is cut to fit")
        if self._faults.tripped:
            return  # max_consecutive_faults reached: the error processing is on its way
        if self._task_begins:  # a ~/run goal's task: no subtask of the last task conditions it
            self._task_begins = False
            self._runner.forget_subtask()
            if self._run is not None:
                self._run.task_begins(self._runner.engine.frame_index)
        self._guard.frame_began()
        try:
            out = self._runner.step(built.prepared, stamp_ns=built.stamp_ns, arrived=built.received,
                                    instruction=built.instruction, on_chunk=self._publish_actions,
                                    clock_ns=lambda: self.get_clock().now().nanoseconds, deadline=deadline)
        except Exception as e:  # one bad frame must not stop the node: count, log, start a fresh engine
            self._guard.frame_ended()
            if not self.context.ok():
                return  # shutting down
            self.stats.errors.add(type(e).__name__, f"{e} (language requests in flight are lost)")
            self.get_logger().debug(traceback.format_exc())
            if self._ask is not None:
                self._ask.abort_all(f"the frame failed: {type(e).__name__}: {e}")
            self._runner.reset()
            self._fault_pending |= self._faults.failure(e)  # the supervisor starts the error processing
            return
        self._guard.frame_ended()
        self._faults.success()
        result = out.result
        overrun = None if deadline is None else time.perf_counter() - deadline
        self.stats.record_frame(result.timings, p.period_s, result.tokens_generated, result.rejected,
                                result.dropped, out.chunk.latency_s, overrun)
        for done in result.finished:
            if done.dropped or done.cancelled:
                continue  # evicted by drop_oldest or cancelled (an ask goal) before finishing: not published
            msg = language_output(done)
            self._language_pub.publish(msg)
            stream_pub = self._stream_pubs.get(msg.stream)
            if stream_pub is not None:
                stream_pub.publish(msg)
            self.stats.record_language(done.text or "", msg.stream)
        if self._ask is not None:
            self._ask.on_frame(result)
        if self._run is not None:
            self._run.on_frame(result)

    def _publish_actions(self, chunk: ChunkOutput) -> None:
        """Publish the chunk's executable actions from the first one not already committed (called before any
        language work of the frame), once they passed the limits, the age limit and the gate (ActionGuard)."""
        self._action_path_s.append(time.perf_counter() - self._frame_began)
        self._rtc_guided += chunk.guided
        self._rtc_last_guided = chunk.guided
        p, names = self.params, self._loaded.action_names
        dt = action_period_s(p, chunk.actions.shape[0])
        with self._publish_lock:  # a ~/run cancel or end holds the gate in between: no chunk after it
            if not self._admit_and_publish(chunk, p, names, dt):
                self._runner.forget_chunk()  # the robot does not execute it: the next chunk starts free

    def _admit_and_publish(self, chunk: ChunkOutput, p: NodeParams, names: tuple[str, ...], dt: float) -> bool:
        now_ns = self.get_clock().now().nanoseconds
        actions = self._guard.admit(chunk, chunk.published, dt, now_ns, self._store)
        if actions is None:
            return False
        cov = self._coverage.observe((now_ns - chunk.stamp_ns) / 1e9, chunk.start + len(actions), dt)
        if cov.short:
            self.stats.warnings.add("chunk_coverage_short", f"frame {chunk.frame_index}: the published actions end "
                                    f"{cov.covered_s * 1e3:.0f} ms after the stamp, the next chunk is expected after "
                                    f"{cov.expected_s * 1e3:.0f} ms (period + p90 age): the robot starves")
        self._action_pub.publish(make_action_chunk(actions, chunk.stamp_ns, chunk.frame_index, names, dt,
                                                   chunk.latency_s, subtask=chunk.subtask, first_step=chunk.start))
        if self._trajectory_pub is not None:
            trajectory = make_trajectory(actions, names, dt, chunk.stamp_ns, self.get_clock().now().nanoseconds,
                                         chunk.start)
            if trajectory is None:
                self.stats.dropped_outputs.add("trajectory_expired", "every point of the chunk's trajectory lies in "
                                               "the past (inference slower than the chunk)")
            else:
                self._trajectory_pub.publish(trajectory)
        if self._run is not None:
            self._run.on_chunk()
        return True
