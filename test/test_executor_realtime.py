"""The chunk executor as a process on real time (its own command loop, loop: thread), beside CPU hogs that make its
ticks irregular on this host: joints driven into both ends of their URDF ranges, and every setpoint received
checked against the position, velocity and acceleration limits with the setpoints' own stamps; the velocity field
agrees with the positions. A second run at rt.priority reads the loop thread's policy back from /proc: SCHED_FIFO
for that thread alone. Both stop cleanly on SIGINT / SIGTERM (exit code 0)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import require_ros, ros_domain

require_ros()

from oxygen_ros.executor.rt import thread_sched  # noqa: E402
from oxygen_ros.ros.stamps import stamp_to_ns  # noqa: E402
from oxygen_ros.testing import NodeProcess  # noqa: E402
from oxygen_ros.testing.executor_probe import ExecutorProbe  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

DOMAIN = ros_domain()
URDF = """<?xml version="1.0"?>
<robot name="range_end_robot">
  <link name="base"/><link name="l1"/><link name="l2"/>
  <joint name="a" type="revolute"><parent link="base"/><child link="l1"/>
    <limit lower="-0.4" upper="0.4" velocity="0.8" effort="1"/></joint>
  <joint name="b" type="revolute"><parent link="l1"/><child link="l2"/>
    <limit lower="-0.3" upper="0.2" velocity="1.0" effort="1"/></joint>
</robot>
"""
LO, HI, VMAX, AMAX = np.array([-0.4, -0.3]), np.array([0.4, 0.2]), np.array([0.8, 1.0]), np.array([3.0, 6.0])


@contextlib.contextmanager
def hogs(n: int):
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_limits_hold_on_every_setpoint_on_real_time_with_irregular_ticks() -> None:
    overrides = {"command_rate_hz": 100.0, "interpolation": "linear", "limits.a.max_acceleration": float(AMAX[0]),
                 "limits.b.max_acceleration": float(AMAX[1]), "stale_timeout_s": 2.0}
    proc = NodeProcess(None, {"output": "joint_state", **overrides}, domain_id=DOMAIN,
                       module="oxygen_ros.executor").start()
    pr = ExecutorProbe(DOMAIN, output="joint_state")
    names, start = ["a", "b"], [0.1, -0.1]
    try:
        assert pr.wait_for_executor(40), proc.output()
        pr.publish_urdf(URDF)

        def tracked() -> list[float]:  # a robot that tracks every setpoint
            got = pr.got_outputs()
            return list(got[-1].position) if got else start
        pr.stream_joints(names, tracked, rate_hz=50.0)
        assert pr.wait_for(lambda: pr.diagnostic("limits.robot") == "range_end_robot"
                           and int(pr.diagnostic("joint_states.joints", "0")) >= 2, 30), pr.diagnostics
        with hogs(2):
            t_end = time.monotonic() + 6.0
            frame = 0
            while time.monotonic() < t_end:  # beyond the upper ends for 2 s, the lower for 2 s, then upper again
                phase = int((t_end - time.monotonic()) // 2) % 2
                target = np.array([2.0, 2.0]) * (1 if phase == 0 else -1)
                pr.publish_chunk(np.tile(target, (10, 1)), pr.now_ns(), 0.05, names, frame_index=frame)
                frame += 1
                time.sleep(0.1)
        outs = [m for m in pr.got_outputs()]
        assert len(outs) > 100, (len(outs), proc.output())
    finally:
        pr.close()
        rc = proc.stop(timeout=15)
    assert rc == 0, proc.output()
    t = np.array([stamp_to_ns(m.header.stamp) for m in outs], dtype=np.int64)
    p = np.array([list(m.position) for m in outs])
    v_pub = np.array([list(m.velocity) for m in outs])
    h = np.diff(t).astype(np.float64) / 1e9
    assert (h > 0).all()
    v = np.diff(p, axis=0) / h[:, None]
    acc = np.diff(v, axis=0) / h[1:, None]
    spread = f"tick spacing ms: min {h.min() * 1e3:.2f} p50 {np.median(h) * 1e3:.2f} max {h.max() * 1e3:.2f}"
    tol = 1e-6
    assert (p >= LO - tol).all() and (p <= HI + tol).all(), (p.min(0), p.max(0), spread)
    assert (np.abs(v) <= VMAX * (1 + tol) + tol).all(), (np.abs(v).max(0), spread)
    assert (np.abs(acc) <= AMAX * (1 + 1e-6) + 1e-4).all(), (np.abs(acc).max(0), spread)
    np.testing.assert_allclose(v_pub[1:], v, rtol=1e-6, atol=1e-4, err_msg=spread)  # velocity = the steps'
    # driven into both range ends (within a hundredth of the range): the test saw what it checks
    assert (p.max(0) > HI - 0.01 * (HI - LO)).all() and (p.min(0) < LO + 0.01 * (HI - LO)).all(), \
        (p.min(0), p.max(0), spread)
    print(spread)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_rt_priority_reaches_the_loop_thread_alone_and_it_stops_cleanly(sig: int) -> None:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    proc = NodeProcess(None, {"command_rate_hz": 200.0, "action_names": ["a"], "rt.priority": 20,
                              "rt.cpus": str(cpu)}, domain_id=DOMAIN + 1, module="oxygen_ros.executor").start()
    pr = ExecutorProbe(DOMAIN + 1)
    try:
        assert pr.wait_for(lambda: int(pr.diagnostic("loop.ticks", "0")) > 50, 40), (pr.diagnostics, proc.output())
        d = dict(pr.diagnostics)
        tid, pid = int(d["rt.tid"]), proc.proc.pid
        assert "rt.priority 20" in proc.output() or "policy SCHED_" in proc.output(), proc.output()
        threads = {int(x): thread_sched(int(x), pid) for x in os.listdir(f"/proc/{pid}/task")}
        fifo = {k for k, (policy, _, _) in threads.items() if policy == "SCHED_FIFO"}
        if d["rt.policy"] == "SCHED_FIFO 20":
            assert fifo == {tid} and threads[tid][1:] == (20, {cpu}), threads
        else:  # a machine that refuses it: warned, normal priority, still ticking
            assert d["rt.policy"] == "SCHED_OTHER (refused)" and not fifo and "refused" in proc.output()
        assert d["loop"] == "thread" and 0 < float(d["loop.cpu_percent_of_core"]) <= 100, d  # one thread: one core
        for key in ("loop.lateness_p99_ms", "loop.late_ticks", "loop.skipped_deadlines", "rt.switch_interval_s",
                    "rt.gc", "rt.mlockall"):
            assert key in d, (key, d)
    finally:
        pr.close()
        rc = proc.stop(sig=sig, timeout=15)
    assert rc == 0, proc.output()
    assert "Traceback" not in proc.output(), proc.output()
