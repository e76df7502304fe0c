"""The enable gate and the halt input (:class:`ActionGate`): whether chunks may go to the robot. Thread-safe (the
inference thread asks, the executor's callbacks set); the node wires it to ``~/enable``, ``~/halt`` and ``~/run``.
"""

from __future__ import annotations

import threading

__all__ = ["ActionGate"]


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
