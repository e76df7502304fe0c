"""The frame watchdog (:class:`FrameWatchdog`): reports a frame that runs longer than its limit; thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["FrameWatchdog"]


class FrameWatchdog:
    """Times the running frame: :meth:`check` reports, once per frame, a frame running longer than ``limit_s``."""

    def __init__(self, limit_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s, self._clock = limit_s, clock
        self._lock = threading.Lock()
        self._started: float | None = None
        self._tripped = False
        self.trips = 0
        self.longest_s = 0.0

    def begin(self) -> None:
        with self._lock:
            self._started, self._tripped = self._clock(), False

    def end(self) -> float | None:
        """The frame ended: its duration when it had tripped the watchdog, else None."""
        with self._lock:
            if self._started is None:
                return None
            took = self._clock() - self._started
            self.longest_s = max(self.longest_s, took)
            tripped, self._started = self._tripped, None
            return took if tripped else None

    def running_s(self) -> float:
        """How long the current frame has run (0 when none runs)."""
        with self._lock:
            return 0.0 if self._started is None else self._clock() - self._started

    @property
    def tripped(self) -> bool:
        """The running frame has exceeded the limit."""
        with self._lock:
            return self._started is not None and self._tripped

    def check(self) -> float | None:
        """The running time when the running frame has just exceeded the limit (once per frame), else None."""
        with self._lock:
            if self._started is None or self._tripped:
                return None
            running = self._clock() - self._started
            if running <= self.limit_s:
                return None
            self._tripped = True
            self.trips += 1
            return running

    def diagnostics(self) -> dict[str, object]:
        running = self.running_s()
        return {"watchdog_s": f"{self.limit_s:g}", "watchdog.trips": self.trips,
                "watchdog.frame_running_s": f"{running:.2f}", "watchdog.longest_frame_s": f"{self.longest_s:.3f}"}
