"""Bad input never kills the node: unit tests of the pure helpers (trajectories, observation building, lifecycle
failures in-process; bad parameters: test_node_params.py), then a table of bad messages and hypothesis-fuzzed images
sent over DDS to a running node process, which must count them and keep serving.
"""

from __future__ import annotations

import array
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import require_ros, ros_context, ros_domain
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

require_ros()

from builtin_interfaces.msg import Time  # noqa: E402
from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import CompressedImage, Image, JointState  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from oxygen_ros.engine import get_config  # noqa: E402
from oxygen_ros.engine.tokenizer import PromptTokenizer  # noqa: E402
from oxygen_ros.policy import Policy, load_policy  # noqa: E402
from oxygen_ros.policy.synthetic import make_random_checkpoint  # noqa: E402
from oxygen_ros.ros.diagnostics import NodeStats, ReasonCounter  # noqa: E402
from oxygen_ros.ros.image_conversion import array_to_image_msg  # noqa: E402
from oxygen_ros.ros.input_store import InputStore  # noqa: E402
from oxygen_ros.ros.node import OxygenNode  # noqa: E402
from oxygen_ros.ros.observation_builder import ObservationBuilder, Skip  # noqa: E402
from oxygen_ros.ros.publishers import make_trajectory  # noqa: E402
from oxygen_ros.testing import NodeProcess, Probe  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
JOINTS = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
DOMAIN = ros_domain()
COMPRESSED_DOMAIN = ros_domain()  # the compressed-camera node of its own
SEC = 1_000_000_000


# ---------------------------------------------------------------------------------------------- trajectory
def test_trajectory_points_start_in_the_future_and_increase() -> None:
    out = np.ones((4, 3), dtype=np.float32)
    traj = make_trajectory(out, ["a", "b", "c"], dt_s=0.05)
    times = [p.time_from_start.nanosec for p in traj.points]
    assert times[0] == 50_000_000 and times == sorted(set(times))


# ---------------------------------------------------------------------------------------------- observations
CFG = get_config("tiny", None, camera_names=("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"),
                 max_token_len=128)
CAMS = ("base_0_rgb", "left_wrist_0_rgb")


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Policy:
    """A generated tiny checkpoint in our layout (no statistics: identity normalisation)."""
    out = make_random_checkpoint(tmp_path_factory.mktemp("ckpt"), "tiny", None, tokenizer=True,
                                 camera_names=CFG.camera_names, max_token_len=128)
    return load_policy(out, generated=True)


@pytest.fixture(scope="module")
def tokenizer(policy: Policy) -> PromptTokenizer:
    return policy.tokenizer


def make_store(**kw) -> InputStore:
    return InputStore(CAMS, JOINTS, ReasonCounter(None, "rejected"), **kw)


def image(stamp_ns: int, h: int = 40, w: int = 60, encoding: str = "rgb8") -> Image:
    msg = array_to_image_msg(np.full((h, w, 3), 100, np.uint8), stamp_ns)
    msg.encoding = encoding
    return msg


def joints(names=JOINTS, positions=None) -> JointState:
    return JointState(name=list(names), position=[0.1] * len(names) if positions is None else list(positions))


def feed(store: InputStore, stamp_ns: int = 10 * SEC) -> None:
    for i in range(len(CAMS)):
        assert store.on_image(i, image(stamp_ns))
    assert store.on_joint_state(joints())
    assert store.on_instruction(String(data="put the red block on the blue plate"))


def builder(store: InputStore, policy: Policy) -> ObservationBuilder:
    return ObservationBuilder(store, policy, 0.5)


