"""Real camera streams over real DDS, publisher in another process: three 640x480 rgb8 cameras and one 1280x720
JPEG camera at 30 Hz, BEST_EFFORT, into the node as a separate process.

- with the project's Fast DDS profile (config/fastdds.xml) applied to both processes through
  ``dds_profile_environment``, as the launch file applies it: >= 95% of the images reach the node (its
  diagnostics counts) and chunks come at the control rate;
- without it: the node warns (silent or lossy cameras) and names the likely causes;
- a RELIABLE-only camera subscription against a BEST_EFFORT publisher is reported as a QoS incompatibility.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("rclpy", reason="rclpy is not installed")
pytest.importorskip("oxygen_ros.msg", reason="the oxygen_ros messages are not built (run `make setup`)")

os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"

from oxygen_ros.ros.dds import PROFILE_ENV_VARS, dds_profile_environment, default_profile_path  # noqa: E402
from oxygen_ros.testing import NodeProcess, Probe, ros_env  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
CAMS = ["cam_a", "cam_b", "cam_c", "cam_d"]
STREAMS = ["/cams/a:640x480:rgb8", "/cams/b:640x480:rgb8", "/cams/c:640x480:rgb8",
           "/cams/d/compressed:1280x720:jpeg"]
TOPICS = [s.split(":")[0] for s in STREAMS]
JOINTS = ["j1", "j2", "j3"]
RATE_HZ = 5.0
STREAM_S = 6.0
DOMAIN = 30 + (os.getpid() * 7 + 5) % 100


def environment(domain: int, profile: bool) -> dict[str, str]:
    """A child's environment: the project's DDS profile applied exactly as the launch file applies it, or none."""
    env = ros_env(domain, {k: v for k, v in os.environ.items() if k not in PROFILE_ENV_VARS})
    if profile:
        extra, why = dds_profile_environment(default_profile_path(), env)
        assert extra, why
        env.update(extra)
    return env


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny random pi0.5 with four camera slots."""
    from oxygen_ros.policy.synthetic import make_random_checkpoint

    return make_random_checkpoint(tmp_path_factory.mktemp("cams4"), "tiny", None, tokenizer=True,
                                  camera_names=tuple(CAMS), max_token_len=128, action_dim=8)


def start_node(checkpoint: Path, domain: int, profile: bool, **overrides) -> NodeProcess:
    params = {"model": "", "checkpoint_path": str(checkpoint), "normalization": "none", "device": "cpu",
              "torch_threads": 1, "joint_names": JOINTS, "camera_names": CAMS, "camera_topics": TOPICS,
              "camera_compressed": [False, False, False, True], "control_rate_hz": RATE_HZ, "max_new_tokens": 4,
              "k": 2, "request_every_n_frames": 2, "request_task": "narration", "max_image_age_s": 0.5, **overrides}
    proc = NodeProcess(None, params, domain_id=domain)
    proc.env = environment(domain, profile)
    return proc.start()


