"""The count of consecutive failing frames that sends the node to the lifecycle's error processing
(:class:`FaultCounter`); thread-safe.
"""

from __future__ import annotations

import threading

__all__ = ["FaultCounter"]


class FaultCounter:
    """Consecutive failing frames; ``limit`` of them in a row trips it (0 = never)."""

    def __init__(self, limit: int = 0) -> None:
        self._lock = threading.Lock()
        self.limit = limit
        self.reset()

    def reset(self, limit: int | None = None) -> None:
        """Forget the faults (a new configure); optionally a new limit."""
        with self._lock:
            if limit is not None:
                self.limit = limit
            self.consecutive = 0
            self.total = 0
            self.last = ""
            self.tripped = False

    def failure(self, error: BaseException) -> bool:
        """One failed frame; True exactly when this failure trips the counter."""
        with self._lock:
            self.consecutive += 1
            self.total += 1
            self.last = f"{type(error).__name__}: {error}"[:500]
            if self.limit and self.consecutive >= self.limit and not self.tripped:
                self.tripped = True
                return True
            return False

    def success(self) -> None:
        with self._lock:
            self.consecutive = 0

    def diagnostics(self) -> dict[str, object]:
        with self._lock:
            values: dict[str, object] = {"faults.consecutive": self.consecutive, "faults.total": self.total,
                                         "faults.max_consecutive": self.limit}
            if self.last:
                values["faults.last"] = self.last
            return values
