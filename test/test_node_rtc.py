"""Real-time chunking in the node over real DDS: consecutive chunks of a node with ``rtc.enabled`` agree on the
actions they share in time (the new chunk continues the one the robot is executing), those of a node without it do
not; a guided chunk starts at its first action not already committed, and /diagnostics reports the delay."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import require_ros, ros_domain

require_ros()

from oxygen_ros.testing import NodeProcess, Probe, chunk_array, header_ns  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

CONFIG = Path(__file__).resolve().parents[1] / "config" / "synthetic.yaml"
CAMERAS = [("base_0_rgb", "/cameras/base_0_rgb/image_raw"), ("left_wrist_0_rgb", "/cameras/left_wrist_0_rgb/image_raw")]
JOINTS = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
RATE_HZ = 5.0
DOMAIN = ros_domain()
PLAIN_DOMAIN = ros_domain()  # the run without guidance


def _guided_status(diag: dict[str, str]) -> bool:
    """A diagnostics status that reports guided chunks (the 1 Hz status after them)."""
    return diag.get("rtc_last_chunk_guided") == "true" and int(diag.get("rtc_guided_chunks", "0")) > 0 \
        and "actions" in diag.get("rtc_delay", "")


def _chunks(rtc: bool, domain: int, count: int = 10) -> tuple[list, dict[str, str]]:
    """``count`` consecutive chunks (and the diagnostics after them) of a node with or without real-time chunking;
    a chunk spans 0.5 s (10 actions at 20 Hz) and the node replans every 0.2 s, so consecutive chunks overlap in
    time."""
    node = NodeProcess(CONFIG, {"control_rate_hz": RATE_HZ, "action_rate_hz": 20.0, "request_every_n_frames": 0,
                                "max_image_age_s": 0.5, "rtc.enabled": rtc, "rtc.schedule": "linear",
                                "rtc.execution_horizon": 10, "rtc.max_guidance_weight": 10.0},
                       domain_id=domain).start()
    probe = Probe(CAMERAS, JOINTS, image_size=48, domain_id=domain)
    try:
        assert probe.wait_for_subscribers(30), node.output()
        probe.start_stream(10.0)
        probe.publish_instruction("put the red block on the blue plate")
        assert probe.wait_for(lambda: len(probe.chunks()) >= 2, 20), node.output()
        t0 = time.monotonic()
        assert probe.wait_for(lambda: len(probe.chunks(since=t0)) >= count, 20), node.output()
        # /diagnostics is periodic (1 Hz): wait for a status that reports them instead of sleeping past one
        ready = _guided_status if rtc else (lambda d: "state" in d)
        probe.wait_for(lambda: ready(probe.diagnostics()), 10)
        return probe.chunks(since=t0)[:count], probe.diagnostics()
    finally:
        probe.close()
        node.stop(signal.SIGINT, timeout=10)


def _overlap_gaps(chunks: list) -> list[float]:
    """For each consecutive pair, the mean |difference| of the first two actions the new chunk publishes and the
    previous chunk's actions for the same times (the action timing rule with ``first_step``)."""
    gaps = []
    for a, b in zip(chunks[:-1], chunks[1:], strict=True):
        dt = a.dt.sec * 10**9 + a.dt.nanosec
        shift = round((header_ns(b) - header_ns(a)) / dt)  # b's step 0 is a's step ``shift``
        old, new = chunk_array(a), chunk_array(b)
        diffs = []
        for j in range(2):
            i = shift + b.first_step + j - a.first_step  # the same time in a's published actions
            if 0 <= i < len(old) and j < len(new):
                diffs.append(np.abs(new[j] - old[i]).mean())
        if diffs:
            gaps.append(float(np.mean(diffs)))
    return gaps


def test_guided_chunks_continue_the_previous_one() -> None:
    guided, diag = _chunks(True, DOMAIN)
    plain, _ = _chunks(False, PLAIN_DOMAIN)
    assert all(c.first_step == 0 for c in plain), "without RTC the whole chunk is published"
    for c in guided:  # the actions whose time passed before the chunk was ready are not published
        dt, latency = c.dt.sec * 10**9 + c.dt.nanosec, c.inference_latency.sec * 10**9 + c.inference_latency.nanosec
        assert c.first_step <= (latency + 60_000_000) // dt and len(c.actions) == (10 - c.first_step) * len(JOINTS)
    assert diag.get("rtc_last_chunk_guided") == "true" and int(diag["rtc_guided_chunks"]) > 0, diag
    assert "actions" in diag.get("rtc_delay", ""), diag
    g, p = _overlap_gaps(guided), _overlap_gaps(plain)
    assert len(g) >= 5 and len(p) >= 5, (len(g), len(p))
    assert np.median(g) < 0.5 * np.median(p), (g, p)