def test_observation_is_built_from_the_newest_inputs(policy, tokenizer) -> None:
    store = make_store()
    feed(store)
    store.on_image(1, image(10 * SEC + 50_000_000))
    built = builder(store, policy).build(10 * SEC + 100_000_000)
    assert not isinstance(built, Skip), built
    obs = built.prepared.observation
    obs.validate(CFG.num_cameras, CFG.vision.image_size)
    assert obs.image_masks.tolist() == [[True, True, False]], "unconfigured slots are masked out"
    assert built.stamp_ns == 10 * SEC, "synchronised: the set with equal stamps, not camera 1's newest image"
    unsynced = ObservationBuilder(store, policy, 0.5, max_camera_skew_s=-1.0).build(10 * SEC + 100_000_000)
    assert unsynced.stamp_ns == 10 * SEC + 50_000_000, "observation time = newest camera stamp used"
    assert "put the red block" in tokenizer.decode(obs.tokens[0].tolist())
    assert obs.token_mask.all() and obs.state.shape == (1, len(JOINTS))


@pytest.mark.parametrize("case, reason", [
    ("no_images", "missing_camera"), ("one_camera", "missing_camera"), ("stale", "stale_camera"),
    ("future", "missing_camera"), ("no_state", "no_state"), ("partial_state", "no_state"),
    ("nan_state", "invalid_state"), ("no_instruction", "no_instruction"),
])
def test_frames_are_skipped_with_a_reason(policy, case: str, reason: str) -> None:
    store, now = make_store(), 10 * SEC
    if case != "no_images":
        store.on_image(0, image(now))
        if case != "one_camera":
            store.on_image(1, image(now - 2 * SEC if case == "stale" else now + 2 * SEC if case == "future" else now))
    if case == "partial_state":
        store.on_joint_state(joints(JOINTS[:3]))
    elif case == "nan_state":
        store.on_joint_state(joints(positions=[0.0] * 7 + [float("nan")]))
    elif case != "no_state":
        store.on_joint_state(joints())
    if case != "no_instruction":
        store.on_instruction(String(data="go"))
    built = builder(store, policy).build(now)
    assert isinstance(built, Skip) and built.reason == reason, built
    if case == "future":  # a future-stamped image is a rejected input, not a usable (or blocking) one
        assert store.rejected.get("image_from_future") == 1


def test_partial_joint_states_are_merged(policy) -> None:
    store = make_store(instruction="go")
    for i in range(2):
        store.on_image(i, image(SEC))
    assert store.on_joint_state(joints(JOINTS[:4], [1.0] * 4))
    assert store.on_joint_state(joints(["other_robot_joint"] + JOINTS[4:], [9.0] + [2.0] * 4))
    built = builder(store, policy).build(SEC)
    assert not isinstance(built, Skip) and built.state.tolist() == [1.0] * 4 + [2.0] * 4


def bad_image(kind: str) -> Image:
    msg = image(SEC)
    if kind == "encoding":
        msg.encoding = "yuv422_exotic"
    elif kind == "zero":
        msg.width = 0
    elif kind == "huge":
        msg.height = msg.width = 2**31 - 1
    elif kind == "truncated":
        msg.data = array.array("B", bytes(10))
    elif kind == "step":
        msg.step = 3
    return msg


def test_bad_inputs_are_rejected_and_counted() -> None:
    store = make_store(max_image_pixels=100_000, max_instruction_chars=50)
    cases = [
        (store.on_image, bad_image("encoding"), "image_bad_encoding"),
        (store.on_image, bad_image("zero"), "image_zero_size"),
        (store.on_image, bad_image("huge"), "image_too_large"),
        (store.on_image, bad_image("truncated"), "image_bad_data"),
        (store.on_image, bad_image("step"), "image_bad_data"),
        (store.on_compressed, CompressedImage(format="jpeg"), "image_empty"),
        (store.on_compressed, CompressedImage(format="jpeg", data=b"\xff\xd8 not a jpeg"), "image_undecodable"),
        (store.on_joint_state, JointState(name=["a", "b"], position=[1.0]), "joint_state_malformed"),
        (store.on_joint_state, joints(["x", "y"]), "joint_state_unknown_joints"),
        (store.on_joint_state, joints(positions=[float("inf")] * 8), "state_not_finite"),
        (store.on_instruction, String(data="   "), "instruction_empty"),
    ]
    for handler, msg, reason in cases:
        args = (msg,) if handler in (store.on_joint_state, store.on_instruction) else (0, msg)
        assert handler(*args) is False, reason
        assert store.rejected.get(reason) >= 1, (reason, store.rejected.snapshot())
    assert store.on_instruction(String(data="x" * 100_000)), "long instructions are truncated, not dropped"
    assert store.rejected.get("instruction_truncated") == 1 and len(store.snapshot()[3]) == 50
    assert store.snapshot()[0] == [None, None], "no bad image was stored"


