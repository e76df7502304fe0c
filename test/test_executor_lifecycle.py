"""The executor as a lifecycle node (as ros2_control's controllers), in its own process over real DDS, driven
through its lifecycle services: unconfigured and inactive it publishes nothing; activate starts the command loop
from the measured position; deactivate holds the setpoint (published unchanged) and then stops publishing; a second
activate starts again from the measured position, rate-limited. Autostart (the default) is what every other
executor test relies on."""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import require_ros, ros_domain

require_ros()

from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetState  # noqa: E402

from oxygen_ros.testing import NodeProcess  # noqa: E402
from oxygen_ros.testing.executor_probe import ExecutorProbe  # noqa: E402
from oxygen_ros.testing.services import call, change_state  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

DOMAIN = ros_domain()
VMAX = 0.5


def test_lifecycle_transitions_with_the_hold_on_deactivate() -> None:
    proc = NodeProcess(None, {"output": "joint_state", "autostart": False, "command_rate_hz": 100.0,
                              "limits.a.max_velocity": VMAX, "limits.b.max_velocity": VMAX,
                              "deactivate_hold_s": 0.2}, domain_id=DOMAIN, module="oxygen_ros.executor").start()
    pr = ExecutorProbe(DOMAIN)
    try:
        change = pr.node.create_client(ChangeState, "/oxygen_executor/change_state")
        get = pr.node.create_client(GetState, "/oxygen_executor/get_state")
        assert change.wait_for_service(timeout_sec=40) and get.wait_for_service(timeout_sec=10), proc.output()
        assert pr.wait_for_executor(40, active=False), proc.output()
        state = lambda: call(get, GetState.Request()).current_state.label  # noqa: E731
        transition = lambda t: change_state(change, get, t)  # noqa: E731
        names, measured = ["a", "b"], [0.2, -0.1]

        def tracked() -> list[float]:  # a robot that tracks every setpoint
            got = pr.got_outputs()
            return list(got[-1].position) if got else measured
        pr.stream_joints(names, tracked)
        assert state() == "unconfigured"
        time.sleep(0.5)
        assert pr.got_executed() == [] and pr.got_outputs() == []  # nothing before activate
        assert transition(Transition.TRANSITION_CONFIGURE)
        assert state() == "inactive"
        time.sleep(0.5)
        assert pr.got_outputs() == []
        assert transition(Transition.TRANSITION_ACTIVATE)
        assert state() == "active"

        def feed(seconds: float, frame0: int) -> int:  # chunks moving both joints up at 0.3 /s, every 100 ms
            frame, end = frame0, time.monotonic() + seconds
            while time.monotonic() < end:
                now = pr.now_ns()
                rows = np.array(tracked()) + 0.3 * 0.05 * (np.arange(1, 11)[:, None])
                pr.publish_chunk(rows, now, 0.05, names, frame_index=frame)
                frame += 1
                time.sleep(0.1)
            return frame
        frame = feed(1.5, 1)
        first = pr.got_outputs()[0]
        assert np.all(np.abs(np.array(first.position) - measured) <= VMAX * 0.01 * 1.5 + 1e-9), first.position
        moving = pr.got_outputs()
        assert moving[-1].position[0] > moving[0].position[0] + 0.05  # it follows the chunks

        before = len(pr.got_outputs())
        assert transition(Transition.TRANSITION_DEACTIVATE)
        assert state() == "inactive"
        held = pr.got_outputs()[before:]
        n_after = len(pr.got_outputs())
        time.sleep(0.5)
        assert len(pr.got_outputs()) == n_after  # then publishing stopped
        # the hold: from the first tick after the request, the same setpoint, published for deactivate_hold_s
        positions = [tuple(m.position) for m in held]
        assert len(positions) >= 5, positions
        last = positions[-1]
        assert positions[-5:] == [last] * 5 and all(v == 0.0 for v in held[-1].velocity), positions[-6:]
        chunks_rejected = pr.diagnostic("chunks.not_used.inactive", "0")
        pr.publish_chunk(np.ones((10, 2)), pr.now_ns(), 0.05, names, frame_index=frame + 100)
        assert pr.wait_for(lambda: pr.diagnostic("chunks.not_used.inactive", "0") != chunks_rejected, 10), \
            pr.diagnostics  # a chunk while inactive is not used (counted)
        assert pr.diagnostic("lifecycle") == "inactive"

        assert transition(Transition.TRANSITION_ACTIVATE)
        n0 = len(pr.got_outputs())
        feed(0.5, frame + 200)
        resumed = pr.got_outputs()[n0:]
        assert resumed, proc.output()
        step = np.abs(np.array(resumed[0].position) - np.array(last))
        assert np.all(step <= VMAX * 0.03 + 1e-9), step  # from the measured (held) position, rate-limited
        assert proc.alive
    finally:
        pr.close()
        rc = proc.stop(timeout=15)
    assert rc == 0, proc.output()
