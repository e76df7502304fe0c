"""``dtype: auto`` follows the checkpoint (openpi -> bf16 islands everywhere, LeRobot -> its config.json dtype with
LeRobot's own casts, ours -> by device), an explicit dtype wins, and the loaders of the node, ``evaluate_bag`` and
``oxygen-serve`` all report which precision runs and why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_model
from safetensors.torch import load_file

from oxygen_ros.engine.backends.precision import (
    apply_precision,
    exact_islands,
    float32_modules,
    lerobot_float32_modules,
)
from oxygen_ros.policy import RawObservation, SpecOptions, load_policy
from oxygen_ros.policy.device import choose_precision

OPENPI = Path(__file__).resolve().parent / "fixtures" / "openpi"
LEROBOT_DEV = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "lerobot_pi05_dev"
needs_lerobot_dev = pytest.mark.skipif(not LEROBOT_DEV.is_dir(), reason=f"no LeRobot fixture at {LEROBOT_DEV}")
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize(("device", "framework", "ckpt_dtype", "want", "why"), [
    (CPU, "openpi", "", "bfloat16_islands", "openpi"),
    (CUDA, "openpi", "", "bfloat16_islands", "openpi"),
    (CPU, "lerobot", "float32", "float32", "config.json dtype float32"),
    (CUDA, "lerobot", "float32", "float32", "config.json dtype float32"),
    (CPU, "lerobot", "bfloat16", "bfloat16_lerobot", "config.json dtype bfloat16"),
    (CUDA, "lerobot", "bfloat16", "bfloat16_lerobot", "config.json dtype bfloat16"),
    (CPU, "oxygen", "", "float32", "own checkpoint on cpu"),
    (CUDA, "oxygen", "", "bfloat16_islands", "own checkpoint on cuda"),
    (torch.device("mps"), "oxygen", "", "float32", "own checkpoint on mps"),
])
def test_auto_follows_the_checkpoint(device, framework, ckpt_dtype, want, why) -> None:
    choice = choose_precision(device, "auto", framework, ckpt_dtype)
    assert choice.precision == want and why in choice.reason
    assert choice.describe() == f"{want} ({choice.reason})"
    explicit = choose_precision(device, "float32", framework, ckpt_dtype)  # an explicit dtype always wins
    assert (explicit.precision, explicit.reason) == ("float32", "dtype parameter")
    with pytest.raises(ValueError, match="dtype must be"):
        choose_precision(device, "bfloat17", framework)


def test_lerobot_casts_keep_the_vision_path_and_norms_exact_float32() -> None:
    """LeRobot's ``to_bfloat16_for_selected_params``: vision tower, projector, every norm (adaRMS dense too) and the
    action / time projections in float32 with the checkpoint's exact values (it loads after casting); the rest
    bf16. openpi's islands differ: bf16 SigLIP, bf16-rounded norms."""
    original = make_model().state_dict()
    model = apply_precision(make_model(), "bfloat16_lerobot")
    keep = {id(p) for m in lerobot_float32_modules(model) for p in m.parameters()}
    for name, p in model.named_parameters():
        if id(p) in keep:
            assert p.dtype == torch.float32 and torch.equal(p, original[name]), name
        else:
            assert p.dtype == torch.bfloat16, name
    names = [n for n, p in model.named_parameters() if id(p) in keep]
    for part in ("vision_tower.vision_model.encoder", "multi_modal_projector", "input_layernorm.dense",
                 "language_model.norm", "time_mlp_in", "action_out_proj"):
        assert any(part in n for n in names), part
    assert not any("embed_tokens" in n or "language_model.layers.0.self_attn.q_proj" in n for n in names)
    assert model.rounded and model.dtype == torch.bfloat16 and model.input_dtype == torch.float32
    islands = apply_precision(make_model(), "bfloat16_islands")
    assert {id(m) for m in exact_islands(islands)} <= {id(m) for m in float32_modules(islands, "bfloat16_islands")}
    siglip = islands.paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers[0]
    assert siglip.mlp.fc1.weight.dtype == torch.bfloat16  # openpi runs SigLIP in bf16, LeRobot in fp32
    # the float32 image features enter the bf16 backbone rounded once
    obs_images = torch.rand(1, model.config.num_cameras, 3, model.config.vision.image_size,
                            model.config.vision.image_size) * 2 - 1
    assert model.embed_images(obs_images).dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["pi05_libero", "pi05_droid"])
