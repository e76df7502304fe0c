"""What stands between a denoised chunk and the robot, besides the joint limits (:mod:`.limits`): the enable gate
and the halt input (:class:`ActionGate`), the count of consecutive failing frames that sends the node to the
lifecycle's error processing (:class:`FaultCounter`) and the frame watchdog (:class:`FrameWatchdog`). Pure
bookkeeping, thread-safe (the inference thread asks, the executor's callbacks set); the node wires them to
``~/enable``, ``~/halt`` and its lifecycle.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["ActionGate", "FaultCounter", "FrameWatchdog", "NewestPerPublisher"]


class ActionGate:
    """Whether chunks may be published: enabled (``~/enable``, ``start_enabled``) and not halted (``~/halt``).

    A chunk observed before the gate last opened is never published, so enabling again (or releasing a halt) cannot
    replay a stale chunk: the first chunk out is one whose observation came after the opening.
    """

    def __init__(self, enabled: bool, now_ns: int = 0) -> None:
        self._lock = threading.Lock()
        self._enabled, self._halted = bool(enabled), False
        self._held = False  # a ~/run goal ended with on_end hold (or was canceled): released by a goal or ~/enable
        self._opened_ns = now_ns  # node time the gate last opened
        self.withheld: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        with self._lock:
            return self._enabled

    @property
    def halted(self) -> bool:
        with self._lock:
            return self._halted

    @property
    def held(self) -> bool:
        with self._lock:
            return self._held

    def set_enabled(self, enabled: bool, now_ns: int) -> bool:
        """Enable or disable (``~/enable``, which also releases a task's hold); returns whether this changed
        anything."""
        released = self._set("_held", False, now_ns)
        return self._set("_enabled", bool(enabled), now_ns) or released

    def set_held(self, held: bool, now_ns: int) -> bool:
        """Hold (a ``~/run`` goal ended: no chunk until a new goal or ``~/enable``) or release; returns whether this
        changed anything."""
        return self._set("_held", bool(held), now_ns)

    def set_halted(self, halted: bool, now_ns: int) -> bool:
        """Halt or release; returns whether this changed anything."""
        return self._set("_halted", bool(halted), now_ns)

    def _set(self, flag: str, value: bool, now_ns: int) -> bool:
        with self._lock:
            was_open, changed = self._open(), getattr(self, flag) != value
            setattr(self, flag, value)
            if self._open() and not was_open:
                self._opened_ns = now_ns
            return changed

    def _open(self) -> bool:
        return self._enabled and not self._halted and not self._held

    def why_closed(self, stamp_ns: int | None = None) -> str | None:
        """None when a chunk observed at ``stamp_ns`` may be published; else the reason (counted in
        :attr:`withheld` when a stamp is given): halted, disabled, held or observed_before_enable."""
        with self._lock:
            reason = "halted" if self._halted else "disabled" if not self._enabled else "held" if self._held else \
                "observed_before_enable" if stamp_ns is not None and stamp_ns < self._opened_ns else None
            if reason is not None and stamp_ns is not None:
                self.withheld[reason] = self.withheld.get(reason, 0) + 1
            return reason

    def diagnostics(self) -> dict[str, object]:
        why = self.why_closed()
        explain = {"halted": "halted (~/halt is true)", "disabled": "disabled (call ~/enable with data: true)",
                   "held": "held (a ~/run goal ended; a new goal or ~/enable releases it)"}
        with self._lock:
            values: dict[str, object] = {"enabled": self._enabled, "halted": self._halted, "held": self._held,
                                         "actions": "published" if why is None else f"withheld: {explain[why]}"}
            values.update({f"withheld.{k}": n for k, n in sorted(self.withheld.items())})
        return values


class NewestPerPublisher:
    """Drops a message not newer than the last one taken from the same publisher (a subscriber on both a
    transient-local and a volatile subscription receives a latched publisher's messages twice, the late duplicate
    possibly after a newer message). ``info``: rclpy's message info."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq: dict[str, int] = {}

    def is_new(self, info: Mapping[str, Any] | None) -> bool:
        gid = None if info is None else info.get("publisher_gid")
        seq = None if info is None else info.get("publication_sequence_number")
        if gid is None or seq is None:
            return True
        key = repr(gid.get("data", gid) if isinstance(gid, Mapping) else gid)
        with self._lock:
            if seq <= self._seq.get(key, -1):
                return False
            self._seq[key] = int(seq)
        return True


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
