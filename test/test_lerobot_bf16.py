"""A LeRobot checkpoint whose config.json says ``dtype: bfloat16``: ``dtype: auto`` picks ``bfloat16_lerobot``, and
its chunks are LeRobot 0.6.1's own bf16 chunks (``test/fixtures/lerobot_bf16``, made by LeRobot itself from the
RTC fixture's checkpoint, inputs and noise), eager, fused and through the engine.

On the host that made the fixture they are equal bit for bit; elsewhere within twice our bf16 noise floor
(``noise_floor.json``), which is below LeRobot's own bf16-vs-fp32 gap, so a float32 result still fails."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from conftest import eager_stages, made_on_this_host
from safetensors.torch import load_file

from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.requests import Frame
from oxygen_ros.policy import load_policy

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "lerobot_bf16"
sys.path.insert(0, str(FIXTURE))
from measure_noise_floor import SOURCE, bf16_checkpoint, observation  # noqa: E402


def test_lerobot_bf16_checkpoint_gives_lerobots_bf16_chunks(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    meta = json.loads((SOURCE / "inputs.json").read_text())
    inputs = load_file(str(SOURCE / "inputs.safetensors"))
    fp32 = load_file(str(SOURCE / "expected.safetensors"))["plain.actions_normalized"]
    want = load_file(str(FIXTURE / "expected_bf16.safetensors"))
    made = json.loads((FIXTURE / "expected_bf16.json").read_text())
    floor = json.loads((FIXTURE / "noise_floor.json").read_text())["noise_floor"]
    exact = made_on_this_host(made["host"])

    policy = load_policy(bf16_checkpoint(tmp_path), precision="auto")
    assert policy.precision.precision == "bfloat16_lerobot" and "config.json dtype bfloat16" in policy.precision.reason
    engine = build_engine(policy.model, EngineConfig(max_inflight=1, max_new_tokens=4))
    stats = policy.spec.action_norm.stats
    scale = (np.asarray(stats["q99"]) - np.asarray(stats["q01"])) / 2
    for s in range(meta["samples"]):
        raw, noise = observation(inputs, meta, s), inputs["noise"][s]
        reference = want["actions_normalized"][s].numpy()
        gap = float(np.abs(reference - fp32[s].numpy()).max())
        tolerance = 2 * floor[s]
        assert 0 < tolerance < gap, (s, tolerance, gap)  # tight enough to tell LeRobot's bf16 from its fp32
        fused = np.asarray(policy.infer_normalized(raw, noise))
        with eager_stages(policy):
            eager = np.asarray(policy.infer_normalized(raw, noise))
        prepared = policy.prepare(raw)
        stepped = engine.step(Frame(prepared.observation, [], [noise.reshape(1, *noise.shape[-2:])])).actions[0]
        stepped = stepped[:, : reference.shape[1]].numpy()
        np.testing.assert_array_equal(fused, eager, err_msg=f"s{s}: fused != eager")
        for path, actions in (("eager", eager), ("fused", fused), ("engine", stepped)):
            err = float(np.abs(actions - reference).max())
            if exact:
                assert err == 0, f"s{s} {path}: {err:.3g} on the fixture's own host (bit-identical expected)"
            assert err <= tolerance, f"s{s} {path}: {err:.3g} > {tolerance:.3g}"
        robot = policy.infer(raw, noise)  # robot units: LeRobot's unnormaliser (QUANTILES) on the same chunk
        err = float((np.abs(robot - want["actions"][s].numpy()) / scale).max())
        assert err == 0 if exact else err <= tolerance, f"s{s} robot units: {err:.3g}"
