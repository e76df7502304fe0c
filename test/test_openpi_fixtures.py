"""Our policy layer == openpi's ``Policy.infer`` on tiny pi0.5 checkpoints saved in openpi's PyTorch layout.

The fixtures in ``test/fixtures/openpi/pi05_{libero,droid,aloha}`` were computed by openpi's own code
(``create_trained_policy`` + ``infer`` with the real train configs, commit 15a9616, fp32); their README says how,
and ``make_openpi_fixtures.py`` beside them re-makes them in a side environment. Raw inputs are openpi client
observations; a robot maps its cameras to openpi's slots as the data transforms do (LiberoInputs, DroidInputs,
AlohaInputs).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import eager_stages, made_on_this_host
from safetensors.torch import load_file

from oxygen_ros.engine.backends.packed_linear import packed_available
from oxygen_ros.policy import RawObservation, SpecOptions, load_policy

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "openpi"


def libero(obs: dict) -> tuple[dict, np.ndarray]:
    return {"base_0_rgb": obs["observation/image"], "left_wrist_0_rgb": obs["observation/wrist_image"]}, \
        obs["observation/state"]


def droid(obs: dict) -> tuple[dict, np.ndarray]:
    state = np.concatenate([obs["observation/joint_position"], obs["observation/gripper_position"]])
    return {"base_0_rgb": obs["observation/exterior_image_1_left"],
            "left_wrist_0_rgb": obs["observation/wrist_image_left"]}, state


def aloha(obs: dict) -> tuple[dict, np.ndarray]:
    slots = {"base_0_rgb": "images/cam_high", "left_wrist_0_rgb": "images/cam_left_wrist",
             "right_wrist_0_rgb": "images/cam_right_wrist"}  # cam_low is not used by openpi's AlohaInputs
    return {slot: obs[key] for slot, key in slots.items() if key in obs}, obs["state"]


ROBOTS = {"pi05_libero": libero, "pi05_droid": droid, "pi05_aloha": aloha}


@pytest.mark.parametrize("name", sorted(ROBOTS))
def test_actions_equal_openpi_policy_infer(name: str) -> None:
    root = FIXTURES / name
    torch.set_num_threads(1)
    policy = load_policy(root / "checkpoint", SpecOptions(tokenizer_path=str(root / "tokenizer")))
    assert policy.spec.framework == "openpi" and name in policy.spec.notes[0]
    inputs = load_file(str(root / "inputs.safetensors"))
    expected = load_file(str(root / "expected.safetensors"))
    meta = json.loads((root / "inputs.json").read_text())
    for s in range(meta["samples"]):
        obs = {k.split("/", 1)[1]: v.numpy() for k, v in inputs.items() if k.startswith(f"s{s}/")}
        images, state = ROBOTS[name](obs)
        raw = RawObservation(images, state, meta["prompts"][s])
        prepared = policy.prepare(raw)
        n = prepared.prompt_tokens
        e = {k.split("/", 1)[1]: v for k, v in expected.items() if k.startswith(f"s{s}/")}
        assert torch.equal(prepared.observation.tokens[0], e["tokenized_prompt"][:n])
        assert not e["tokenized_prompt_mask"][n:].any()
        assert prepared.observation.image_masks[0].tolist() == e["image_mask"].tolist()
        for i, slot in enumerate(policy.spec.camera_slots):
            if f"image/{slot}" in e:
                fed = e[f"image/{slot}"].permute(2, 0, 1).float() / 255.0 * 2.0 - 1.0
                assert torch.equal(prepared.observation.images[0, i], fed), (s, slot)
        np.testing.assert_array_equal(prepared.normalized_state, e["state_normalized"].numpy())
        actions = policy.infer(raw, obs["noise"])
        want = e["actions"].numpy()
        assert actions.shape == want.shape
        np.testing.assert_allclose(actions, want, rtol=0, atol=1e-4)
        np.testing.assert_allclose(actions, want, rtol=0, atol=1e-5 * max(1.0, np.abs(want).max()))
    assert policy.model.denoise_times(10) == e["denoise_times"].tolist()


# ------------------------------------------------------------------------------------------ openpi's mixed bf16
def bf16_reference(root: Path) -> tuple[Path, bool]:
    """openpi's bf16 results for this host: the ``expected_bf16[.HOST].safetensors`` whose json's ``host`` is this
    machine (ours must then equal it bit for bit) and True; else the primary ``expected_bf16.safetensors`` (made on
    an Intel Xeon with AMX) and False. ``expected_bf16.amd_epyc.*`` was made by the same generator
    (``--bf16-only``) on the AMD EPYC (avx512_bf16) hosts."""
    for meta in [root / "expected_bf16.json", *sorted(root.glob("expected_bf16.*.json"))]:
        if made_on_this_host(json.loads(meta.read_text())["host"]):
            return meta.with_suffix(".safetensors"), True
    return root / "expected_bf16.safetensors", False


@pytest.mark.parametrize("name", sorted(ROBOTS))
def test_bfloat16_islands_equal_openpi_bf16_policy_infer(name: str) -> None:
    """``bfloat16_islands`` against openpi's own mixed-bf16 ``Policy.infer`` (``expected_bf16``: the same checkpoint,
    inputs and noise), eager, fused and through the engine's static graphs. On the host that made the fixture
    (:func:`bf16_reference`) they are bit-identical; elsewhere the tolerance is twice our measured bf16 noise floor
    (``noise_floor_bf16.json``: the largest move of our actions when only the order of reductions changes, e.g.
    another CPU's GEMM kernels), tight enough to tell openpi's float32 result from its bf16 one. Everywhere the fused
    path keeps openpi's padded prefill layout by default and equals our eager reference bit for bit (the compacted
    layout does not: it changes the bf16 reductions' lengths)."""
    from oxygen_ros.engine.engine import EngineConfig, build_engine
    from oxygen_ros.engine.requests import Frame

    root = FIXTURES / name
    torch.set_num_threads(1)
    policy = load_policy(root / "checkpoint", SpecOptions(tokenizer_path=str(root / "tokenizer")),
                         precision="bfloat16_islands")
    model = policy.model
    assert model.rounded and model.input_dtype == torch.float32 and model.rope_freq_dtype == torch.bfloat16
    assert not model.compacts() and model.compacts("compact")  # openpi's padded layout unless asked otherwise
    reference, exact = bf16_reference(root)
    inputs = load_file(str(root / "inputs.safetensors"))
    e16, e32 = load_file(str(reference)), load_file(str(root / "expected.safetensors"))
    meta = json.loads((root / "inputs.json").read_text())
    floor = json.loads((FIXTURES / "noise_floor_bf16.json").read_text())["fixtures"][name]["noise_floor"]
    tolerance = 2 * floor
    gap = max(float((e16[f"s{s}/actions"] - e32[f"s{s}/actions"]).abs().max()) for s in range(meta["samples"]))
    assert 0 < tolerance < gap, (tolerance, gap)
    engine = build_engine(model, EngineConfig(graphs="static", max_inflight=1, max_new_tokens=4))
    for s in range(meta["samples"]):
        obs = {k.split("/", 1)[1]: v.numpy() for k, v in inputs.items() if k.startswith(f"s{s}/")}
        images, state = ROBOTS[name](obs)
        raw = RawObservation(images, state, meta["prompts"][s])
        want = e16[f"s{s}/actions"].numpy()
        fused = policy.infer(raw, obs["noise"])
        with eager_stages(policy):
            eager = policy.infer(raw, obs["noise"])
        prepared = policy.prepare(raw)
        res = engine.step(Frame(prepared.observation, [], [torch.from_numpy(obs["noise"])[None]]))
        static = policy.postprocess(res.actions[0], prepared)
        np.testing.assert_array_equal(fused, eager, err_msg=f"{name} s{s}: fused (padded) != eager")
        for path, actions in (("eager", eager), ("fused", fused), ("static graphs", static)):
            assert actions.shape == want.shape
            err = np.abs(actions - want).max()
            if exact:
                assert err == 0, f"{name} s{s} {path}: {err:.3g} on the fixture's own host (bit-identical expected)"
            assert err <= tolerance, f"{name} s{s} {path}: {err:.3g} > {tolerance:.3g}"


@pytest.mark.slow
def test_compiled_steps_equal_eager_bit_for_bit_under_islands(tmp_path: Path) -> None:
    """The steps compiled ahead of time (``graphs: aot``, what the node loads after ``oxygen-compile``) give our
    eager ``bfloat16_islands`` actions bit for bit on the LIBERO fixture (a 968-token prefix: Inductor's own mean,
    softmax and layer-norm reductions would move them; ``engine/exact_ops.py`` keeps ATen's), hence openpi's bf16
    actions exactly on the fixture's own host. About two minutes of AOTInductor.

    On a CPU without native bf16 (AVX2 only: oneDNN refuses bf16 there, ``packed_available(torch.bfloat16)`` is
    false) Inductor's bf16 kernels reorder reductions: measured 0.0175 on an AMD EPYC with AVX2, half the fixture's
    bf16 noise floor, so there the bound is twice that floor, as for another host's GEMM kernels."""
    from oxygen_ros.engine.engine import EngineConfig, build_engine
    from oxygen_ros.engine.requests import Frame

    name = "pi05_libero"
    root = FIXTURES / name
    torch.set_num_threads(1)
    policy = load_policy(root / "checkpoint", SpecOptions(tokenizer_path=str(root / "tokenizer")),
                         precision="bfloat16_islands")
    engine = build_engine(policy.model, EngineConfig(graphs="aot", graph_stages="all", max_inflight=1,
                                                     max_new_tokens=4, compile_cache_dir=str(tmp_path)))
    assert engine.graphs_backend == "aot"
    reference, exact = bf16_reference(root)
    native_bf16 = packed_available(torch.bfloat16)
    tolerance = 2 * json.loads((FIXTURES / "noise_floor_bf16.json").read_text())["fixtures"][name]["noise_floor"]
    inputs, e16 = load_file(str(root / "inputs.safetensors")), load_file(str(reference))
    meta = json.loads((root / "inputs.json").read_text())
    for s in range(meta["samples"]):
        obs = {k.split("/", 1)[1]: v.numpy() for k, v in inputs.items() if k.startswith(f"s{s}/")}
        images, state = ROBOTS[name](obs)
        raw = RawObservation(images, state, meta["prompts"][s])
        with eager_stages(policy):
            eager = policy.infer(raw, obs["noise"])
        prepared = policy.prepare(raw)
        res = engine.step(Frame(prepared.observation, [], [torch.from_numpy(obs["noise"])[None]]))
        compiled = policy.postprocess(res.actions[0], prepared)
        if native_bf16:
            np.testing.assert_array_equal(compiled, eager, err_msg=f"{name} s{s}: aot != eager")
        else:
            err = float(np.abs(compiled - eager).max())
            assert err <= tolerance, f"{name} s{s}: aot vs eager {err:.3g} > {tolerance:.3g} (this CPU has no bf16)"
        if exact and native_bf16:
            np.testing.assert_array_equal(compiled, e16[f"s{s}/actions"].numpy())
