"""oxygen_ros/testing/services.py over real DDS: ``call`` answers a query; ``change_state`` returns a lifecycle
transition's result, and waits (does not send the transition again) while the node is still in it, here a node whose
``on_configure`` outlasts the resend interval and whose services answer ``get_state`` meanwhile."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import require_ros, ros_context, ros_domain

require_ros(messages=False)

from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetState  # noqa: E402
from rclpy.callback_groups import ReentrantCallbackGroup  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn  # noqa: E402
from rclpy.node import Node  # noqa: E402

from oxygen_ros.testing.services import call, change_state  # noqa: E402

pytestmark = [pytest.mark.ros]

CONFIGURE_S = 2.0  # four resend intervals


class SlowNode(LifecycleNode):
    """A lifecycle node whose configure takes CONFIGURE_S; its services answer while a transition runs."""

    def __init__(self, context) -> None:
        self._reentrant = ReentrantCallbackGroup()  # before the base classes create their services in it
        super().__init__("slow_lifecycle", context=context)
        self.configures = 0

    @property
    def default_callback_group(self) -> ReentrantCallbackGroup:
        return self._reentrant

    def on_configure(self, state) -> TransitionCallbackReturn:
        self.configures += 1
        time.sleep(CONFIGURE_S)
        return TransitionCallbackReturn.SUCCESS


def test_a_slow_transition_is_waited_for_and_sent_once() -> None:
    with ros_context(ros_domain()) as ctx:
        server, client = SlowNode(ctx), Node("services_client", context=ctx)
        executor = MultiThreadedExecutor(num_threads=4, context=ctx)
        executor.add_node(server)
        executor.add_node(client)
        spinner = threading.Thread(target=executor.spin, daemon=True)
        spinner.start()
        try:
            change = client.create_client(ChangeState, "/slow_lifecycle/change_state")
            get = client.create_client(GetState, "/slow_lifecycle/get_state")
            assert call(get, GetState.Request()).current_state.label == "unconfigured"
            t0 = time.monotonic()
            assert change_state(change, get, Transition.TRANSITION_CONFIGURE, timeout=60, resend_s=0.5)
            assert time.monotonic() - t0 >= CONFIGURE_S
            # while "configuring" the request was not sent again (a second one would have been refused: False)
            assert server.configures == 1
            assert call(get, GetState.Request()).current_state.label == "inactive"
            # an impossible transition gets its answer: refused
            assert not change_state(change, get, Transition.TRANSITION_CONFIGURE, timeout=60, resend_s=0.5)
            assert server.configures == 1
            with pytest.raises(TimeoutError):
                change_state(client.create_client(ChangeState, "/nobody/change_state"), get,
                             Transition.TRANSITION_ACTIVATE, timeout=1.0)
        finally:
            executor.shutdown(timeout_sec=2.0)
            spinner.join(timeout=5.0)
            server.destroy_node()
            client.destroy_node()
