"""The custom messages (msg/ActionChunk.msg, msg/LanguageOutput.msg): fields, types and a real DDS round trip.

Needs rclpy and the built messages (`make setup` runs tools/build_msgs.sh; on a robot, colcon build).
"""

import array
import time
import uuid

import numpy as np
import pytest
from conftest import require_ros, ros_domain

require_ros()

import rclpy  # noqa: E402
from builtin_interfaces.msg import Duration, Time  # noqa: E402
from oxygen_ros.msg import ActionChunk, LanguageOutput  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from rclpy.serialization import deserialize_message, serialize_message  # noqa: E402
from std_msgs.msg import Header  # noqa: E402

pytestmark = pytest.mark.ros

ACTION_CHUNK_FIELDS = {
    "header": "std_msgs/Header",
    "frame_index": "uint64",
    "joint_names": "sequence<string>",
    "horizon": "uint32",
    "action_dim": "uint32",
    "actions": "sequence<float>",
    "dt": "builtin_interfaces/Duration",
    "inference_latency": "builtin_interfaces/Duration",
    "first_step": "uint32",
    "subtask": "string",
}

LANGUAGE_OUTPUT_FIELDS = {
    "header": "std_msgs/Header",
    "request_id": "uint64",
    "frame_index": "uint64",
    "task": "string",
    "stream": "string",
    "text": "string",
    "num_tokens": "uint32",
    "eos": "boolean",
    "latency": "builtin_interfaces/Duration",
}

U64_MAX = 2**64 - 1


def make_action_chunk() -> ActionChunk:
    horizon, action_dim = 10, 7
    actions = (np.arange(horizon * action_dim, dtype=np.float32) * 0.25 - 3.0).reshape(horizon, action_dim)
    msg = ActionChunk()
    msg.header = Header(stamp=Time(sec=1_700_000_000, nanosec=123_456_789), frame_id="base_camera")
    msg.frame_index = U64_MAX - 1
    msg.joint_names = [f"joint_{i}" for i in range(action_dim - 1)] + ["gripper"]
    msg.horizon = horizon
    msg.action_dim = action_dim
    # fast path from numpy: float32 bytes straight into the array('f') the message stores
    msg.actions = array.array("f", actions.tobytes())
    msg.dt = Duration(sec=0, nanosec=20_000_000)
    msg.inference_latency = Duration(sec=0, nanosec=87_500_000)
    msg.subtask = "pick up the red block at 13 88"
    return msg


def make_language_output() -> LanguageOutput:
    msg = LanguageOutput()
    msg.header = Header(stamp=Time(sec=1_700_000_000, nanosec=123_456_789), frame_id="base_camera")
    msg.request_id = U64_MAX
    msg.frame_index = 42
    msg.task = "subtask"
    msg.text = "pick up the red block — then place it in the bowl"
    msg.num_tokens = 13
    msg.eos = True
    msg.latency = Duration(sec=1, nanosec=5)
    return msg


def test_action_chunk_fields_and_types():
    assert ActionChunk.get_fields_and_field_types() == ACTION_CHUNK_FIELDS
    assert list(ActionChunk.get_fields_and_field_types()) == list(ACTION_CHUNK_FIELDS)  # declaration order
    empty = ActionChunk()
    assert isinstance(empty.header, Header)
    assert isinstance(empty.dt, Duration) and isinstance(empty.inference_latency, Duration)
    assert isinstance(empty.actions, array.array) and empty.actions.typecode == "f"
    assert empty.frame_index == 0 and empty.horizon == 0 and empty.action_dim == 0
    assert list(empty.joint_names) == []

    msg = make_action_chunk()
    assert len(msg.actions) == msg.horizon * msg.action_dim
    restored = np.frombuffer(msg.actions, dtype=np.float32).reshape(msg.horizon, msg.action_dim)
    assert restored[1, 0] == np.float32(7 * 0.25 - 3.0)  # row-major: row t starts at t * action_dim
    assert msg == make_action_chunk() and msg != ActionChunk()


