"""The node's 1 Hz ``/diagnostics`` status (mixed into :class:`~oxygen_ros.ros.node.OxygenNode`, whose attributes
it uses): frame timings and counts, precision and kernels, real-time chunking, chunk coverage, the language
actions, per camera inputs, the output guard and the fault counter.
"""

from __future__ import annotations

import json

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus

from oxygen_ros.policy.runner import FrameRunner
from oxygen_ros.runtime.params import NodeParams

__all__ = ["NodeDiagnostics"]


class NodeDiagnostics:
    """The ``/diagnostics`` side of :class:`~oxygen_ros.ros.node.OxygenNode`."""

    def _publish_diagnostics(self) -> None:
        runner, loaded = self._runner, self._loaded
        horizon = runner.n_execute if runner is not None else 0
        p = self.params
        extra = {} if p is None else {"mode": p.mode, "control_rate_hz": p.control_rate_hz}
        if p is not None and runner is not None:
            if loaded is not None:
                extra["precision"] = loaded.policy.precision.describe()  # which precision runs, and why
            extra["graphs"] = runner.engine.graphs_backend  # what runs (auto resolved)
            extra["graph_stages"] = runner.engine.graph_stages  # which action stages run their graph step
            extra["kernels"] = runner.engine.kernels  # which CPU kernels each stage runs on, and how decided
        if p is not None and p.rtc_enabled and runner is not None:  # real-time chunking: what guided the chunks
            age = runner.delays.age_s
            extra["rtc_delay"] = f"{runner.delay} actions ({'fixed' if p.rtc_delay != 'auto' else 'auto'}; p90 age "
            extra["rtc_delay"] += "n/a)" if age is None else f"{age * 1e3:.0f} ms)"
            extra["rtc_guided_chunks"] = str(self._rtc_guided)
            extra["rtc_last_chunk_guided"] = str(self._rtc_last_guided).lower()
            extra.update(self._remainder_diagnostics(p, runner))
        coverage = self._coverage
        if coverage is not None and coverage.last is not None:  # does a chunk last until the next one?
            extra["chunk_coverage_ms"] = f"{coverage.last.covered_s * 1e3:.0f}"
            extra["next_chunk_expected_ms"] = f"{coverage.last.expected_s * 1e3:.0f}"
            extra["coverage_short_chunks"] = f"{coverage.short}/{coverage.checked}"
        if self._coverage_note:
            extra["coverage_warning"] = self._coverage_note[:300]
        if p is not None and p.speculate and runner is not None:
            rate = runner.engine.acceptance_rate
            extra["draft_acceptance"] = "nan" if rate is None else f"{rate:.3f}"
        if self._ask is not None:
            extra.update(self._ask.diagnostics())
        if self._run is not None:
            extra.update(self._run.diagnostics())
        store = self._store
        if store is not None:
            extra["instruction"] = (store.instruction or "")[:200]
            extra["instructions_ignored_during_run"] = str(store.instructions_ignored)
            if runner is not None and runner.condition_on:  # what the next chunks are conditioned on
                extra["subtask"] = runner.subtask(store.instruction or "")[:200]
        warnings: list[str] = []
        watch = self._camera_watch
        if store is not None and watch is not None:  # per camera receive rate, image age, silent cameras
            publishers = [self.count_publishers(topic) for topic in watch.topics]
            values, warnings = watch.report(store.camera_status(), publishers, self.get_clock().now().nanoseconds)
            extra.update(values)
        if self._guard is not None:
            extra.update(self._guard.diagnostics())
        extra.update(self._faults.diagnostics())
        hardware = str(loaded.policy.model.device) if loaded is not None else "none"
        status = self.stats.status(f"{self.get_name()}: inference", hardware, self._state,
                                   runner.backlog if runner is not None else 0, horizon, extra, warnings)
        self._safety_status(status)
        msg = DiagnosticArray()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.status = [status]
        self._diag_pub.publish(msg)

    def _remainder_diagnostics(self, p: NodeParams, runner: FrameRunner) -> dict[str, str]:
        """Where the RTC remainders came from; with the executor's plans, the newest one used (robot units, the
        first rows) and its observation stamp, so it can be compared with the plans."""
        counts = runner.remainder_counts
        out = {"rtc_remainder_source": p.rtc_remainder_source,
               "rtc_remainders_timing_rule": str(counts["timing_rule"])}
        if p.rtc_remainder_source == "executor":
            out["rtc_remainders_executor"] = str(counts["executor"])
            out["rtc_remainder_fallbacks"] = str(counts["executor_fallback"])
            executed = self._executed
            out["rtc_executor_plans_received"] = str(executed.received if executed is not None else 0)
            if executed is not None and executed.newest_used_ns is not None:
                out["rtc_last_remainder_newest_plan_ns"] = str(executed.newest_used_ns)
        last = runner.last_remainder
        if last is not None:
            out["rtc_last_remainder_source"] = last[0]
            out["rtc_last_remainder_stamp_ns"] = str(last[1])
            if last[2] is not None:
                out["rtc_last_remainder"] = json.dumps(np.round(last[2][:4], 5).tolist())
        return out

    def _safety_status(self, status: DiagnosticStatus) -> None:
        """ERROR after max_consecutive_faults sent the node through ErrorProcessing (until configured again);
        else what the guard says (a frame past the watchdog, why no chunk is published)."""
        if self._faults.tripped:
            status.level = DiagnosticStatus.ERROR
            status.message = (f"{self._faults.consecutive} frames in a row failed (max_consecutive_faults="
                              f"{self._faults.limit}): {self._faults.last}; released after error processing, "
                              "configure to start again")
        elif self._guard is not None:
            self._guard.annotate(status, self._state == "active")
