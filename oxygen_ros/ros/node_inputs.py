"""The node's input subscriptions, created on activate (mixed into :class:`~oxygen_ros.ros.node.OxygenNode`,
whose attributes it uses): the cameras (with their QoS events), the instruction (latched and volatile) and the chunk
executor's plans.
"""

from __future__ import annotations

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.qos import QoSProfile
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import String

from oxygen_ros.msg import ExecutedPlan
from oxygen_ros.runtime.model_loader import action_period_s
from oxygen_ros.runtime.params import NodeParams

from . import qos
from .diagnostics import CameraWatch
from .executed_plan import ExecutedPlanInput
from .input_store import InputStore

__all__ = ["NodeInputs"]


class NodeInputs:
    """The subscription side of :class:`~oxygen_ros.ros.node.OxygenNode`."""

    def _executed_plan_subscription(self, p: NodeParams):
        """rtc.remainder_source executor: the chunk executor's plans feed the runner's RTC remainder."""
        runner = self._runner
        self._executed = executed = ExecutedPlanInput(
            self._loaded.action_names, action_period_s(p, runner.n_execute), p.rtc_executor_max_age_s,
            self._loaded.policy.spec.chunk_size, lambda: self.get_clock().now().nanoseconds,
            self.stats.rejected_inputs.add)
        runner.executed_remainder = executed.remainder
        return self.create_subscription(ExecutedPlan, p.rtc_executor_topic,  # best effort: matches any publisher
                                        self._safe(executed.on_plan, "executed_plan_callback"), qos.best_effort(),
                                        callback_group=self._input_group)

    def _instruction_subscriptions(self, store: InputStore) -> list:
        """Latched and volatile subscriptions to ``instruction`` (:func:`.qos.subscribe_latched_and_volatile`): the
        instruction a latched publisher sent before this node started, and volatile publishers. The store drops
        the duplicates."""
        def on_instruction(msg: String, info: dict) -> None:
            try:
                store.on_instruction(msg, info)
            except Exception as e:  # never kill the executor
                self.stats.errors.add("instruction_callback", f"{type(e).__name__}: {e}")

        group = MutuallyExclusiveCallbackGroup()  # one instruction at a time: the newest applied last
        return qos.subscribe_latched_and_volatile(self, String, "instruction", on_instruction, group)

    def _camera_subscriptions(self, p: NodeParams, store: InputStore, profile: QoSProfile) -> list:
        """One subscription per camera; its incompatible-QoS and message-lost events are counted and logged
        (CameraWatch)."""
        topics = [self.resolve_topic_name(p.camera_topic(i)) for i in range(len(p.camera_names))]
        self._camera_watch = watch = CameraWatch(p.camera_names, topics, p.camera_reliability, self.stats.warnings)
        subs = []
        for i in range(len(p.camera_names)):
            kind, handler = (CompressedImage, store.on_compressed) if p.compressed(i) else (Image, store.on_image)
            cb = self._safe(lambda msg, i=i, handler=handler: handler(i, msg), "camera_callback")
            events = SubscriptionEventCallbacks(
                incompatible_qos=self._safe(lambda event, i=i: watch.on_incompatible_qos(
                    i, event.total_count_change, getattr(event.last_policy_kind, "name", str(event.last_policy_kind))),
                    "camera_qos_event"),
                message_lost=self._safe(lambda event, i=i: watch.on_message_lost(i, event.total_count_change),
                                        "camera_lost_event"))
            subs.append(self.create_subscription(kind, p.camera_topic(i), cb, profile, callback_group=self._input_group,
                                                 event_callbacks=events))
        return subs
