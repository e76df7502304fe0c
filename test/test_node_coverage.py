"""Coverage over real DDS: a published chunk must last until the next one replaces it.

A LeRobot pi0.5 checkpoint with ``rtc_config`` (generated small, laid out as LeRobot saves it): chunk 20,
``n_action_steps`` 5, actions at 30 Hz, 5 Hz control. Five actions span 167 ms, shorter than the 200 ms control
period alone, so a node that published ``n_action_steps`` would starve a robot following the timing rule every
period. With real-time chunking the node publishes the whole chunk (LeRobot's RTC queue: ``n_action_steps`` plays no
role), 667 ms from the stamp, which lasts until the next chunk. Without it the node publishes five actions and warns at
configure and counts each short chunk in /diagnostics.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from conftest import require_ros, ros_domain

require_ros()

from oxygen_ros.engine.config import get_config  # noqa: E402
from oxygen_ros.policy.coverage import Coverage, CoverageWatch, coverage_warning  # noqa: E402
from oxygen_ros.testing import NodeProcess, Probe, chunk_array  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "config" / "synthetic.yaml"
CAMERAS = [("base_0_rgb", "/cameras/base_0_rgb/image_raw"), ("left_wrist_0_rgb", "/cameras/left_wrist_0_rgb/image_raw")]
JOINTS = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
CHUNK, N_ACTION_STEPS, ACTION_HZ, CONTROL_HZ = 20, 5, 30.0, 5.0
DOMAIN = ros_domain()
PLAIN_DOMAIN = ros_domain()  # the run without RTC


def test_coverage_rule() -> None:
    assert Coverage(0.333, 0.35).short and Coverage(0.333, 0.35).gap_s == pytest.approx(0.017)
    assert not Coverage(0.667, 0.35).short and Coverage(0.667, 0.35).gap_s == 0
    watch = CoverageWatch(0.2, window=3)
    assert not watch.observe(0.1, 10, 0.05).short  # 500 ms >= 200 + 100
    assert watch.observe(0.4, 10, 0.05).short  # 500 ms < 200 + 400 (p90 of 100, 400)
    for _ in range(3):  # the slow one stays in the p90 for two more chunks, then ages out of the window
        watch.observe(0.1, 10, 0.05)
    assert not watch.last.short and (watch.short, watch.checked) == (3, 5)
    assert coverage_warning(20, 1 / 30, 0.2, 0.15, rtc=True) is None
    note = coverage_warning(10, 1 / 30, 0.2, 0.15, rtc=False)
    assert note is not None and "starves 17 ms" in note and "rtc.enabled" in note


@pytest.fixture(scope="module")
def lerobot_rtc_checkpoint(tmp_path_factory) -> Path:
    from checkpoints import write_lerobot
    from conftest import make_model

    model = make_model(get_config("tiny", max_token_len=64, action_dim=32), seed=3)
    rtc = {"enabled": True, "prefix_attention_schedule": "EXP", "max_guidance_weight": 5.0, "execution_horizon": 10,
           "debug": False, "debug_maxlen": 100}
    return write_lerobot(tmp_path_factory.mktemp("lerobot_rtc"), model, cameras=[c for c, _ in CAMERAS],
                         state_dim=len(JOINTS), action_dim=len(JOINTS), chunk_size=CHUNK,
                         n_action_steps=N_ACTION_STEPS, extra_config={"rtc_config": rtc})


def _run(checkpoint: Path, rtc: bool, domain: int, count: int = 6) -> tuple[list, dict[str, str], str]:
    """``count`` consecutive chunks, the diagnostics after them and the node's log."""
    node = NodeProcess(CONFIG, {"model": "", "checkpoint_path": str(checkpoint), "control_rate_hz": CONTROL_HZ,
                                "action_rate_hz": ACTION_HZ, "request_every_n_frames": 0, "max_image_age_s": 0.5,
                                "rtc.enabled": rtc}, domain_id=domain).start()
    probe = Probe(CAMERAS, JOINTS, image_size=48, domain_id=domain)
    try:
        assert probe.wait_for_subscribers(60), node.output()
        probe.start_stream(10.0)
        probe.publish_instruction("put the red block on the blue plate")
        assert probe.wait_for(lambda: len(probe.chunks()) >= 2, 60), node.output()
        t0 = time.monotonic()
        assert probe.wait_for(lambda: len(probe.chunks(since=t0)) >= count, 30), node.output()
        chunks = probe.chunks(since=t0)[:count]
        # wait for a diagnostics report that counted them (no snapshot of the periodic topic)
        assert probe.wait_for(lambda: int(probe.diagnostics().get("coverage_short_chunks", "0/0").split("/")[1])
                              >= count + 2, 15), probe.diagnostics()
        return chunks, probe.diagnostics(), node.output()
    finally:
        probe.close()
        node.stop(signal.SIGINT, timeout=10)


@pytest.mark.ros
@pytest.mark.slow
def test_rtc_publishes_the_whole_chunk_so_it_lasts_until_the_next(lerobot_rtc_checkpoint) -> None:
    chunks, diag, log = _run(lerobot_rtc_checkpoint, True, DOMAIN)
    for c in chunks:
        rows = chunk_array(c).shape[0]
        assert c.first_step + rows == CHUNK, (c.first_step, rows)  # n_action_steps (5) plays no role under RTC
        latency = c.inference_latency.sec + c.inference_latency.nanosec * 1e-9
        assert (c.first_step + rows) / ACTION_HZ >= 1 / CONTROL_HZ + latency  # lasts until the next one
    assert diag["coverage_short_chunks"].startswith("0/"), diag
    assert int(diag["chunk_coverage_ms"]) == round(CHUNK / ACTION_HZ * 1e3), diag
    assert "coverage_warning" not in diag and "coverage:" not in log, diag


@pytest.mark.ros
@pytest.mark.slow
def test_a_configuration_that_starves_the_robot_is_warned_and_counted(lerobot_rtc_checkpoint) -> None:
    chunks, diag, log = _run(lerobot_rtc_checkpoint, False, PLAIN_DOMAIN)
    assert all(c.first_step == 0 and chunk_array(c).shape[0] == N_ACTION_STEPS for c in chunks)
    assert "coverage: 5 actions per chunk are published" in log  # the configure-time warning
    assert "starves" in diag.get("coverage_warning", ""), diag
    short, checked = map(int, diag["coverage_short_chunks"].split("/"))
    assert short == checked >= len(chunks), diag  # 167 ms < 200 ms period + age: every chunk is short
    assert int(diag["warning.chunk_coverage_short"]) == short, diag
    assert int(diag["chunk_coverage_ms"]) == round(N_ACTION_STEPS / ACTION_HZ * 1e3), diag
    assert int(diag["next_chunk_expected_ms"]) > 1e3 / CONTROL_HZ, diag