@settings(max_examples=150, deadline=None)
@given(height=st.integers(-3, 5000), width=st.integers(-3, 5000), step=st.integers(-10, 20000),
       encoding=st.sampled_from(["rgb8", "bgr8", "mono8", "mono16", "rgba8", "", "jpeg", "32FC1", "rgb8\x00"]),
       data=st.binary(max_size=2048), bigendian=st.booleans())
def test_fuzzed_images_never_raise(height, width, step, encoding, data, bigendian) -> None:
    store = make_store(max_image_pixels=5000 * 5000)
    msg = Image(encoding=encoding, is_bigendian=int(bigendian))
    msg.height, msg.width, msg.step = max(height, 0), max(width, 0), max(step, 0)
    msg.data = array.array("B", data)
    accepted = store.on_image(0, msg)
    assert accepted == (store.snapshot()[0][0] is not None)
    assert accepted or store.rejected.total == 1


def test_diagnostics_status_reports_counts() -> None:
    stats = NodeStats()
    stats.rejected_inputs.add("image_bad_data")
    stats.skipped.add("stale_camera")
    stats.record_frame({"frame": 0.2, "prefill": 0.05}, period_s=0.1, tokens=3, rejected=1, dropped=0)
    status = stats.status("oxygen: inference", "cpu", "active", backlog=2, horizon=10)
    values = {kv.key: kv.value for kv in status.values}
    assert values["rejected.image_bad_data"] == "1" and values["skipped.stale_camera"] == "1"
    assert values["deadline_misses"] == "1" and values["language_backlog"] == "2"
    assert values["requests_rejected"] == "1" and float(values["prefill_ms"]) == pytest.approx(50.0)


# ---------------------------------------------------------------------------------------------- lifecycle
@pytest.fixture
def context():
    threads = torch.get_num_threads()  # the node sets torch_threads; give the rest of the session its value back
    with ros_context(DOMAIN) as ctx:
        yield ctx
    torch.set_num_threads(threads)


def make_node(context, **params) -> OxygenNode:
    """An in-process node (no executor: transitions and ticks are called directly)."""
    values = {"autostart": False, "model": "random_tiny", "device": "cpu", "torch_threads": 1, "joint_names": JOINTS,
              **params}
    return OxygenNode(context=context, parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])


def test_configure_fails_cleanly_on_bad_parameters_then_recovers(context) -> None:
    node = make_node(context, mode="bogus", camera_topics=["/only_one"], camera_names=["base_0_rgb", "x"])
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        assert node.params is None and node._runner is None
        node.set_parameters([Parameter("mode", value="oxygen"), Parameter("camera_topics", value=["/a", "/b"]),
                             Parameter("camera_names", value=["base_0_rgb", "left_wrist_0_rgb"])])
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        assert node.trigger_deactivate() == TransitionCallbackReturn.SUCCESS
        assert node.trigger_cleanup() == TransitionCallbackReturn.SUCCESS
        assert node._loaded is None and node._runner is None
    finally:
        node.destroy_node()


def test_configure_fails_for_missing_checkpoint_and_unknown_camera(context, tmp_path: Path) -> None:
    node = make_node(context, model="", checkpoint_path=str(tmp_path / "nothing"))
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        node.set_parameters([Parameter("model", value="random_tiny"),
                             Parameter("camera_names", value=["base_0_rgb", "no_such_camera_slot"])])
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        node.set_parameters([Parameter("camera_names", value=["base_0_rgb"])])
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    finally:
        node.destroy_node()