def stream(domain: int, profile: bool, seconds: float, streams: list[str] = STREAMS, wait: float = 10.0
           ) -> subprocess.Popen:
    """The camera publisher as its own process (python -m oxygen_ros.testing.camera_streams)."""
    cmd = [sys.executable, "-m", "oxygen_ros.testing.camera_streams", *streams, "--rate", "30",
           "--duration", str(seconds), "--wait", str(wait)]
    return subprocess.Popen(cmd, env=environment(domain, profile), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def sent_counts(out: str) -> dict[str, int]:
    """The publisher's final report: ``<topic>: <n> sent (...)`` per stream."""
    counts = {}
    for line in out.splitlines():
        topic, _, rest = line.partition(": ")
        if rest.split(" ")[1:2] == ["sent"]:
            counts[topic] = int(rest.split(" ")[0])
    return counts


@pytest.fixture
def session(checkpoint, request) -> Iterator[tuple[NodeProcess, Probe, int]]:
    """A node (profile and overrides from the test's parameters) and a probe feeding joints and the instruction."""
    profile, overrides, offset = request.param
    domain = DOMAIN + offset
    node = start_node(checkpoint, domain, profile, **overrides)
    probe = Probe([], JOINTS, domain_id=domain, name=f"camera_probe_{offset}")
    try:
        assert probe.wait_for(lambda: probe.diagnostics().get("state") == "active", 60), node.output()[-3000:]
        probe.start_stream(20.0)  # joint states only (the probe publishes no camera)
        probe.publish_instruction("put the red block on the blue plate")
        yield node, probe, domain
    finally:
        probe.close()
        node.stop(signal.SIGKILL if node.alive else signal.SIGINT, timeout=5)


@pytest.mark.parametrize("session", [(True, {}, 0)], indirect=True, ids=["profile"])
def test_hd_streams_reach_the_node_with_the_profile(session) -> None:
    node, probe, domain = session
    publisher = stream(domain, profile=True, seconds=STREAM_S)
    head = []  # its logger may print first
    while not (head and head[-1].startswith("streaming")) and len(head) < 5:
        head.append(publisher.stdout.readline())
    assert head[-1].startswith("streaming"), head
    t_start = time.monotonic()
    out, _ = publisher.communicate(timeout=STREAM_S + 30)
    t_end = time.monotonic()
    sent = sent_counts(out)
    assert set(sent) == set(TOPICS), out
    # /diagnostics is periodic (1 Hz): wait for the status that carries the final counts instead of one sleep
    probe.wait_for(lambda: all(int(probe.diagnostics().get(f"camera.{cam}.received", "0")) >= 0.95 * sent[topic]
                               for cam, topic in zip(CAMS, TOPICS, strict=True)), 10)
    d = probe.diagnostics()
    for cam, topic in zip(CAMS, TOPICS, strict=True):
        received = int(d[f"camera.{cam}.received"])
        assert received >= 0.95 * sent[topic], (cam, received, sent[topic], d)
        assert d[f"camera.{cam}.silent"] == d[f"camera.{cam}.lossy"] == "False", d
    assert int(d.get("warning.camera_silent", 0)) == 0 and int(d.get("warning.camera_lossy", 0)) == 0, d
    # chunks at the control rate while the streams ran (after the first second: buffers filling)
    window = (t_start + 1.0, t_end - 0.5)
    n_window = len(probe.chunks(since=window[0])) - len(probe.chunks(since=window[1]))
    expected = RATE_HZ * (window[1] - window[0])
    assert n_window >= 0.8 * expected, (n_window, expected, d)
    assert int(d["errors"]) == 0, d
    assert "Traceback" not in node.output()


@pytest.mark.parametrize("session", [(False, {}, 1)], indirect=True, ids=["no_profile"])
def test_without_the_profile_the_node_warns_and_names_the_causes(session) -> None:
    node, probe, domain = session
    publisher = stream(domain, profile=False, seconds=STREAM_S)

    def warned() -> bool:
        return probe.diagnostic_count("warning.camera_silent") + probe.diagnostic_count("warning.camera_lossy") > 0

    try:
        assert probe.wait_for(warned, STREAM_S + 8), probe.diagnostics()
    finally:
        publisher.communicate(timeout=STREAM_S + 30)
    d = probe.diagnostics()
    flagged = [cam for cam in CAMS[:3] if "True" in (d.get(f"camera.{cam}.silent"), d.get(f"camera.{cam}.lossy"))]
    assert flagged or any(int(d[f"camera.{cam}.received"]) == 0 for cam in CAMS[:3]), d
    assert node.wait_for_output("fastdds.xml", 5), node.output()[-3000:]
    log = node.output()
    assert "Likely causes" in log and ("no image for" in log or "lost" in log), log[-3000:]


@pytest.mark.parametrize("session", [(True, {"camera_reliability": "reliable", "camera_names": CAMS[:1],
                                            "camera_topics": TOPICS[:1], "camera_compressed": [False]}, 2)],
                         indirect=True, ids=["reliable_vs_best_effort"])
def test_reliable_subscription_against_best_effort_publisher_is_a_qos_incompatibility(session) -> None:
    node, probe, domain = session
    publisher = stream(domain, profile=True, seconds=4.0, streams=["/cams/a:64x48:rgb8"], wait=0.0)
    try:
        assert probe.wait_for(lambda: probe.diagnostic_count("camera.cam_a.qos_incompatible") > 0, 8), \
            probe.diagnostics()
    finally:
        publisher.communicate(timeout=30)
    d = probe.diagnostics()
    assert int(d["warning.camera_qos_incompatible"]) >= 1 and int(d["camera.cam_a.received"]) == 0, d
    assert node.wait_for_output("incompatible", 3) and "RELIABILITY" in node.output(), node.output()[-3000:]
