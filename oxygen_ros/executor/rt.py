"""Real-time settings for one thread (the executor's command loop) and what this machine allows.

:func:`apply_thread` gives the *calling* thread SCHED_FIFO at ``priority`` and the CPU affinity ``cpus``, by its
native thread id, so the process's other threads (DDS, rclpy's executor) keep their normal policy. A setting the
OS refuses is reported, never raised: the loop then runs at normal priority. :func:`apply_process` sets what is
process-wide (the interpreter's switch interval, ``mlockall``). :func:`thread_sched` reads a thread's policy,
priority and affinity back from ``/proc/self/task/<tid>/``. What the machine allows (for ``oxygen-doctor``):
:func:`oxygen_ros.robot.realtime.capability`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..util.sched import thread_policy

__all__ = ["RtReport", "apply_process", "apply_thread", "parse_cpus", "thread_sched"]

_MCL_CURRENT, _MCL_FUTURE = 1, 2
_POLICIES = {0: "SCHED_OTHER", 1: "SCHED_FIFO", 2: "SCHED_RR", 3: "SCHED_BATCH", 5: "SCHED_IDLE"}


def parse_cpus(spec: str) -> set[int]:
    """``"2,3"``, ``"2-3"``, ``"1,4-5"`` as a set of CPU numbers ('' = none).

    Raises:
        ValueError: not a CPU list.
    """
    out: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"not a CPU list (e.g. '2,3' or '2-3'): {spec!r}")
        a, b = int(lo), int(hi or lo)
        if b < a:
            raise ValueError(f"not a CPU list (range {part} goes down): {spec!r}")
        out.update(range(a, b + 1))
    return out


@dataclass
class RtReport:
    """What was asked and what took effect; ``warnings`` names each refusal once."""

    values: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def apply_thread(priority: int, cpus: str, report: RtReport | None = None) -> RtReport:
    """SCHED_FIFO ``priority`` (0 = leave the policy) and affinity ``cpus`` ('' = leave it) for the calling
    thread only (its native id)."""
    report = report or RtReport()
    tid = threading.get_native_id()
    report.values["rt.tid"] = str(tid)
    if priority > 0:
        try:
            os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(priority))
            report.values["rt.policy"] = f"SCHED_FIFO {priority}"
        except (OSError, ValueError) as e:
            report.values["rt.policy"] = "SCHED_OTHER (refused)"
            report.warnings.append(f"rt.priority {priority}: SCHED_FIFO refused ({e}); the command loop runs at "
                                   "normal priority (oxygen-doctor names the fix)")
    else:
        report.values["rt.policy"] = "SCHED_OTHER"
    if cpus:
        try:
            os.sched_setaffinity(tid, parse_cpus(cpus))
            report.values["rt.cpus"] = cpus
        except (OSError, ValueError) as e:
            report.values["rt.cpus"] = "any (refused)"
            report.warnings.append(f"rt.cpus {cpus!r}: affinity refused ({e}); the command loop runs on any CPU")
    else:
        report.values["rt.cpus"] = "any"
    return report


def apply_process(switch_interval_s: float, mlockall: bool, report: RtReport | None = None) -> RtReport:
    """The interpreter's switch interval (0 = leave it) and ``mlockall(MCL_CURRENT | MCL_FUTURE)``."""
    report = report or RtReport()
    if switch_interval_s > 0:
        sys.setswitchinterval(switch_interval_s)
    report.values["rt.switch_interval_s"] = f"{sys.getswitchinterval():g}"
    if mlockall:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.mlockall(_MCL_CURRENT | _MCL_FUTURE) == 0:
            report.values["rt.mlockall"] = "locked"
        else:
            err = ctypes.get_errno()
            report.values["rt.mlockall"] = "refused"
            report.warnings.append(f"rt.mlockall: refused ({os.strerror(err)}); memory may be paged out (raise "
                                   "RLIMIT_MEMLOCK: 'memlock unlimited' in /etc/security/limits.conf)")
    else:
        report.values["rt.mlockall"] = "off"
    return report


def thread_sched(tid: int, pid: int | str = "self") -> tuple[str, int, set[int]]:
    """(policy name, real-time priority, allowed CPUs) of thread ``tid``, read from ``/proc``."""
    base = Path(f"/proc/{pid}/task/{tid}")
    policy, rt_priority = thread_policy(tid, pid)
    allowed: set[int] = set()
    for line in (base / "status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            allowed = parse_cpus(line.split(":", 1)[1].strip())
    return _POLICIES.get(policy, str(policy)), rt_priority, allowed