@pytest.fixture(scope="module")
def real_layouts(tmp_path_factory) -> dict[str, Path]:
    """Small checkpoints laid out as LeRobot and openpi save them (8 joints, like JOINTS)."""
    from checkpoints import write_lerobot, write_openpi
    from conftest import make_model

    root = tmp_path_factory.mktemp("layouts")
    model = make_model(get_config("tiny", max_token_len=64, action_dim=32), seed=2)
    lerobot = write_lerobot(root / "lerobot", model, cameras=["base_0_rgb", "left_wrist_0_rgb"], state_dim=8,
                            action_dim=8, chunk_size=10, n_action_steps=4)
    openpi = write_openpi(root / "openpi", model, state_dim=8, action_dim=8, horizon=15)
    two = write_openpi(root / "two_assets", model, state_dim=8, action_dim=8, horizon=15, asset_ids=("a", "b"))
    bare = write_openpi(root / "no_assets", model, state_dim=8, action_dim=8, horizon=15, asset_ids=())
    (root / "junk").mkdir()
    (root / "junk" / "model.safetensors").write_bytes(b"not weights")
    return {"lerobot": lerobot, "openpi": openpi, "two_assets": two, "no_assets": bare, "junk": root / "junk"}


@pytest.mark.parametrize("case, params, message", [
    ("toy_and_path", {"model": "toy", "checkpoint_path": "/models/pi05"}, "checkpoint_path: '/models/pi05' is set "
     "but model is 'toy'"),
    ("horizon", {"ckpt": "lerobot", "action_horizon": 50}, "action_horizon: 50 but the checkpoint denoises chunks "
     "of 10"),
    ("execute", {"ckpt": "lerobot", "actions_per_chunk": 11}, "actions_per_chunk: 11 > the checkpoint's chunk"),
    ("too_many_cameras", {"ckpt": "lerobot", "camera_names": ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]},
     "camera_names: \\['right_wrist_0_rgb'\\] are not camera slots of the checkpoint"),
    ("state_dims", {"ckpt": "lerobot", "joint_names": JOINTS[:5]}, "joint_names: 5 joints but the checkpoint's "
     "state has 8 dims"),
    ("action_dims", {"ckpt": "openpi", "action_names": ["a", "b"]}, "action_names: 2 names but the checkpoint "
     "outputs 8 action dims"),
    ("lerobot_stats_path", {"ckpt": "lerobot", "norm_stats_path": "/x.json"}, "norm_stats_path: not used for "
     "LeRobot"),
    ("ambiguous_assets", {"ckpt": "two_assets"}, "several norm stats \\['a', 'b'\\]; choose one with asset_id"),
    ("no_stats", {"ckpt": "no_assets"}, "set normalization: none to run unnormalised on purpose"),
    ("unknown_layout", {"ckpt": "junk"}, "unknown layout"),
])
def test_checkpoint_contract_errors_leave_the_node_unconfigured(context, real_layouts, capfd, case, params,
                                                                message) -> None:
    params = dict(params)
    if "ckpt" in params:
        params = {"model": "", "checkpoint_path": str(real_layouts[params.pop("ckpt")]), **params}
    node = make_node(context, **params)
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        assert node.params is None and node._runner is None and node._loaded is None
        err = capfd.readouterr().err
        assert re.search(message, err), err[-2000:]
        assert "Traceback" not in err
    finally:
        node.destroy_node()


def test_real_layouts_configure_and_publish_n_action_steps(context, real_layouts) -> None:
    node = make_node(context, model="", checkpoint_path=str(real_layouts["lerobot"]), max_image_age_s=1e9)
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert node._runner.n_execute == 4 and node.params.camera_names == ("base_0_rgb", "left_wrist_0_rgb")
        assert node.params.num_steps == 10
    finally:
        node.destroy_node()


