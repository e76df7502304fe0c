"""Camera synchronisation, lazy decoding and camera health, without a running node: the approximate-time matcher
against a brute-force reference, the observation builder with jittered and lagging cameras, future-stamped and
bad images found at decode time, and the silent-camera / QoS warnings.
"""

from __future__ import annotations

import itertools
import random

import cv2
import numpy as np
import pytest
from conftest import require_ros

require_ros(messages=False)

from sensor_msgs.msg import CompressedImage, JointState  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from oxygen_ros.policy import Policy, load_policy  # noqa: E402
from oxygen_ros.policy.synthetic import make_random_checkpoint  # noqa: E402
from oxygen_ros.robot.camera_sync import best_match  # noqa: E402
from oxygen_ros.ros.camera_image import CAMERA_BUFFER_DEPTH  # noqa: E402
from oxygen_ros.ros.diagnostics import CameraWatch, NodeStats, ReasonCounter  # noqa: E402
from oxygen_ros.ros.image_conversion import array_to_image_msg  # noqa: E402
from oxygen_ros.ros.input_store import InputStore  # noqa: E402
from oxygen_ros.ros.observation_builder import ObservationBuilder, Skip  # noqa: E402
from oxygen_ros.ros.stamps import time_msg  # noqa: E402

SEC = 1_000_000_000
MS = 1_000_000
CAMS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
JOINTS = ["j1", "j2"]


# ---------------------------------------------------------------------------------------------- the matcher
def brute_force(stamps: list[list[int]], after_ns: int = -1) -> tuple[int, int, int]:
    """(spread, newest, oldest) of the best set by enumeration: smallest spread, then newest, then newest oldest,
    among the sets whose newest stamp is after ``after_ns``."""
    return min((max(c) - min(c), -max(c), -min(c)) for c in itertools.product(*stamps) if max(c) > after_ns)


def test_best_match_equals_brute_force_on_jittered_stamps() -> None:
    for seed in range(300):
        check_against_brute_force(seed)


def check_against_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    n_cams, depth = rng.randint(1, 4), rng.randint(1, 5)
    period, phase = 33 * MS, [rng.randint(0, 33 * MS) for _ in range(n_cams)]
    stamps = [[10 * SEC + phase[c] + k * period + rng.randint(-4 * MS, 4 * MS) for k in range(depth)]
              for c in range(n_cams)]
    if seed % 5 == 0:  # equal stamps (hardware-triggered): ties must go to the newest set
        stamps = [[10 * SEC + k * period for k in range(depth)] for _ in range(n_cams)]
    for s in stamps:
        rng.shuffle(s)  # any order
    match = best_match(stamps)
    spread, newest, oldest = brute_force(stamps)
    assert (match.spread_ns, -match.newest_ns, -match.oldest_ns) == (spread, newest, oldest)
    chosen = [stamps[c][j] for c, j in enumerate(match.indices)]
    assert max(chosen) - min(chosen) == match.spread_ns and max(chosen) == match.newest_ns


def test_best_match_edge_cases() -> None:
    assert best_match([]) is None and best_match([[1, 2], []]) is None
    m = best_match([[5, 10, 20], [11, 30]])
    assert m.indices == (1, 0) and m.spread_ns == 1
    tie = best_match([[0, 10], [0, 10]])
    assert tie.indices == (1, 1), "equal spreads: the newest set"
    assert m.within(1) and not m.within(0) and m.within(-1)


# ---------------------------------------------------------------------------------------------- the builder
@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Policy:
    out = make_random_checkpoint(tmp_path_factory.mktemp("ckpt"), "tiny", None, tokenizer=True, camera_names=CAMS,
                                 max_token_len=128, action_dim=8)
    return load_policy(out, generated=True)


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_store(clock: FakeClock | None = None, node_clock_ns=None) -> InputStore:
    store = InputStore(CAMS, JOINTS, ReasonCounter(None, "rejected"), clock=clock or FakeClock(),
                       node_clock_ns=node_clock_ns)
    store.on_joint_state(JointState(name=JOINTS, position=[0.1, 0.2]))
    store.on_instruction(String(data="go"))
    return store


