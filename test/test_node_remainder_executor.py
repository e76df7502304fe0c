"""``rtc.remainder_source: executor`` over real DDS (the node side): the node builds the real-time
chunking remainder from the chunk executor's ``oxygen_ros/ExecutedPlan``, not from the timing rule.

A real publisher of the real message stands in for the executor process: every 20 ms it publishes a plan whose
row due at time t is a known function f(t) (a ramp per joint, in the executor's joint order, reversed against the
node's). The remainder the node used for an observation stamped t1 (its /diagnostics report, robot units, node
order) must then be f(t1 + (k + 1) dt) for k = 0, 1, ... within half a step (the executor's grid and the
observation's may be offset by less than dt / 2, one offset for all rows). When the plans stop, the node falls
back to the timing rule and counts it.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest
from conftest import require_ros, ros_domain

require_ros()

from builtin_interfaces.msg import Duration  # noqa: E402
from oxygen_ros.msg import ExecutedPlan  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402

from oxygen_ros.ros.stamps import time_msg  # noqa: E402
from oxygen_ros.testing import NodeProcess, Probe  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

CONFIG = Path(__file__).resolve().parents[1] / "config" / "synthetic.yaml"
CAMERAS = [("base_0_rgb", "/cameras/base_0_rgb/image_raw"), ("left_wrist_0_rgb", "/cameras/left_wrist_0_rgb/image_raw")]
JOINTS = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
DT_NS = 50_000_000  # 20 Hz actions
SLOPE = 1.0  # rad/s: 0.05 per action step
DOMAIN = ros_domain()


def ramp(t_ns: np.ndarray | int, t0_ns: int) -> np.ndarray:
    """f(t) per joint in the node's order: joint j at 0.1 j + SLOPE (t - t0) (float32, as the plan carries it)."""
    t = (np.atleast_1d(np.asarray(t_ns, dtype=np.int64)) - t0_ns) / 1e9
    return (0.1 * np.arange(len(JOINTS))[None, :] + SLOPE * t[:, None]).astype(np.float32).astype(np.float64)


class PlanPublisher:
    """Stands in for the executor: publishes ExecutedPlan on ``topic`` from the probe's node every 20 ms."""

    def __init__(self, probe: Probe, topic: str, rows: int = 20) -> None:
        self.node, self.rows = probe.node, rows
        self.t0 = self.node.get_clock().now().nanoseconds
        self.pub = self.node.create_publisher(ExecutedPlan, topic, QoSProfile(depth=10,
                                                                              reliability=ReliabilityPolicy.RELIABLE))
        self.names = JOINTS[::-1]  # the executor's order differs from the node's: reordered by name
        self.sent = 0
        self.timer = self.node.create_timer(0.02, self.publish)

    def publish(self) -> None:
        now = self.node.get_clock().now().nanoseconds
        # the executor's grid: t0 + 7 ms + i dt (offset against the observations' stamps)
        start = self.t0 + 7_000_000 + ((now - self.t0) // DT_NS + 1) * DT_NS
        times = start + np.arange(self.rows) * DT_NS
        plan = ramp(times, self.t0)[:, ::-1]
        msg = ExecutedPlan(joint_names=self.names, setpoint=plan[0].tolist(), step=3, frame_index=1)
        msg.header.stamp = time_msg(now)
        msg.plan_start = time_msg(start)
        msg.dt = Duration(sec=0, nanosec=DT_NS)
        msg.plan_length = self.rows
        msg.plan = plan.astype(np.float32).ravel().tolist()
        self.pub.publish(msg)
        self.sent += 1

    def stop(self) -> None:
        self.timer.cancel()


def test_the_remainder_equals_the_executed_plan_and_falls_back_without_one() -> None:
    node = NodeProcess(CONFIG, {"control_rate_hz": 5.0, "action_rate_hz": 1e9 / DT_NS, "request_every_n_frames": 0,
                                "max_image_age_s": 0.5, "rtc.enabled": True, "rtc.remainder_source": "executor",
                                "rtc.executor_topic": "/executor/executed"}, domain_id=DOMAIN).start()
    probe = Probe(CAMERAS, JOINTS, image_size=48, domain_id=DOMAIN)
    plans = None
    try:
        assert probe.wait_for_subscribers(30), node.output()
        plans = PlanPublisher(probe, "/executor/executed")
        probe.start_stream(10.0)
        probe.publish_instruction("put the red block on the blue plate")

        def used_plans() -> bool:
            d = probe.diagnostics()
            return int(d.get("rtc_remainders_executor", 0)) >= 3 and d.get("rtc_last_remainder_source") == "executor"

        assert probe.wait_for(used_plans, 40), (probe.diagnostics(), node.output())
        diag = probe.diagnostics()
        used = np.asarray(json.loads(diag["rtc_last_remainder"]))
        stamp = int(diag["rtc_last_remainder_stamp_ns"])
        assert used.shape == (4, len(JOINTS)), used.shape
        expected = ramp(stamp + (np.arange(4) + 1) * DT_NS, plans.t0)
        err = used - expected
        step = SLOPE * DT_NS / 1e9
        assert np.all(np.abs(err) <= step / 2 + 1e-4), (err, diag)  # the row due then, within the grid offset
        assert np.ptp(err) < 1e-3, err  # one offset for every row and joint: order and reordering right
        assert diag["rtc_remainder_source"] == "executor" and int(diag["rtc_executor_plans_received"]) > 10, diag

        plans.stop()  # the executor goes away: the timing rule, counted
        before = int(diag.get("rtc_remainder_fallbacks", 0))
        assert probe.wait_for(lambda: int(probe.diagnostics().get("rtc_remainder_fallbacks", 0)) >= before + 2
                              and probe.diagnostics().get("rtc_last_remainder_source") == "timing_rule", 20), \
            probe.diagnostics()
        assert int(probe.diagnostics()["rtc_remainders_timing_rule"]) >= 1
    finally:
        if plans is not None:
            plans.stop()
        probe.close()
        node.stop(signal.SIGINT, timeout=10)