def test_processing_lives_from_activate_to_deactivate(context) -> None:
    """Subscriptions, inputs, inference thread and timer exist only while active; the model stays configured."""
    node = make_node(context, camera_names=list(CAMS), max_image_age_s=1e9)
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert node._runner is not None and node._store is None and not node._input_subs
        topics = {t for t, _ in node.get_topic_names_and_types()}
        assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        assert len(node._input_subs) == len(CAMS) + 3 and node._worker.is_alive()  # + joints, 2 x instruction
        feed(node._store, stamp_ns=node.get_clock().now().nanoseconds)
        node._on_tick()
        assert node.stats.frames == 1
        assert node.trigger_deactivate() == TransitionCallbackReturn.SUCCESS
        assert node._store is None and not node._input_subs and node._control_timer is None
        node._on_tick()  # nothing to run while inactive
        assert node.stats.frames == 1 and node._loaded is not None
        assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS  # fresh inputs, same model
        feed(node._store, stamp_ns=node.get_clock().now().nanoseconds)
        node._on_tick()
        assert node.stats.frames == 2
        assert "/oxygen/action_chunk" in topics | {t for t, _ in node.get_topic_names_and_types()}
    finally:
        node.destroy_node()


def test_an_observation_is_acted_on_once(context) -> None:
    """A tick without a camera image newer than the last frame's observation is skipped (repeated_observation),
    never a second chunk from the same observation; a newer image runs again."""
    node = make_node(context, camera_names=list(CAMS), max_image_age_s=1e9, autostart=False)
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        node.trigger_activate()
        node._control_timer.cancel()  # ticks by hand only
        stamp = node.get_clock().now().nanoseconds
        feed(node._store, stamp_ns=stamp)
        node._on_tick()
        node._on_tick()
        assert node.stats.frames == 1 and node.stats.skipped.get("repeated_observation") == 1
        feed(node._store, stamp_ns=stamp - 1_000_000)  # older images arriving late do not count as new
        node._on_tick()
        assert node.stats.frames == 1 and node.stats.skipped.get("repeated_observation") == 2
        feed(node._store, stamp_ns=stamp + 1_000_000)
        node._on_tick()
        assert node.stats.frames == 2
    finally:
        node.destroy_node()


def test_engine_exception_is_counted_and_the_node_keeps_going(context) -> None:
    node = make_node(context, camera_names=list(CAMS), max_image_age_s=1e9)
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        node.trigger_activate()
        feed(node._store, stamp_ns=node.get_clock().now().nanoseconds)
        node._on_tick()
        assert node.stats.frames == 1
        node._runner.engine.step = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("CUDA fell over"))
        feed(node._store, stamp_ns=node.get_clock().now().nanoseconds)
        node._on_tick()  # must not raise
        assert node.stats.errors.get("RuntimeError") == 1
        feed(node._store, stamp_ns=node.get_clock().now().nanoseconds)
        node._on_tick()  # a fresh engine serves the next frame
        assert node.stats.frames == 2
        node.trigger_deactivate()
        node.trigger_cleanup()
    finally:
        node.destroy_node()


# ---------------------------------------------------------------------------------------------- over DDS
CAMERAS = [("base_0_rgb", "/cameras/base_0_rgb/image_raw"),
           ("left_wrist_0_rgb", "/cameras/left_wrist_0_rgb/image_raw/compressed")]


@pytest.fixture(scope="module")
def node_and_probe():
    proc = NodeProcess(REPO / "config" / "synthetic.yaml", {
        "control_rate_hz": 5.0, "max_new_tokens": 4, "k": 2, "max_image_pixels": 1_000_000,
        "max_instruction_chars": 500, "camera_topics": [t for _, t in CAMERAS], "camera_compressed": [False, True],
    }, domain_id=COMPRESSED_DOMAIN).start()
    probe = Probe(CAMERAS, JOINTS, image_size=48, domain_id=COMPRESSED_DOMAIN, compressed=["left_wrist_0_rgb"],
                  name="fuzz_probe")
    try:
        assert probe.wait_for_subscribers(30), proc.output()
        yield proc, probe
    finally:
        probe.close()
        proc.stop(signal.SIGKILL if proc.alive else signal.SIGINT, timeout=5)


