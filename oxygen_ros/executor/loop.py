"""The executor's command loop (:class:`CommandLoop`): a thread of its own that calls ``tick(stamp_ns)`` once per
command period, outside rclpy's executor.

- **Real time**: it sleeps to absolute deadlines on the monotonic clock (deadline k = start + k * period: no
  drift) and stamps each tick with the ROS time (the system clock) read on waking. A late tick never causes a
  burst: it is served once, late, and the deadlines closer than half a period to it are skipped and counted, so
  two ticks are never closer than half a period. Each tick's
  lateness (wake - deadline) goes to a preallocated ring; :meth:`CommandLoop.stats` gives p50 / p99 / max, the
  late ticks (lateness above ``late_fraction`` of the period), the skipped deadlines and the loop thread's own CPU
  time per tick (``time.thread_time`` in the loop).
- **Simulated time** (``use_sim_time``): it follows the node's clock (/clock). Every time jump wakes it; it ticks
  once, stamped with the clock's time, when a deadline on the period's grid has passed (again skipping, never
  bursting), so a test that steps /clock one period at a time sees one tick per step.

The real-time settings (:mod:`.rt`) are applied by the loop thread to itself before the first tick, so only this
thread gets SCHED_FIFO and the affinity. Nothing in the loop logs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .rt import RtReport, apply_thread

__all__ = ["CommandLoop"]

_RING = 8192  # ticks of lateness kept for the statistics (82 s at 100 Hz)


class CommandLoop:
    """Calls ``tick(stamp_ns)`` every ``period_ns`` (see the module docstring).

    Args:
        period_ns: the command period.
        tick: called in the loop thread with the tick's ROS time; must not block for long.
        sim_clock: the node's clock when it follows /clock (``use_sim_time``), else None (real time).
        priority: SCHED_FIFO priority of the loop thread (0 = normal).
        cpus: the loop thread's CPUs ('' = any).
        late_fraction: a tick later than this fraction of the period is counted late.
    """

    def __init__(self, period_ns: int, tick: Callable[[int], None], sim_clock: Any = None, priority: int = 0,
                 cpus: str = "", late_fraction: float = 0.2, name: str = "command-loop") -> None:
        if period_ns <= 0:
            raise ValueError(f"period_ns must be > 0, got {period_ns}")
        self.period_ns, self._tick, self._clock = int(period_ns), tick, sim_clock
        self.priority, self.cpus, self.late_ns = int(priority), cpus, int(late_fraction * period_ns)
        self._stop = threading.Event()
        self._woken = threading.Event()
        self._ready = threading.Event()
        self._lateness = np.zeros(_RING, dtype=np.int64)
        self.ticks = self.late = self.skipped = 0
        self.cpu_ns = 0
        self.tid = 0
        self.rt = RtReport()
        self.failure: BaseException | None = None
        self._jump = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self, timeout: float = 5.0) -> RtReport:
        """Start the thread; returns the real-time settings it applied (once it has)."""
        if self._clock is not None:
            from rclpy.clock import JumpThreshold
            from rclpy.duration import Duration
            self._jump = self._clock.create_jump_callback(
                JumpThreshold(min_forward=Duration(nanoseconds=1), min_backward=None, on_clock_change=True),
                post_callback=lambda _info: self._woken.set())
        self._thread.start()
        self._ready.wait(timeout)
        return self.rt

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop after the tick in progress; True when the thread has ended."""
        self._stop.set()
        self._woken.set()
        if self._thread.ident is not None:
            self._thread.join(timeout)
        if self._jump is not None:
            self._jump.unregister()
            self._jump = None
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stats(self) -> dict[str, object]:
        """Lateness p50 / p99 / max (ms) over the last ticks, late and skipped ticks, CPU per tick (ms)."""
        n = min(self.ticks, _RING)
        lat = self._lateness[:n].copy() / 1e6
        out: dict[str, object] = {"loop.ticks": self.ticks, "loop.late_ticks": self.late,
                                  "loop.skipped_deadlines": self.skipped}
        if n:
            p50, p99 = np.percentile(lat, [50, 99])
            out.update({"loop.lateness_p50_ms": f"{p50:.3f}", "loop.lateness_p99_ms": f"{p99:.3f}",
                        "loop.lateness_max_ms": f"{lat.max():.3f}",
                        "loop.cpu_per_tick_ms": f"{self.cpu_ns / 1e6 / self.ticks:.4f}",
                        "loop.cpu_percent_of_core": f"{100.0 * self.cpu_ns / (self.ticks * self.period_ns):.2f}"})
        return out

    # ------------------------------------------------------------------------------------------ the thread
    def _run(self) -> None:
        self.tid = threading.get_native_id()
        try:
            apply_thread(self.priority, self.cpus, self.rt)
        finally:
            self._ready.set()
        try:
            (self._run_real if self._clock is None else self._run_sim)()
        except BaseException as e:  # reported by the node (diagnostics); the loop ends
            self.failure = e

    def _record(self, late: int, cpu0: int) -> None:
        self._lateness[self.ticks % _RING] = late
        self.ticks += 1
        if late > self.late_ns:
            self.late += 1
        self.cpu_ns = time.thread_time_ns() - cpu0

    def _run_real(self) -> None:
        period, stop, tick = self.period_ns, self._stop, self._tick
        cpu0 = time.thread_time_ns()
        deadline = time.monotonic_ns() + period
        while not stop.is_set():
            wait = deadline - time.monotonic_ns()
            if wait > 0:
                time.sleep(wait / 1e9)
            woke = time.monotonic_ns()
            late = woke - deadline
            tick(time.time_ns())
            self._record(late, cpu0)
            deadline += period
            # catch up by skipping, never by a burst: the deadlines closer than half a period to this tick are
            # skipped (counted); the loop stays on its grid
            soonest = woke + period // 2
            if deadline < soonest:
                missed = -((deadline - soonest) // period)  # ceil((soonest - deadline) / period)
                self.skipped += missed
                deadline += missed * period

    def _run_sim(self) -> None:
        period, stop, tick, clock, woken = self.period_ns, self._stop, self._tick, self._clock, self._woken
        cpu0 = time.thread_time_ns()
        deadline = None
        while not stop.is_set():
            woken.wait(0.05)
            woken.clear()
            now = clock.now().nanoseconds
            if now <= 0:
                continue  # no /clock yet
            if deadline is None or now < deadline - 2 * period:  # the first time, or time went back: re-anchor
                deadline = now + period
                continue
            if now < deadline:
                continue
            missed = (now - deadline) // period
            self.skipped += missed
            deadline += (missed + 1) * period
            tick(now)
            self._record(0, cpu0)