def test_language_output_fields_and_types():
    assert LanguageOutput.get_fields_and_field_types() == LANGUAGE_OUTPUT_FIELDS
    assert list(LanguageOutput.get_fields_and_field_types()) == list(LANGUAGE_OUTPUT_FIELDS)
    empty = LanguageOutput()
    assert isinstance(empty.header, Header) and isinstance(empty.latency, Duration)
    assert empty.task == "" and empty.stream == "" and empty.text == "" and empty.eos is False
    assert empty.request_id == 0 and empty.frame_index == 0 and empty.num_tokens == 0
    assert make_language_output() == make_language_output()


def test_serialization_round_trip():
    for msg in (make_action_chunk(), make_language_output()):
        assert deserialize_message(serialize_message(msg), type(msg)) == msg


def _spin_until(executors, done, timeout_s):
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        for executor in executors:
            executor.spin_once(timeout_sec=0.02)
    return done()


def test_publish_subscribe_over_dds():
    # two contexts = two DDS participants that have to discover each other; localhost only, own domain
    require_ros()
    domain = ros_domain()
    suffix = uuid.uuid4().hex[:8]
    chunk_topic, text_topic = f"/oxygen_test_{suffix}/action_chunk", f"/oxygen_test_{suffix}/language"
    qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)

    pub_ctx, sub_ctx = rclpy.Context(), rclpy.Context()
    rclpy.init(context=pub_ctx, domain_id=domain)
    rclpy.init(context=sub_ctx, domain_id=domain)
    executors, nodes = [], []
    try:
        pub_node = rclpy.create_node(f"oxygen_test_pub_{suffix}", context=pub_ctx)
        sub_node = rclpy.create_node(f"oxygen_test_sub_{suffix}", context=sub_ctx)
        nodes += [pub_node, sub_node]
        received = {"chunk": [], "text": []}
        sub_node.create_subscription(ActionChunk, chunk_topic, received["chunk"].append, qos)
        sub_node.create_subscription(LanguageOutput, text_topic, received["text"].append, qos)
        chunk_pub = pub_node.create_publisher(ActionChunk, chunk_topic, qos)
        text_pub = pub_node.create_publisher(LanguageOutput, text_topic, qos)
        for ctx, node in ((pub_ctx, pub_node), (sub_ctx, sub_node)):
            executor = SingleThreadedExecutor(context=ctx)
            executor.add_node(node)
            executors.append(executor)

        matched = _spin_until(
            executors,
            lambda: chunk_pub.get_subscription_count() > 0 and text_pub.get_subscription_count() > 0,
            5.0,
        )
        assert matched, "publisher and subscriber did not discover each other within 5 s"

        sent_chunk, sent_text = make_action_chunk(), make_language_output()
        chunk_pub.publish(sent_chunk)
        text_pub.publish(sent_text)
        assert _spin_until(executors, lambda: received["chunk"] and received["text"], 5.0), received

        got_chunk, got_text = received["chunk"][0], received["text"][0]
        assert got_chunk is not sent_chunk and got_text is not sent_text
        for field in ACTION_CHUNK_FIELDS:
            assert getattr(got_chunk, field) == getattr(sent_chunk, field), field
        for field in LANGUAGE_OUTPUT_FIELDS:
            assert getattr(got_text, field) == getattr(sent_text, field), field
        assert got_chunk == sent_chunk and got_text == sent_text
        actions = np.frombuffer(got_chunk.actions, dtype=np.float32).reshape(got_chunk.horizon, -1)
        np.testing.assert_array_equal(actions, np.frombuffer(sent_chunk.actions, dtype=np.float32).reshape(10, 7))
    finally:
        for executor in executors:
            executor.shutdown()
        for node in nodes:
            node.destroy_node()
        for ctx in (pub_ctx, sub_ctx):
            if ctx.ok():
                rclpy.shutdown(context=ctx)