def send(probe: Probe, msg, topic: str = "base_0_rgb", times: int = 2) -> None:
    pub = {"joints": probe.joint_pub, "instruction": probe.instruction_pub}.get(topic) or probe.camera_pubs[topic]
    for _ in range(times):
        pub.publish(msg)
        time.sleep(0.04)


BAD_MESSAGES = [
    ("image_bad_encoding", lambda now: bad_image("encoding"), "base_0_rgb"),
    ("image_zero_size", lambda now: bad_image("zero"), "base_0_rgb"),
    ("image_too_large", lambda now: bad_image("huge"), "base_0_rgb"),
    ("image_bad_data", lambda now: bad_image("truncated"), "base_0_rgb"),
    ("image_empty", lambda now: CompressedImage(format="jpeg"), "left_wrist_0_rgb"),
    ("image_undecodable", lambda now: CompressedImage(format="jpeg", data=b"\xff\xd8garbage"), "left_wrist_0_rgb"),
    ("joint_state_malformed", lambda now: JointState(name=JOINTS, position=[0.0]), "joints"),
    ("joint_state_unknown_joints", lambda now: joints(["wheel_left", "wheel_right"]), "joints"),
    ("state_not_finite", lambda now: joints(positions=[float("nan")] * 8), "joints"),
    ("instruction_truncated", lambda now: String(data="pick " * 20_000), "instruction"),
    ("instruction_empty", lambda now: String(data=""), "instruction"),
]


def test_running_node_survives_a_table_of_bad_messages(node_and_probe) -> None:
    proc, probe = node_and_probe
    probe.start_stream(10.0)
    probe.publish_instruction("put the red block on the blue plate")
    assert probe.wait_for(lambda: len(probe.chunks()) >= 2, 10), proc.output()
    probe.stop_stream()
    time.sleep(0.2)
    for _, make, topic in BAD_MESSAGES:
        send(probe, make(probe.now_ns()), topic)
    # NaN state is the newest joint state: frames are skipped, no action from it
    assert probe.wait_for(lambda: probe.diagnostic_count("skipped.invalid_state") > 0
                          or probe.diagnostic_count("skipped.stale_camera") > 0, 3)
    assert proc.alive, proc.output()

    def missing() -> list[str]:
        return [r for r, _, _ in BAD_MESSAGES if probe.diagnostic_count(f"rejected.{r}") < 1]

    assert probe.wait_for(lambda: not missing(), 5), (missing(), probe.diagnostics())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(height=st.integers(0, 300), width=st.integers(0, 300), encoding=st.sampled_from(["rgb8", "mono16", "bgra8",
       "bayer_rggb8", "", "8UC3"]), data=st.binary(max_size=4096), sec=st.integers(0, 2**31 - 1))
def test_running_node_survives_fuzzed_images(node_and_probe, height, width, encoding, data, sec) -> None:
    proc, probe = node_and_probe
    msg = Image(height=height, width=width, encoding=encoding, step=width * 3)
    msg.header.stamp = Time(sec=sec)
    msg.data = array.array("B", data)
    probe.camera_pubs["base_0_rgb"].publish(msg)
    time.sleep(0.01)
    assert proc.alive


def test_node_serves_again_after_good_input_resumes(node_and_probe) -> None:
    proc, probe = node_and_probe
    time.sleep(0.3)
    assert proc.alive, proc.output()
    probe.start_stream(10.0)
    probe.publish_instruction("put the red block on the blue plate")
    t0 = time.monotonic()
    assert probe.wait_for(lambda: len(probe.chunks(since=t0)) >= 3, 8), (probe.diagnostics(), proc.output()[-3000:])
    assert probe.wait_for(lambda: probe.diagnostic_count("rejected_inputs") >= len(BAD_MESSAGES), 3)
    d = probe.diagnostics()
    assert d["errors"] == "0", d
    probe.stop_stream()
    assert proc.stop(signal.SIGINT, timeout=10) == 0
    assert "Traceback" not in proc.output()

