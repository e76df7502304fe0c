"""Our side of the openpi side-by-side benchmark (test/fixtures/openpi/vs_openpi.py, beside the fixture generator):
the module imports without openpi, the checkpoint it writes loads in oxygen_ros, and the timed action path returns
the model's own actions."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch
from conftest import assert_plot

from oxygen_ros.engine import get_config
from oxygen_ros.engine.backends.precision import apply_precision
from oxygen_ros.engine.checkpoint import load_checkpoint
from oxygen_ros.policy.synthetic import make_random_checkpoint

# a script of openpi's side environment, not a module of the package: loaded from its file
_SPEC = importlib.util.spec_from_file_location("vs_openpi", Path(__file__).parent / "fixtures/openpi/vs_openpi.py")
vs_openpi = sys.modules["vs_openpi"] = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(vs_openpi)


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
    for variant in ("off", "off:plain", "off:packed", "static", "step/off", "off@compact"):
        stages = {"prefill": [], "denoise": []}
        actions = vs_openpi.ours_runner(load_checkpoint(ckpt), variant, stages)(obs, noise.clone())
        torch.testing.assert_close(actions.reshape(reference.shape), reference, atol=1e-5, rtol=0)
        assert len(stages["prefill"]) == len(stages["denoise"]) == 1
    pobs = vs_openpi.openpi_observation(obs, cfg)
    assert pobs.images["left_wrist_0_rgb"].shape == (1, 3, cfg.vision.image_size, cfg.vision.image_size)
    assert not bool(pobs.image_masks["right_wrist_0_rgb"])
    unmasked, _ = vs_openpi.make_inputs(cfg, setup="unmasked")
    assert unmasked.image_masks.tolist() == [[True, True, True]]
    assert torch.equal(unmasked.images, obs.images) and torch.equal(unmasked.tokens, obs.tokens)


def test_islands_default_is_the_padded_eager_reference(tmp_path):
    """Under --precision bfloat16 our side is the node's default for an openpi checkpoint: bfloat16_islands with the
    padded prefill, bit for bit the eager islands model (which the fixtures prove equal to openpi's bf16)."""
    cfg = get_config("tiny", None, camera_names=vs_openpi.OPENPI_SLOTS, action_dim=32, action_horizon=10)
    ckpt = make_random_checkpoint(tmp_path / "ckpt", "tiny", None, std=0.1, camera_names=vs_openpi.OPENPI_SLOTS,
                                  action_dim=32, action_horizon=10)
    obs, noise = vs_openpi.make_inputs(cfg)
    eager = apply_precision(load_checkpoint(ckpt), "bfloat16_islands").with_stages("eager")
    reference = eager.sample_actions(obs.to(eager.device, eager.input_dtype), noise.clone(), num_steps=10)[0]
    for variant in ("off", "step/off"):
        model = apply_precision(load_checkpoint(ckpt), "bfloat16_islands")
        actions = vs_openpi.ours_runner(model, variant)(obs, noise.clone())
        assert torch.equal(actions.reshape(reference.shape).float(), reference.float()), variant


def test_variant_names():
    assert vs_openpi.parse_variant("off") == ("off", "auto", "auto", False)
    assert vs_openpi.parse_variant("step/off:plain@compact") == ("off", "plain", "compact", True)
    assert vs_openpi.variant_label("oxygen_off") == "`graphs: off`, `kernels: auto` (node default)"
    assert vs_openpi.variant_label("oxygen_off@compact") == (
        "`graphs: off`, `kernels: auto`, `prefill_layout: compact`")
    assert vs_openpi.variant_label("oxygen_step/off").startswith("whole `Engine.step`")


def test_plot_writes_png(tmp_path):
    record = {"config": "tiny", "threads": 1, "openpi_compile_mode": "none",
              "median_ms": {"openpi_eager": 13.0, "oxygen_off": 4.6},
              "paired_median_ratio_openpi_over_ours": {"openpi_eager/oxygen_off": 2.9},
              "max_abs_vs_openpi_eager": {"openpi_eager": 0.0, "oxygen_off": 1.2e-7}}
    (tmp_path / "r.json").write_text(json.dumps(record))
    vs_openpi.main(["plot", str(tmp_path / "r.json"), "--png", str(tmp_path / "r.png"), "--md", str(tmp_path / "r.md")])
    assert_plot(tmp_path / "r.png")
    assert ("| tiny | fp32 | masked | 1 | 13.0 | nan | `graphs: off`, `kernels: auto` (node default) | 4.6 | 2.90x | "
            "- | 1.2e-07 |" in (tmp_path / "r.md").read_text())
    bf16 = dict(record, precision="bfloat16", setup="unmasked", openpi_compile_mode="max-autotune",
                median_ms={"openpi_eager": 30.0, "openpi_compiled": 20.0, "oxygen_off": 10.0},
                paired_median_ratio_openpi_over_ours={"openpi_eager/oxygen_off": 3.0,
                                                      "openpi_compiled/oxygen_off": 2.0},
                max_abs_vs_openpi_eager={"openpi_eager": 0.0, "openpi_compiled": 0.01, "oxygen_off": 0.0})
    (tmp_path / "b.json").write_text(json.dumps(bf16))
    vs_openpi.main(["plot", str(tmp_path / "r.json"), str(tmp_path / "b.json"), "--png", str(tmp_path / "b.png"),
                    "--md", str(tmp_path / "b.md")])
    assert ("| tiny | bf16 (ours: islands) | unmasked | 1 | 30.0 | 20.0 | `graphs: off`, `kernels: auto` "
            "(node default) | 10.0 | 3.00x | **2.00x** | 0 (bit-identical) |" in (tmp_path / "b.md").read_text())
