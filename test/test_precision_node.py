"""The node as a separate process over real DDS reports which precision runs and why: an openpi checkpoint with
``dtype: auto`` runs openpi's mixed bf16 on this CPU, in its configure log and on ``/diagnostics``."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from conftest import require_ros, ros_domain

require_ros()

from oxygen_ros.testing import NodeProcess, Probe  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
LIBERO = REPO / "test" / "fixtures" / "openpi" / "pi05_libero"
CAMERAS = [("base_0_rgb", "/agentview/image_raw"), ("left_wrist_0_rgb", "/wrist/image_raw")]  # config/libero.yaml
JOINTS = ["eef_pos_x", "eef_pos_y", "eef_pos_z", "eef_axis_angle_x", "eef_axis_angle_y", "eef_axis_angle_z",
          "gripper_finger_left", "gripper_finger_right"]
DOMAIN = ros_domain()
WANT = "bfloat16_islands (openpi checkpoint: openpi's create_trained_policy runs bf16 on every device)"


def test_the_node_reports_the_precision_the_checkpoint_chose() -> None:
    node = NodeProcess(REPO / "config" / "libero.yaml", {
        "checkpoint_path": str(LIBERO / "checkpoint"), "tokenizer_path": str(LIBERO / "tokenizer"),
        "device": "cpu", "max_new_tokens": 2}, domain_id=DOMAIN).start()
    probe = None
    try:
        assert node.wait_for_output("configured in", 120), node.output()
        assert f"(precision {WANT})" in node.output(), node.output()
        assert "precision bfloat16_islands (openpi checkpoint" in node.output()  # the loader's note, with details
        assert "graphs auto: " in node.output()  # the compiled steps it looked for (found, or the key that missed)
        probe = Probe(CAMERAS, JOINTS, domain_id=DOMAIN)
        assert probe.wait_for(lambda: probe.diagnostics().get("precision") == WANT, 20), probe.diagnostics()
    finally:
        if probe is not None:
            probe.close()
        node.stop(signal.SIGINT, timeout=10)
