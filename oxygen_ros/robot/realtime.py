"""What this machine allows a real-time command loop (the chunk executor's, :mod:`oxygen_ros.executor.rt`):
SCHED_FIFO (RLIMIT_RTPRIO or CAP_SYS_NICE), a PREEMPT_RT kernel, isolated CPUs and mlockall, each with its fix.
``oxygen-doctor`` reports it."""

from __future__ import annotations

import os
import platform
import resource
import threading
from pathlib import Path

__all__ = ["capability", "fifo_refusal"]


def _cap_sys_nice() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << 23))
    return False


def capability() -> list[tuple[str, bool, str, str]]:
    """What this machine allows for a real-time loop: (check, ok, what was found, the fix when not ok)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_RTPRIO)
    cap = _cap_sys_nice()
    rtprio = hard == resource.RLIM_INFINITY or hard > 0
    tried = fifo_refusal()
    out = [("SCHED_FIFO allowed", (rtprio or cap) and not tried,
            f"RLIMIT_RTPRIO soft {_lim(soft)} hard {_lim(hard)}, CAP_SYS_NICE {'yes' if cap else 'no'}; a thread "
            f"at SCHED_FIFO 1: {tried or 'granted'}",
            "add '@realtime - rtprio 99' and '@realtime - memlock unlimited' to /etc/security/limits.conf, put "
            "the user in group realtime and log in again (or run with CAP_SYS_NICE; in a container "
            "--cap-add=SYS_NICE --ulimit rtprio=99)")]
    rt_file = Path("/sys/kernel/realtime")
    uname = platform.uname()
    preempt_rt = (rt_file.exists() and rt_file.read_text().strip() == "1") or "PREEMPT_RT" in uname.version
    out.append(("PREEMPT_RT kernel", preempt_rt, f"{uname.release} ({uname.version})",
                "boot a PREEMPT_RT kernel (Ubuntu Pro: 'pro enable realtime-kernel'; Jetson: the L4T RT kernel)"))
    iso = Path("/sys/devices/system/cpu/isolated")
    isolated = iso.read_text().strip() if iso.exists() else ""
    out.append(("isolated CPUs", bool(isolated), isolated or "none",
                "reserve a core for the loop: kernel arguments 'isolcpus=N nohz_full=N rcu_nocbs=N', then "
                "rt.cpus:=N"))
    mem_soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    out.append(("mlockall allowed", mem_soft == resource.RLIM_INFINITY or os.geteuid() == 0,
                f"RLIMIT_MEMLOCK {_lim(mem_soft)}", "'memlock unlimited' in /etc/security/limits.conf"))
    return out


def fifo_refusal() -> str:
    """'' when a thread of this process gets SCHED_FIFO 1, else why not (e.g. a container's cgroup)."""
    why: list[str] = []

    def probe() -> None:
        try:
            os.sched_setscheduler(threading.get_native_id(), os.SCHED_FIFO, os.sched_param(1))
        except OSError as e:
            why.append(f"refused ({e.strerror})")

    t = threading.Thread(target=probe, name="rt-probe")
    t.start()
    t.join()
    return why[0] if why else ""


def _lim(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)
