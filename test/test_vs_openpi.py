"""Our side of the openpi side-by-side benchmark (bench/vs_openpi.py): the module imports without openpi, the
checkpoint it writes loads in oxygen_ros, and the timed action path returns the model's own actions."""

from __future__ import annotations

import json
import sys

import torch

from oxygen_ros.bench import vs_openpi
from oxygen_ros.engine import get_config
from oxygen_ros.engine.checkpoint import load_checkpoint
from oxygen_ros.policy.synthetic import make_random_checkpoint


def test_module_needs_no_openpi():
    assert not any(name == "openpi" or name.startswith("openpi.") for name in sys.modules)


def test_action_path_equals_sample_actions(tmp_path):
    cfg = get_config("tiny", None, camera_names=vs_openpi.OPENPI_SLOTS, action_dim=32, action_horizon=10)
    ckpt = make_random_checkpoint(tmp_path / "ckpt", "tiny", None, std=0.1, camera_names=vs_openpi.OPENPI_SLOTS,
                                  action_dim=32, action_horizon=10)
    vs_openpi.add_expert_lm_head(ckpt / "model.safetensors", cfg)  # openpi's strict load wants it; we ignore it
    obs, noise = vs_openpi.make_inputs(cfg)
    assert obs.image_masks.tolist() == [[True, True, False]]
    reference = load_checkpoint(ckpt).sample_actions(obs, noise.clone(), num_steps=10)[0]
    assert reference.abs().max() > 0.05
    for variant in ("off", "off:plain", "off:packed", "static"):
        stages = {"prefill": [], "denoise": []}
        actions = vs_openpi.ours_runner(load_checkpoint(ckpt), variant, stages)(obs, noise.clone())
        torch.testing.assert_close(actions.reshape(reference.shape), reference, atol=1e-5, rtol=0)
        assert len(stages["prefill"]) == len(stages["denoise"]) == 1
    pobs = vs_openpi.openpi_observation(obs, cfg)
    assert pobs.images["left_wrist_0_rgb"].shape == (1, 3, cfg.vision.image_size, cfg.vision.image_size)
    assert not bool(pobs.image_masks["right_wrist_0_rgb"])


def test_plot_writes_png(tmp_path):
    record = {"config": "tiny", "threads": 1, "openpi_compile_mode": "none",
              "median_ms": {"openpi_eager": 13.0, "oxygen_off": 4.6},
              "paired_median_ratio_openpi_over_ours": {"openpi_eager/oxygen_off": 2.9},
              "max_abs_vs_openpi_eager": {"openpi_eager": 0.0, "oxygen_off": 1.2e-7}}
    (tmp_path / "r.json").write_text(json.dumps(record))
    vs_openpi.main(["plot", str(tmp_path / "r.json"), "--png", str(tmp_path / "r.png"), "--md", str(tmp_path / "r.md")])
    assert (tmp_path / "r.png").stat().st_size > 1000
    assert ("| tiny | 1 | 13.0 | nan | `graphs: off`, `kernels: auto` (node default) | 4.6 | 2.90x | - | 1.2e-07 |"
            in (tmp_path / "r.md").read_text())