def rgb_msg(stamp_ns: int, value: int = 100, h: int = 24, w: int = 32):
    return array_to_image_msg(np.full((h, w, 3), value, np.uint8), stamp_ns)


def jpeg_msg(stamp_ns: int, body: bool = True) -> CompressedImage:
    data = cv2.imencode(".jpg", np.random.default_rng(0).integers(0, 255, (24, 32, 3), dtype=np.uint8))[1].tobytes()
    if not body:  # a valid header, no image data: passes the cheap checks, fails to decode
        data = data[:data.index(b"\xff\xda")]
    msg = CompressedImage(format="jpeg", data=data)
    msg.header.stamp = time_msg(stamp_ns)
    return msg


def stream(store: InputStore, clock: FakeClock, t0_ns: int, seconds: float, offsets_s=(0.0, 0.0, 0.0),
           jitter_ms: float = 3.0, rate_hz: float = 30.0, seed: int = 0):
    """Cameras publishing at ``rate_hz`` (stamp = capture time + offset + jitter); yields at each 10 Hz tick."""
    rng = random.Random(seed)
    events = []
    for c, off in enumerate(offsets_s):
        phase = rng.uniform(0, 1 / rate_hz)
        events += [(phase + k / rate_hz, c, off) for k in range(int(seconds * rate_hz))]
    events.sort()
    next_tick = 0.1
    for t, c, off in events:
        while t >= next_tick:
            yield t0_ns + round(next_tick * 1e9)
            next_tick += 0.1
        clock.t = 100.0 + t
        stamp = t0_ns + round((t + off + rng.uniform(-jitter_ms, jitter_ms) / 1e3) * 1e9)
        assert store.on_image(c, rgb_msg(stamp))


@pytest.mark.parametrize("skew_s, served", [(0.1, False), (0.5, True)])
def test_a_camera_lagging_300_ms_is_skipped_with_0_1_and_served_with_0_5(policy, skew_s: float, served: bool) -> None:
    clock = FakeClock()
    store = make_store(clock)
    builder = ObservationBuilder(store, policy, max_age_s=0.5, max_camera_skew_s=skew_s)
    results = [builder.build(now) for now in stream(store, clock, 50 * SEC, 2.0, offsets_s=(0.0, 0.0, -0.3))]
    results = results[5:]  # once the lagging camera's images are younger than max_image_age_s
    skipped = [r for r in results if isinstance(r, Skip)]
    if served:
        assert not skipped, skipped[:2]
        assert all(r.stamp_ns / 1e9 - 50 > 0.2 for r in results)
    else:
        assert len(skipped) == len(results) and {r.reason for r in skipped} == {"camera_skew"}, skipped[:2]
        assert "best spread" in skipped[0].detail


def test_in_sync_cameras_give_the_best_matching_recent_set(policy) -> None:
    clock = FakeClock()
    store = make_store(clock)
    builder = ObservationBuilder(store, policy, max_age_s=0.5, max_camera_skew_s=0.02)
    n, last = 0, -1
    for now in stream(store, clock, 50 * SEC, 1.5, jitter_ms=2.0, seed=3):
        built = builder.build(now)
        assert not isinstance(built, Skip), built
        buffers = store.camera_buffers()
        best = brute_force([[im.stamp_ns for im in b] for b in buffers], last)
        assert built.stamp_ns == -best[1], "the observation stamp is the newest stamp of the best new set"
        assert now - built.stamp_ns < 0.2 * SEC and built.stamp_ns > last
        last = built.stamp_ns
        n += 1
    assert n >= 12


