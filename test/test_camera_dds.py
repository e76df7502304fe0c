"""Real camera streams over real DDS, publisher in another process: three 640x480 rgb8 cameras and one 1280x720
JPEG camera at 30 Hz, BEST_EFFORT, into the node as a separate process.

- side by side, at the same time: a node and publisher with the project's Fast DDS profile (config/fastdds.xml,
  applied through ``dds_profile_environment`` as the launch file applies it) and a pair with the default settings.
  With the profile at most a quarter as many raw images are lost as with the default settings, no camera
  goes silent, and the node acts on them (chunks stamped with the streamed
  images); the default settings' node warns and names the causes.
  Relative comparisons, never a fixed share: how much the default settings lose depends on the host's load;
- a RELIABLE-only camera subscription against a BEST_EFFORT publisher is reported as a QoS incompatibility.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import require_ros, ros_domain

require_ros()

from oxygen_ros.ros.dds import PROFILE_ENV_VARS, dds_profile_environment, default_profile_path  # noqa: E402
from oxygen_ros.testing import NodeProcess, Probe, header_ns, ros_env  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
CAMS = ["cam_a", "cam_b", "cam_c", "cam_d"]
STREAMS = ["/cams/a:640x480:rgb8", "/cams/b:640x480:rgb8", "/cams/c:640x480:rgb8",
           "/cams/d/compressed:1280x720:jpeg"]
TOPICS = [s.split(":")[0] for s in STREAMS]
JOINTS = ["j1", "j2", "j3"]
RATE_HZ = 5.0
STREAM_S = 6.0
DOMAINS = [ros_domain() for _ in range(3)]  # one per session offset


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


@contextmanager
def node_session(checkpoint: Path, profile: bool, offset: int, **overrides) -> Iterator[tuple[NodeProcess, Probe,
                                                                                              int]]:
    """A node (with or without the profile, ``overrides``) and a probe feeding joints and the instruction; the node
    is waited for by the caller (:func:`wait_active`), so that several start at once."""
    domain = DOMAINS[offset]
    node = start_node(checkpoint, domain, profile, **overrides)
    probe = Probe([], JOINTS, domain_id=domain, name=f"camera_probe_{offset}")
    try:
        yield node, probe, domain
    finally:
        probe.close()
        node.stop(signal.SIGKILL if node.alive else signal.SIGINT, timeout=5)


def wait_active(node: NodeProcess, probe: Probe) -> None:
    assert probe.wait_for(lambda: probe.diagnostics().get("state") == "active", 60), node.output()[-3000:]
    probe.start_stream(20.0)  # joint states only (the probe publishes no camera)
    probe.publish_instruction("put the red block on the blue plate")


@pytest.fixture
def session(checkpoint, request) -> Iterator[tuple[NodeProcess, Probe, int]]:
    """One node session (profile, overrides, domain offset from the test's parameters), active."""
    profile, overrides, offset = request.param
    with node_session(checkpoint, profile, offset, **overrides) as (node, probe, domain):
        wait_active(node, probe)
        yield node, probe, domain


def wait_streaming(publisher: subprocess.Popen) -> None:
    """Until the publisher prints that it streams (every topic has its subscriber); its logger may print first."""
    head: list[str] = []
    while not (head and head[-1].startswith("streaming")) and len(head) < 5:
        head.append(publisher.stdout.readline())
    assert head[-1].startswith("streaming"), head


def settled_received(probe: Probe, timeout: float = 15.0) -> dict[str, int]:
    """The node's final per-camera receive counts: /diagnostics is periodic (1 Hz), so wait until two statuses
    2.5 s apart carry the same counts (the streams have ended) instead of one fixed sleep."""
    def counts() -> dict[str, int]:
        d = probe.diagnostics()
        return {cam: int(d.get(f"camera.{cam}.received", "0")) for cam in CAMS}

    last, since, end = counts(), time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < end:
        time.sleep(0.25)
        now = counts()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 2.5:
            break
    return last


RAW = [cam for cam, s in zip(CAMS, STREAMS, strict=True) if s.endswith(":rgb8")]


def test_hd_streams_reach_the_node_with_the_profile_where_the_default_settings_lose_them(checkpoint) -> None:
    """Side by side, at the same time on the same host (whatever its load): the same four streams into a node with
    the project's DDS profile and into one with the default settings. The profile's promise: large raw images
    arrive, no camera goes silent and the node acts on them, where the default settings lose raw images and that
    node says so and names the causes. The losses are compared, never fixed: how many the default settings lose
    depends on the host's load."""
    with node_session(checkpoint, True, 0) as (node, probe, dom), \
            node_session(checkpoint, False, 1) as (plain_node, plain_probe, plain_dom):
        wait_active(node, probe)
        wait_active(plain_node, plain_probe)
        before_ns = time.time_ns()  # the images' stamps: the publishers' clock (this host's, as the node's)
        publishers = [stream(dom, profile=True, seconds=STREAM_S), stream(plain_dom, profile=False, seconds=STREAM_S)]
        for publisher in publishers:
            wait_streaming(publisher)
        t_start = time.monotonic()
        outs = [p.communicate(timeout=STREAM_S + 30)[0] for p in publishers]
        t_end = time.monotonic()
        # the node's judgement of its cameras while they streamed (the last status: a stream that has ended turns
        # silent 3 s later, as it should)
        d_streaming = probe.diagnostics()
        sent, plain_sent = sent_counts(outs[0]), sent_counts(outs[1])
        assert set(sent) == set(plain_sent) == set(TOPICS), outs
        got, plain_got = settled_received(probe), settled_received(plain_probe)
        sent = dict(zip(CAMS, (sent[t] for t in TOPICS), strict=True))
        plain_sent = dict(zip(CAMS, (plain_sent[t] for t in TOPICS), strict=True))
        d, plain_d = probe.diagnostics(), plain_probe.diagnostics()
        report = {"profile": (got, sent), "default": (plain_got, plain_sent)}
        print("received, sent:", report, "default node's flags:",  # shown with -rP
              {k: v for k, v in plain_d.items() if k.endswith((".silent", ".lossy", ".lost"))})

        # the profile: the large raw images arrive (their size no longer decides), where the default settings lose
        # them, side by side. How many the default settings lose varies with the load (measured beside two CPU
        # hogs: 23-37% of the raw images at load 3, 92% at load 6); what holds is the ratio: the profile loses at
        # most a quarter as many (measured: 0-3 of 543), or at most 1% of those sent (an image at a stream's edge).
        raw_lost = sum(sent[c] - got[c] for c in RAW)
        plain_raw_lost = sum(plain_sent[c] - plain_got[c] for c in RAW)
        assert plain_raw_lost > 0 and raw_lost <= max(plain_raw_lost / 4, 0.01 * sum(sent[c] for c in RAW)), report
        # while they streamed, no camera of the profile's node went silent (the "lossy" flag is a fixed 20% of
        # recent images: a loaded host's starved reader can pass it with the profile too, so it is reported, not
        # asserted)
        flags = {k: v for k, v in d_streaming.items() if k.endswith((".silent", ".lossy", ".lost"))}
        assert all(d_streaming[f"camera.{cam}.silent"] == "False" for cam in CAMS), flags
        # the node acts on them: its chunks while the streams ran are stamped with their images (an observation's
        # stamp is its newest image's; none of these images existed before the publishers started). How many, a
        # loaded host decides (a tick rate, not a transport property): some, reported, not a fixed share
        acted = [c for c in probe.chunks(since=t_start) if header_ns(c) >= before_ns]
        ticks = RATE_HZ * (t_end - t_start)
        assert len(acted) >= 3, (len(acted), f"{ticks:.0f} ticks", d)
        assert int(d["errors"]) == 0, d
        assert "Traceback" not in node.output()

        # the default settings' node sees the loss (the middleware's lost-image events on the raw cameras), says
        # so, and names the likely causes
        assert sum(int(plain_d.get(f"camera.{c}.lost", "0")) for c in RAW) > 0, plain_d
        assert plain_probe.wait_for(lambda: plain_probe.diagnostic_count("warning.camera_silent")
                                    + plain_probe.diagnostic_count("warning.camera_lossy") > 0, 8), plain_d
        assert plain_node.wait_for_output("fastdds.xml", 5), plain_node.output()[-3000:]
        log = plain_node.output()
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
