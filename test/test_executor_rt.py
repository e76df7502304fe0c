"""The executor's real-time settings (oxygen_ros/executor/rt.py, loop.py), read back from /proc: SCHED_FIFO and
the CPU affinity reach the command loop's thread and no other; a priority or CPU set the OS refuses gives a warning
and a loop at normal priority, never a crash; the executor process reports them on /diagnostics; the machine's
capability, as oxygen-doctor reports it, says SCHED_FIFO is refused where it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from oxygen_ros.executor.loop import CommandLoop
from oxygen_ros.executor.rt import apply_process, thread_sched
from oxygen_ros.robot.realtime import fifo_refusal

REPO = Path(__file__).resolve().parents[1]


def test_the_loop_thread_alone_gets_sched_fifo_and_its_cpus() -> None:
    if fifo_refusal():
        pytest.skip("this machine refuses SCHED_FIFO (the refused path is tested below)")
    cpu = sorted(os.sched_getaffinity(0))[-1]
    ticks: list[int] = []
    loop = CommandLoop(5_000_000, ticks.append, priority=10, cpus=str(cpu))
    report = loop.start()
    try:
        assert report.values["rt.policy"] == "SCHED_FIFO 10" and not report.warnings, report
        policy, prio, allowed = thread_sched(loop.tid)
        assert (policy, prio, allowed) == ("SCHED_FIFO", 10, {cpu})
        assert thread_sched(threading.get_native_id())[0] == "SCHED_OTHER"  # this thread is left alone
        assert thread_sched(threading.get_native_id())[2] == os.sched_getaffinity(0)
        deadline = time.monotonic() + 10
        while len(ticks) < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(ticks) >= 20
        stats = loop.stats()
        lateness = [float(stats[f"loop.lateness_{q}_ms"]) for q in ("p50", "p99", "max")]
        assert stats["loop.ticks"] >= 20 and lateness == sorted(lateness), stats  # p50 <= p99 <= max
        assert float(stats["loop.cpu_per_tick_ms"]) > 0
    finally:
        assert loop.stop()
    assert all(b > a for a, b in zip(ticks, ticks[1:], strict=False))  # one tick per deadline, in order


DROP_CAPS = """
import ctypes, resource
resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 * 1024, 64 * 1024))
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
libc = ctypes.CDLL(None, use_errno=True)
header, data = Header(0x20080522, 0), (Data * 2)()
assert libc.capget(ctypes.byref(header), data) == 0
drop = ~((1 << 23) | (1 << 14))  # CAP_SYS_NICE, CAP_IPC_LOCK: as an unprivileged user
data[0].effective &= drop
data[0].permitted &= drop
data[0].inheritable &= drop
assert libc.capset(ctypes.byref(header), data) == 0, ctypes.get_errno()
"""

REFUSED = DROP_CAPS + """
import json, time
from oxygen_ros.executor.loop import CommandLoop
from oxygen_ros.executor.rt import apply_process, thread_sched
ticks = []
loop = CommandLoop(10_000_000, ticks.append, priority=50, cpus="4095")
report = loop.start()
proc = apply_process(0.001, True)
time.sleep(0.3)
policy = thread_sched(loop.tid)[0]
loop.stop()
print(json.dumps({"values": {**report.values, **proc.values}, "warnings": report.warnings + proc.warnings,
                  "policy": policy, "ticks": len(ticks)}))
"""


def test_refused_settings_warn_and_the_loop_runs_at_normal_priority() -> None:
    """In a child process without CAP_SYS_NICE / CAP_IPC_LOCK, RLIMIT_RTPRIO 0, RLIMIT_MEMLOCK 64 KiB (an
    unprivileged user's lot), and with a CPU that does not exist."""
    proc = subprocess.run([sys.executable, "-c", REFUSED], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["values"]["rt.policy"] == "SCHED_OTHER (refused)" and out["policy"] == "SCHED_OTHER"
    assert out["values"]["rt.cpus"] == "any (refused)"
    assert out["values"]["rt.mlockall"] == "refused"
    assert any("rt.priority 50" in w and "oxygen-doctor" in w for w in out["warnings"]), out
    assert any("rt.cpus" in w for w in out["warnings"]) and any("memlock" in w for w in out["warnings"]), out
    assert out["ticks"] >= 5  # and it runs

    cap = subprocess.run([sys.executable, "-c", DROP_CAPS + "import json; from oxygen_ros.robot.realtime import "
                          "capability; print(json.dumps(capability()))"], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert cap.returncode == 0, cap.stderr
    checks = {name: (ok, detail, fix) for name, ok, detail, fix in json.loads(cap.stdout)}
    ok, detail, fix = checks["SCHED_FIFO allowed"]
    assert not ok and "refused" in detail and "limits.conf" in fix and "rtprio" in fix


def test_switch_interval_is_set() -> None:
    before = sys.getswitchinterval()
    try:
        assert apply_process(0.0007, False).values["rt.switch_interval_s"] == "0.0007"
        assert sys.getswitchinterval() == pytest.approx(0.0007)
    finally:
        sys.setswitchinterval(before)


def test_a_late_tick_skips_to_the_next_deadline_never_a_burst() -> None:
    """A tick that overruns by several periods: the missed deadlines are counted as skipped, and the loop never
    ticks more than once per deadline to catch up (a burst of ticks would be a burst of motion)."""
    period = 20_000_000
    times: list[int] = []

    def tick(_stamp: int) -> None:
        times.append(time.monotonic_ns())
        if len(times) == 3:
            time.sleep(0.095)  # 4.75 periods

    loop = CommandLoop(period, tick)
    loop.start()
    t0 = time.monotonic_ns()
    time.sleep(0.6)
    assert loop.stop()
    elapsed = time.monotonic_ns() - t0
    assert loop.skipped >= 3, loop.stats()
    assert len(times) <= elapsed // period + 1  # at most one tick per deadline
    after = np.diff(times[2:6]) / 1e6  # the ticks right after the long one: spaced by the grid, not back to back
    assert (after[1:] > 0.5 * period / 1e6).all(), after
    assert loop.stats()["loop.skipped_deadlines"] == loop.skipped