def test_openpi_checkpoint_auto_runs_openpis_bf16(name: str) -> None:
    """On this CPU too: ``auto`` gives openpi's bf16 actions (within the bf16 noise floor), not its float32 ones."""
    root = OPENPI / name
    torch.set_num_threads(1)
    policy = load_policy(root / "checkpoint", SpecOptions(tokenizer_path=str(root / "tokenizer")), precision="auto")
    assert policy.precision.precision == "bfloat16_islands" and "openpi" in policy.precision.reason
    assert not policy.model.compacts()  # islands: openpi's padded prefill layout by default
    inputs, e16 = load_file(str(root / "inputs.safetensors")), load_file(str(root / "expected_bf16.safetensors"))
    e32 = load_file(str(root / "expected.safetensors"))
    meta = json.loads((root / "inputs.json").read_text())
    floor = json.loads((OPENPI / "noise_floor_bf16.json").read_text())["fixtures"][name]["noise_floor"]
    from test_openpi_fixtures import ROBOTS

    obs = {k.split("/", 1)[1]: v.numpy() for k, v in inputs.items() if k.startswith("s0/")}
    images, state = ROBOTS[name](obs)
    actions = policy.infer(RawObservation(images, state, meta["prompts"][0]), obs["noise"])
    to16, to32 = np.abs(actions - e16["s0/actions"].numpy()).max(), np.abs(actions - e32["s0/actions"].numpy()).max()
    assert to16 <= 2 * floor and to16 < 0.5 * to32, (to16, to32)  # openpi's bf16, clearly not its float32
    explicit = load_policy(root / "checkpoint", SpecOptions(tokenizer_path=str(root / "tokenizer")),
                           precision="float32")
    assert explicit.precision.precision == "float32" and explicit.model.dtype == torch.float32


def _lerobot_copy(tmp_path: Path, dtype: str) -> Path:
    ckpt = tmp_path / "checkpoint"
    shutil.copytree(LEROBOT_DEV / "checkpoint", ckpt)
    shutil.copytree(LEROBOT_DEV / "tokenizer", tmp_path / "tokenizer")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["dtype"] = dtype
    (ckpt / "config.json").write_text(json.dumps(cfg))
    return ckpt


@needs_lerobot_dev
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lerobot_checkpoint_auto_follows_its_config_dtype(dtype: str, tmp_path: Path) -> None:
    """config.json ``dtype`` float32 -> float32 (LeRobot's numbers to 1e-4); bfloat16 -> LeRobot's casts, whose
    actions move by bf16 rounding only (LeRobot's own bf16 chunks, bit for bit: test_lerobot_bf16.py)."""
    torch.set_num_threads(1)
    ckpt = _lerobot_copy(tmp_path, dtype)
    policy = load_policy(ckpt, SpecOptions(tokenizer_path=str(tmp_path / "tokenizer")), precision="auto")
    want = "float32" if dtype == "float32" else "bfloat16_lerobot"
    assert policy.precision.precision == want and f"config.json dtype {dtype}" in policy.precision.reason
    inputs = load_file(str(LEROBOT_DEV / "inputs.safetensors"))
    expected = load_file(str(LEROBOT_DEV / "expected.safetensors"))
    meta = json.loads((LEROBOT_DEV / "inputs.json").read_text())
    images = {c: inputs[c][meta["cameras"][c]["rows_for_samples"].index(0)].numpy() for c in meta["sample_cameras"][0]}
    actions = policy.infer(RawObservation(images, inputs["observation.state"][0].numpy(), meta["tasks"][0]),
                           inputs["noise"][0])
    err = (np.abs(actions - expected["actions"][0].numpy()) / policy.spec.action_norm.stats["std"]).max()
    if dtype == "float32":
        assert err <= 1e-4
    else:
        assert 1e-4 < err < 0.5, err  # bf16 moved it, by rounding only
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["dtype"] = "float16"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    from oxygen_ros.policy.errors import PolicyConfigError

    with pytest.raises(PolicyConfigError, match="field 'dtype'"):
        load_policy(ckpt, SpecOptions(tokenizer_path=str(tmp_path / "tokenizer")), precision="auto")


def test_the_node_and_evaluate_bag_loaders_report_the_choice() -> None:
    """``load_node_policy`` (the node's and ``evaluate_bag``'s loader): the choice and its reason in the notes."""
    from oxygen_ros.runtime.model_loader import load_node_policy
    from oxygen_ros.runtime.params import validate

    root = OPENPI / "pi05_libero"
    joints = [f"j{i}" for i in range(8)]
    base = {"checkpoint_path": str(root / "checkpoint"), "tokenizer_path": str(root / "tokenizer"),
            "device": "cpu", "joint_names": joints}
    for dtype, want in (("auto", "bfloat16_islands (openpi checkpoint"), ("float32", "float32 (dtype parameter)")):
        loaded = load_node_policy(validate({**base, "dtype": dtype}))
        try:
            assert any(n.startswith(f"precision {want}") for n in loaded.notes), loaded.notes
        finally:
            loaded.release()
    loaded = load_node_policy(validate({"model": "random_tiny", "device": "cpu", "joint_names": joints}))
    try:
        assert loaded.policy.precision.describe() == "float32 (own checkpoint on cpu)"
    finally:
        loaded.release()