def test_decoding_is_lazy_and_happens_once(policy) -> None:
    clock = FakeClock()
    store = make_store(clock)
    for k in range(6):
        for c in range(len(CAMS)):
            store.on_image(c, rgb_msg(50 * SEC + k * 33 * MS))
    buffers = store.camera_buffers()
    assert all(len(b) == CAMERA_BUFFER_DEPTH for b in buffers), "bounded buffers"
    assert not any(im.decoded for b in buffers for im in b), "nothing is decoded on arrival"
    builder = ObservationBuilder(store, policy, max_age_s=0.5)
    first = builder.build(50 * SEC + 200 * MS)
    assert not isinstance(first, Skip), first
    decoded = [im for b in store.camera_buffers() for im in b if im.decoded]
    assert len(decoded) == len(CAMS) and all(im.stamp_ns == first.stamp_ns for im in decoded)
    pixels = [im._pixels for im in decoded]
    again = builder.build(50 * SEC + 210 * MS)
    assert isinstance(again, Skip) and again.reason == "repeated_observation", "an observation is used once"
    second = ObservationBuilder(store, policy, max_age_s=0.5).build(50 * SEC + 210 * MS)  # e.g. after re-activation
    assert second.stamp_ns == first.stamp_ns
    assert [im._pixels for im in store.camera_buffers()[0][-1:]][0] is pixels[0], "converted once, then cached"


def test_bad_data_found_at_decode_is_counted_and_an_older_image_used(policy) -> None:
    store = InputStore(CAMS, JOINTS, ReasonCounter(None, "rejected"), clock=FakeClock())
    store.on_joint_state(JointState(name=JOINTS, position=[0.1, 0.2]))
    store.on_instruction(String(data="go"))
    now = 50 * SEC
    for c in range(len(CAMS) - 1):
        for k in (0, 1):
            store.on_image(c, rgb_msg(now - (1 - k) * 33 * MS))
    cam = len(CAMS) - 1
    assert store.on_compressed(cam, jpeg_msg(now - 33 * MS))
    assert store.on_compressed(cam, jpeg_msg(now, body=False)), "a valid header passes the cheap arrival checks"
    built = ObservationBuilder(store, policy, max_age_s=0.5).build(now + 10 * MS)
    assert not isinstance(built, Skip), built
    assert store.rejected.get("image_undecodable") == 1
    assert built.stamp_ns == now - 33 * MS, "the set was chosen again without the bad image"
    assert all(im.stamp_ns != now for im in store.camera_buffers()[cam]), "the bad image is dropped"
    # only bad images left: the frame is skipped, never a crash
    store2 = make_store()
    for c in range(len(CAMS) - 1):
        store2.on_image(c, rgb_msg(now))
    store2.on_compressed(cam, jpeg_msg(now, body=False))
    skipped = ObservationBuilder(store2, policy, max_age_s=0.5).build(now)
    assert isinstance(skipped, Skip) and skipped.reason == "missing_camera"
    assert store2.rejected.get("image_undecodable") == 1


def test_future_images_are_rejected_and_do_not_block_acting(policy) -> None:
    now = [50 * SEC]
    store = make_store(node_clock_ns=lambda: now[0])
    builder = ObservationBuilder(store, policy, max_age_s=0.5)
    for c in range(len(CAMS)):
        store.on_image(c, rgb_msg(now[0] - 10 * MS))
    assert not store.on_image(0, rgb_msg(now[0] + 5 * SEC)), "5 s ahead of the node clock"
    assert store.rejected.get("image_from_future") == 1
    built = builder.build(now[0])
    assert not isinstance(built, Skip) and built.stamp_ns == now[0] - 10 * MS
    assert store.on_image(0, rgb_msg(now[0] + 50 * MS)), "within the tolerance (clock offset, /clock lag)"
    # without a node clock in the store (bag evaluation) the builder finds it and drops it, once
    store2 = make_store()
    for c in range(len(CAMS)):
        store2.on_image(c, rgb_msg(now[0] - 10 * MS))
    store2.on_image(1, rgb_msg(now[0] + 5 * SEC))
    b2 = ObservationBuilder(store2, policy, max_age_s=0.5)
    assert not isinstance(b2.build(now[0]), Skip)
    assert not isinstance(ObservationBuilder(store2, policy, max_age_s=0.5).build(now[0]), Skip)
    assert store2.rejected.get("image_from_future") == 1


