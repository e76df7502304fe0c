"""Keep native libraries from raising this process's threads to a real-time policy.

SVT-AV1 (LeRobot's default video encoder, bundled in PyAV's wheels), run as root or with CAP_SYS_NICE, puts the
thread that opens an encoder and every encoder thread on SCHED_FIFO 99, and leaves the caller there. Every thread
that caller creates afterwards inherits it. On a robot that starves the controllers (priorities below 99) while an
export encodes; in a long process (the test suite) a later busy child at FIFO 99 freezes the process that started
it. :class:`NormalPriority` records which threads ran at a real-time policy before the block, puts every other one
back on SCHED_OTHER whenever :meth:`NormalPriority.restore` is called (the encoder: once its first frame has
started its threads) and when the block ends, and restores the calling thread's own policy then.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

__all__ = ["NormalPriority", "realtime_threads", "thread_policy"]

_REALTIME = {getattr(os, "SCHED_FIFO", 1), getattr(os, "SCHED_RR", 2)}


def thread_policy(tid: int | str, pid: int | str = "self") -> tuple[int, int]:
    """(scheduling policy, real-time priority) of thread ``tid`` of process ``pid``, read from ``/proc``.

    Raises:
        OSError: no such thread (it ended).
    """
    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name, field 3 (state) is fields[0]
    return int(fields[41 - 3]), int(fields[40 - 3])


def realtime_threads() -> dict[int, tuple[int, int]]:
    """This process's threads on SCHED_FIFO or SCHED_RR: ``{tid: (policy, priority)}`` ({} without /proc)."""
    out: dict[int, tuple[int, int]] = {}
    try:
        tids = [int(task.name) for task in Path("/proc/self/task").iterdir()]
    except OSError:
        return out
    for tid in tids:
        try:
            policy, priority = thread_policy(tid)
        except OSError:
            continue  # the thread ended meanwhile
        if policy in _REALTIME:
            out[tid] = (policy, priority)
    return out


class NormalPriority:
    """``with NormalPriority() as guard: ...; guard.restore()``: threads raised to a real-time policy inside the
    block go back to SCHED_OTHER; the calling thread gets back its own policy (also when it was real-time).

    A no-op where the OS has no ``sched_setscheduler`` (not Linux)."""

    def __init__(self) -> None:
        self._supported = hasattr(os, "sched_setscheduler") and hasattr(os, "sched_getscheduler")
        self._tid = threading.get_native_id()
        self._before: dict[int, tuple[int, int]] = {}
        self._own: tuple[int, int] | None = None
        self.restored = 0  # threads put back on SCHED_OTHER, counted over the block

    def __enter__(self) -> NormalPriority:
        if self._supported:
            self._own = (os.sched_getscheduler(self._tid), os.sched_getparam(self._tid).sched_priority)
            self._before = realtime_threads()
        return self

    def restore(self) -> int:
        """Every thread raised since the block began (the caller too) back on SCHED_OTHER; how many were."""
        if not self._supported:
            return 0
        n = 0
        for tid, now in realtime_threads().items():
            if tid in self._before and tid != self._tid:
                continue  # real-time before the block: its owner's choice
            if tid == self._tid and self._own is not None and now == self._own:
                continue
            try:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                n += 1
            except OSError:
                pass  # ended meanwhile, or not ours to change
        self.restored += n
        return n

    def __exit__(self, *exc: object) -> None:
        self.restore()
        if self._own is not None and self._own[0] in _REALTIME:  # the caller was real-time: as it was
            with contextlib.suppress(OSError):
                os.sched_setscheduler(self._tid, self._own[0], os.sched_param(self._own[1]))
