"""Demo scene, demo bag writer and bag replayer (the replay goes over real DDS into an rclpy subscriber)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import require_ros, ros_domain
from conftest import ros_context as conftest_ros_context

from oxygen_ros.testing.synthetic_scene import DEFAULT_CAMERAS, joint_state, render_scene

# --- demo scene -----------------------------------------------------------------------------------------------


def test_scene_shape_and_determinism() -> None:
    for cam in (*DEFAULT_CAMERAS, "some_other_cam"):
        img = render_scene(1.25, cam, 224, seed=3)
        assert img.shape == (224, 224, 3) and img.dtype == np.uint8 and img.flags.c_contiguous
        np.testing.assert_array_equal(img, render_scene(1.25, cam, 224, seed=3))
    assert render_scene(0.0, "base_0_rgb", 64).shape == (64, 64, 3)


def test_scene_moves_and_viewpoints_differ() -> None:
    base0, base2 = render_scene(0.0, "base_0_rgb", 96), render_scene(2.0, "base_0_rgb", 96)
    assert (base0 != base2).any(axis=2).mean() > 0.005  # the red block moved
    views = [render_scene(1.0, cam, 96) for cam in DEFAULT_CAMERAS]
    for i in range(len(views)):
        for j in range(i + 1, len(views)):
            assert (views[i] != views[j]).any()
    assert (render_scene(1.0, "base_0_rgb", 96, seed=0) != render_scene(1.0, "base_0_rgb", 96, seed=1)).any()


def test_scene_is_cheap() -> None:
    for cam in DEFAULT_CAMERAS:
        render_scene(0.0, cam, 224)  # build the cached textures
    t0 = time.perf_counter()
    n = 60
    for k in range(n):
        render_scene(k * 0.1, DEFAULT_CAMERAS[k % 3], 224)
    per_frame = (time.perf_counter() - t0) / n
    assert per_frame < 0.01, f"{per_frame * 1e3:.2f} ms per frame"  # ~0.2-0.5 ms here; loose for busy CI


def test_joint_state_smooth() -> None:
    names = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
    ts = np.arange(0, 10, 0.01)
    q = np.stack([joint_state(t, names) for t in ts])
    assert q.shape == (len(ts), 8) and q.dtype == np.float64 and np.isfinite(q).all()
    assert np.abs(np.diff(q, axis=0)).max() < 0.05  # no jumps at 100 Hz
    assert q[:, :7].std(axis=0).min() > 0.05  # every arm joint moves
    assert q[:, 7].min() >= 0.0 and q[:, 7].max() <= 1.0
    np.testing.assert_array_equal(joint_state(3.3, names), joint_state(3.3, names))


# --- demo bag -------------------------------------------------------------------------------------------------

rosbags = pytest.importorskip("rosbags", reason="rosbags is not installed")
from rosbags.highlevel import AnyReader  # noqa: E402

from oxygen_ros.evaluation.demo_bag import (  # noqa: E402
    DEFAULT_JOINT_NAMES,
    START_TIME_NS,
    make_demo_bag,
)
from oxygen_ros.tools.make_demo_bag import main as make_demo_bag_main  # noqa: E402  (oxygen-make-demo-bag)

CAMS = ("base_0_rgb", "left_wrist_0_rgb")
CAM_TOPICS = [f"/cameras/{c}/image_raw" for c in CAMS]


def read_bag(path: Path) -> dict[str, list[tuple[int, bytes, object]]]:
    """topic -> [(bag time, raw payload, deserialised message)] in bag order."""
    out: dict[str, list] = {}
    with AnyReader([path]) as reader:
        for conn, stamp, raw in reader.messages():
            out.setdefault(conn.topic, []).append((stamp, bytes(raw), reader.deserialize(raw, conn.msgtype)))
        types = {c.topic: c.msgtype for c in reader.connections}
    return out, types


def stamp_ns(header) -> int:
    return header.stamp.sec * 1_000_000_000 + header.stamp.nanosec


@pytest.mark.parametrize("storage", ["sqlite3", "mcap"])
def test_demo_bag_contents(tmp_path: Path, storage: str) -> None:
    from oxygen_ros.ros.image_conversion import image_msg_to_array

    path = make_demo_bag(tmp_path / "bag", duration_s=3.5, rate_hz=10, cameras=CAMS, size=32, storage=storage,
                         instruction_period_s=1.5)
    assert (path / "metadata.yaml").exists()
    msgs, types = read_bag(path)
    assert types == {**dict.fromkeys(CAM_TOPICS, "sensor_msgs/msg/Image"), "/instruction": "std_msgs/msg/String",
                     "/joint_states": "sensor_msgs/msg/JointState"}
    assert {t: len(v) for t, v in msgs.items()} == {**dict.fromkeys(CAM_TOPICS, 35), "/joint_states": 35,
                                                   "/instruction": 3}  # t = 0, 1.5, 3.0 s
    expected_stamps = [START_TIME_NS + k * 100_000_000 for k in range(35)]
    for topic in (*CAM_TOPICS, "/joint_states"):
        stamps = [s for s, _, _ in msgs[topic]]
        assert stamps == expected_stamps  # strictly increasing, exactly on the tick grid
        assert [stamp_ns(m.header) for _, _, m in msgs[topic]] == stamps  # header stamp == bag time
    assert [s for s, _, _ in msgs["/instruction"]] == [START_TIME_NS, START_TIME_NS + 1_500_000_000,
                                                       START_TIME_NS + 3_000_000_000]
    assert {m.data for _, _, m in msgs["/instruction"]} == {"put the red block on the blue plate"}
    js = msgs["/joint_states"][7][2]
    assert list(js.name) == list(DEFAULT_JOINT_NAMES) and len(js.position) == len(js.velocity) == 8
    np.testing.assert_allclose(js.position, joint_state(0.7, list(DEFAULT_JOINT_NAMES)))
    for cam, topic in zip(CAMS, CAM_TOPICS, strict=True):
        _, _, img = msgs[topic][12]
        assert (img.encoding, img.width, img.height, img.step, img.header.frame_id) == ("rgb8", 32, 32, 96, cam)
        np.testing.assert_array_equal(image_msg_to_array(img), render_scene(1.2, cam, 32, 0))


def test_demo_bag_deterministic(tmp_path: Path) -> None:
    kw = dict(duration_s=1.0, rate_hz=5, cameras=CAMS, size=24)
    a, _ = read_bag(make_demo_bag(tmp_path / "a", storage="sqlite3", **kw))
    b, _ = read_bag(make_demo_bag(tmp_path / "b", storage="mcap", **kw))
    c, _ = read_bag(make_demo_bag(tmp_path / "c", storage="sqlite3", seed=1, **kw))
    payloads = {t: [(s, raw) for s, raw, _ in v] for t, v in a.items()}
    assert payloads == {t: [(s, raw) for s, raw, _ in v] for t, v in b.items()}  # same args, other storage
    assert [raw for _, raw, _ in a[CAM_TOPICS[0]]] != [raw for _, raw, _ in c[CAM_TOPICS[0]]]  # seed matters
    # the same file bytes for the same arguments and bag name
    make_demo_bag(tmp_path / "x" / "bag", storage="sqlite3", **kw)
    make_demo_bag(tmp_path / "y" / "bag", storage="sqlite3", **kw)
    assert (tmp_path / "x/bag/bag.db3").read_bytes() == (tmp_path / "y/bag/bag.db3").read_bytes()


def test_demo_bag_compressed(tmp_path: Path) -> None:
    from oxygen_ros.ros.image_conversion import compressed_msg_to_array

    path = make_demo_bag(tmp_path / "bag", duration_s=0.5, rate_hz=10, cameras=CAMS[:1], size=64,
                         storage="mcap", compressed=True, camera_topic_fmt="/{name}/image")
    msgs, types = read_bag(path)
    assert types["/base_0_rgb/image/compressed"] == "sensor_msgs/msg/CompressedImage"
    assert len(msgs["/base_0_rgb/image/compressed"]) == 5
    _, _, msg = msgs["/base_0_rgb/image/compressed"][2]
    assert "jpeg" in msg.format and stamp_ns(msg.header) == START_TIME_NS + 200_000_000
    rgb = compressed_msg_to_array(msg)
    assert np.abs(rgb.astype(int) - render_scene(0.2, "base_0_rgb", 64, 0)).mean() < 6


def test_make_demo_bag_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "cli_bag"
    args = [str(out), "--duration", "0.3", "--rate", "10", "--size", "16", "--cameras", "base_0_rgb",
            "--storage", "mcap", "--no-progress"]
    assert make_demo_bag_main(args) == 0
    assert "wrote" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # exists, no --overwrite
        make_demo_bag_main(args)
    assert make_demo_bag_main([*args, "--overwrite"]) == 0
    msgs, _ = read_bag(out)
    assert len(msgs["/cameras/base_0_rgb/image_raw"]) == 3
    (tmp_path / "not_a_bag").mkdir()
    with pytest.raises(SystemExit):  # never deletes a directory that is not a bag
        make_demo_bag_main([str(tmp_path / "not_a_bag"), "--overwrite"])
    assert (tmp_path / "not_a_bag").is_dir()


def test_make_demo_bag_rejects_bad_args(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        make_demo_bag(tmp_path / "a", storage="bag")
    with pytest.raises(ValueError):
        make_demo_bag(tmp_path / "b", duration_s=0)


# --- replay over DDS ------------------------------------------------------------------------------------------


@pytest.fixture
def ros_context():
    """A private rclpy context on a localhost-only DDS domain of its own (conftest's preamble)."""
    require_ros(messages=False)
    with conftest_ros_context(ros_domain()) as ctx:
        yield ctx


def test_message_class_lookup() -> None:
    require_ros(messages=False)
    from sensor_msgs.msg import Image

    from oxygen_ros.evaluation.replay import message_class

    assert message_class("sensor_msgs/msg/Image") is Image
    assert message_class("sensor_msgs/Image") is Image
    for bad in ("no_such_pkg/msg/Foo", "sensor_msgs/msg/NoSuchType", "std_srvs/srv/Trigger", "Image"):
        with pytest.raises(LookupError):
            message_class(bad)


def test_replay_cli_rejects_a_missing_bag(tmp_path: Path) -> None:
    require_ros(messages=False)
    from oxygen_ros.evaluation.cli import replay_bag_main

    with pytest.raises(SystemExit):
        replay_bag_main([str(tmp_path / "no_such_bag"), "--clock"])


@pytest.mark.ros
def test_replay_over_dds(tmp_path: Path, ros_context) -> None:
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import DurabilityPolicy, QoSProfile
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import String

    from oxygen_ros.evaluation.replay import BagReplayer
    from oxygen_ros.ros.image_conversion import image_msg_to_array

    bag = make_demo_bag(tmp_path / "bag", duration_s=1.5, rate_hz=10, cameras=CAMS, size=48, storage="mcap")
    bag_msgs, _ = read_bag(bag)
    bag_stamps = [s for s, _, _ in bag_msgs["/joint_states"]]

    node = rclpy.create_node("replay_listener", context=ros_context)
    got: dict[str, list] = {t: [] for t in (*CAM_TOPICS, "/joint_states", "/instruction", "/clock")}
    for topic in CAM_TOPICS:
        node.create_subscription(Image, topic, got[topic].append, 50)
    node.create_subscription(JointState, "/joint_states", got["/joint_states"].append, 50)
    node.create_subscription(String, "/instruction", got["/instruction"].append,
                             QoSProfile(depth=5, durability=DurabilityPolicy.TRANSIENT_LOCAL))
    node.create_subscription(Clock, "/clock", got["/clock"].append, 500)
    executor = SingleThreadedExecutor(context=ros_context)
    executor.add_node(node)

    replayer = BagReplayer(bag, rate=2.0, clock=True, wait_for_subscribers=5.0, context=ros_context)
    assert replayer.topics == sorted([*CAM_TOPICS, "/instruction", "/joint_states"])
    result = {}
    thread = threading.Thread(target=lambda: result.update(stats=replayer.run(max_duration=15.0)), daemon=True)
    try:
        thread.start()
        while thread.is_alive():
            executor.spin_once(timeout_sec=0.02)
        def complete() -> bool:
            last_clock = got["/clock"][-1].clock if got["/clock"] else None
            return (all(len(got[t]) >= len(bag_stamps) for t in (*CAM_TOPICS, "/joint_states"))
                    and last_clock is not None and last_clock.nanosec == bag_stamps[-1] % 1_000_000_000)

        drain_until = time.monotonic() + 3.0  # let the last samples arrive (topics are not ordered across)
        while time.monotonic() < drain_until and not complete():
            executor.spin_once(timeout_sec=0.02)
    finally:
        replayer.stop()
        thread.join(5)
        replayer.close()
        executor.shutdown()
        node.destroy_node()

    stats = result["stats"]
    assert not stats.interrupted and stats.passes == 1
    assert stats.published == {**dict.fromkeys(CAM_TOPICS, 15), "/joint_states": 15, "/instruction": 1}
    assert 0.6 <= stats.wall_s - 0.0 < 6.0  # 1.4 s of bag at rate 2 ~ 0.7 s (+ discovery wait)
    for topic in (*CAM_TOPICS, "/joint_states"):
        assert [stamp_ns(m.header) for m in got[topic]] == bag_stamps, topic
    np.testing.assert_array_equal(image_msg_to_array(got[CAM_TOPICS[0]][3]), render_scene(0.3, CAMS[0], 48, 0))
    assert [m.data for m in got["/instruction"]] == ["put the red block on the blue plate"]
    np.testing.assert_allclose(got["/joint_states"][5].position, joint_state(0.5, list(DEFAULT_JOINT_NAMES)))

    clock = [m.clock.sec * 1_000_000_000 + m.clock.nanosec for m in got["/clock"]]
    assert clock == sorted(clock) and clock[0] == START_TIME_NS and clock[-1] == bag_stamps[-1]
    assert set(bag_stamps) <= set(clock)  # the clock reaches every message stamp before the message
    assert len(clock) > len(bag_stamps)  # plus ticks in between (clock_hz)


@pytest.mark.ros
def test_replay_filter_loop_and_stop(tmp_path: Path, ros_context) -> None:
    from oxygen_ros.evaluation.replay import BagReplayer

    bag = make_demo_bag(tmp_path / "bag", duration_s=0.3, rate_hz=10, cameras=CAMS[:1], size=16, storage="sqlite3")
    with BagReplayer(bag, topics=["/joint_states", "/nope"], rate=4.0, loop=True, qos_best_effort=True,
                     context=ros_context) as replayer:
        assert replayer.topics == ["/joint_states"]
        stats = replayer.run(max_duration=0.5)  # ~0.05 s per pass at rate 4: several passes, then the cap
        assert stats.interrupted and stats.passes >= 2 and 0.45 < stats.wall_s < 2.0
        assert stats.published["/joint_states"] >= 3 * stats.passes
        threading.Timer(0.2, replayer.stop).start()
        t0 = time.monotonic()
        stats = replayer.run()  # loops until stop()
        assert stats.interrupted and 0.15 < time.monotonic() - t0 < 2.0
    with pytest.raises(ValueError, match="nothing to replay"):
        BagReplayer(bag, topics=["/nope"], context=ros_context)