def test_unsynchronised_mode_takes_each_cameras_newest(policy) -> None:
    store = make_store()
    now = 50 * SEC
    for c, lag in enumerate((0, 10, 400)):
        store.on_image(c, rgb_msg(now - lag * MS))
    assert ObservationBuilder(store, policy, 0.5, max_camera_skew_s=0.1).build(now).reason == "camera_skew"
    built = ObservationBuilder(store, policy, 0.5, max_camera_skew_s=-1.0).build(now)
    assert not isinstance(built, Skip) and built.stamp_ns == now


# ---------------------------------------------------------------------------------------------- health
def test_lost_images_make_a_lossy_warning() -> None:
    clock = FakeClock(0.0)
    stats = NodeStats(clock=clock)
    watch = CameraWatch(["base"], ["/cam"], "best_effort", stats.warnings, clock=clock)
    watch.on_message_lost(0, 3)
    assert watch.check_loss(0, rate_hz=30.0) is None, "a few lost images are normal"
    watch.on_message_lost(0, 40)
    text = watch.check_loss(0, rate_hz=5.0)
    assert text and "lost 43 of 53" in text and "fastdds.xml" in text
    clock.t = 5.0
    assert watch.check_loss(0, rate_hz=5.0) is None, "only the recent window counts"


def test_camera_status_reports_rate_and_counts() -> None:
    clock = FakeClock()
    store = InputStore(CAMS[:1], JOINTS, ReasonCounter(None, "rejected"), clock=clock)
    for k in range(60):
        clock.t = 100.0 + k / 30
        store.on_image(0, rgb_msg(k * 33 * MS))
    bad = rgb_msg(0)
    bad.height = 0
    assert not store.on_image(0, bad)  # rejected, still received
    st = store.camera_status()[0]
    assert st.received == 61 and st.rate_hz == pytest.approx(30.5, abs=1.0) and st.newest_stamp_ns == 59 * 33 * MS


def test_silent_camera_with_publishers_warns_and_names_the_causes() -> None:
    clock = FakeClock(0.0)
    stats = NodeStats(clock=clock)
    watch = CameraWatch(["base"], ["/cameras/base/image_raw"], "best_effort", stats.warnings, silent_after_s=3.0,
                        clock=clock)
    assert watch.check(0, publishers=0, last_arrival=None) is None, "no publisher: nothing to say"
    assert watch.check(0, publishers=1, last_arrival=None) is None, "just discovered"
    clock.t = 2.0
    assert watch.check(0, 1, None) is None
    clock.t = 3.5
    text = watch.check(0, 1, None)
    assert text and "fastdds.xml" in text and "QoS" in text and "shared-memory" in text
    assert watch.check(0, 1, last_arrival=3.4) is None, "images arrive again"
    watch.on_incompatible_qos(0, 1, "RELIABILITY")
    clock.t = 10.0
    values, warnings = watch.report([type("S", (), {"name": "base", "received": 0, "rate_hz": 0.0,
                                                    "last_arrival": 3.4, "newest_stamp_ns": None})()], [1], 0)
    assert values["camera.base.qos_incompatible"] == 1 and values["camera.base.silent"] is True
    assert values["camera.base.lossy"] is False
    assert "RELIABILITY" in warnings[0]
    status = stats.status("oxygen: inference", "cpu", "active", 0, 10, values, warnings)
    kv = {v.key: v.value for v in status.values}
    assert status.level == b"\x01" or status.level == 1, status.level
    assert kv["warning.camera_qos_incompatible"] == "1" and int(kv["warning.camera_silent"]) >= 1
    assert "no image" in status.message
