"""Real-time chunking == LeRobot 0.6.1's on a LeRobot checkpoint that carries ``rtc_config``.

The fixture ``test/fixtures/lerobot_rtc`` was computed by LeRobot's own ``PI05Policy.predict_action_chunk(batch,
inference_delay=d, prev_chunk_left_over=Y, execution_horizon=E)`` and ``RTCProcessor`` on a tiny pi0.5 that LeRobot
saved and reloaded (QUANTILES, a 120x160 and a 224x224 camera, 7-d state and action, chunk 12, ``rtc_config``
enabled / EXP / max guidance weight 5 / execution horizon 8). Its README says how and what LeRobot does;
``make_lerobot_rtc_fixtures.py`` beside it re-makes it in a side environment. Each case gives Y as LeRobot's own
normalised output of a previous call, sliced from some step on, and varies d, E, the schedule and the weight.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from oxygen_ros.engine.rtc import RTCConfig, RTCPrefix, prefix_weights
from oxygen_ros.policy import Policy, RawObservation, load_policy

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "lerobot_rtc"
META = json.loads((FIXTURE / "inputs.json").read_text())
CASES = {c["name"]: c for c in META["cases"]}
CKPT_RTC = META["rtc_config_in_checkpoint"]
TOL = 1e-4  # normalised units; robot units divided by the QUANTILES scale (q99 - q01) / 2 per dim


@cache
def fixture() -> tuple[Policy, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    torch.set_num_threads(1)
    policy = load_policy(FIXTURE / "checkpoint")  # tokenizer: the recorded relative name, beside checkpoint/
    return (policy, load_file(str(FIXTURE / "inputs.safetensors")),
            load_file(str(FIXTURE / "expected.safetensors")))


def observation(s: int) -> RawObservation:
    _, inputs, _ = fixture()
    return RawObservation({cam: inputs[cam][s].numpy() for cam in META["cameras"]},
                          inputs["observation.state"][s].numpy(), META["tasks"][s])


def robot_scale(policy: Policy) -> np.ndarray:
    stats = policy.spec.action_norm.stats
    return (np.asarray(stats["q99"]) - np.asarray(stats["q01"])) / 2


def case_config(case: dict) -> RTCConfig:
    return RTCConfig(enabled=case["rtc_enabled"], guidance="identity", schedule=case["schedule"].lower(),
                     max_guidance_weight=case["max_guidance_weight"],
                     execution_horizon=CKPT_RTC["execution_horizon"])


def test_checkpoint_with_rtc_config_loads_and_reads_it() -> None:
    policy, _, _ = fixture()
    spec = policy.spec
    assert (spec.framework, spec.camera_slots, spec.chunk_size, spec.action_dims) == (
        "lerobot", ("cam_high", "cam_left_wrist"), 12, 7)
    assert spec.state_norm.mode == spec.action_norm.mode == "quantiles"
    assert spec.rtc == RTCConfig(enabled=True, guidance="identity", schedule="exp", max_guidance_weight=5.0,
                                 execution_horizon=8)


def test_plain_chunks_match_lerobot() -> None:
    """Without a previous chunk: LeRobot's plain chunks, normalised and in robot units."""
    policy, inputs, expected = fixture()
    scale = robot_scale(policy)
    for s in range(META["samples"]):
        raw, noise = observation(s), inputs["noise"][s]
        normalized = policy.infer_normalized(raw, noise)
        assert normalized.shape == (12, 7)
        err = np.abs(np.asarray(normalized) - expected["plain.actions_normalized"][s].numpy()).max()
        assert err <= TOL, (s, err)
        actions = policy.infer(raw, noise)
        err = (np.abs(actions - expected["plain.actions"][s].numpy()) / scale).max()
        assert err <= TOL, (s, err)


@pytest.mark.parametrize("name", list(CASES))
def test_rtc_case_matches_lerobot(name: str) -> None:
    """predict_action_chunk(batch, inference_delay=d, prev_chunk_left_over=Y, execution_horizon=E), case by case."""
    policy, inputs, expected = fixture()
    case = CASES[name]
    noise, raw = inputs["noise"][case["sample"]], observation(case["sample"])
    prefix = None
    if case["prefix"] is not None:
        prefix = RTCPrefix(actions=inputs[case["prefix"]["key"]], delay=case["inference_delay"],
                           execution_horizon=case["execution_horizon"])
    # the checkpoint's own rtc_config where the case used it unchanged, else the case's settings
    config = None if name in ("config_defaults", "no_prefix") else case_config(case)
    normalized = np.asarray(policy.infer_normalized(raw, noise, rtc=prefix, rtc_config=config))
    actions = policy.infer(raw, noise, rtc=prefix, rtc_config=config)
    want_n = expected[f"case.{name}.actions_normalized"].numpy()
    want_a = expected[f"case.{name}.actions"].numpy()
    assert normalized.shape == want_n.shape and actions.shape == want_a.shape
    err_n = np.abs(normalized - want_n).max()
    err_a = (np.abs(actions - want_a) / robot_scale(policy)).max()
    assert err_n <= TOL and err_a <= TOL, f"{name}: max |err| normalised {err_n:.3g}, robot units / scale {err_a:.3g}"
    if not case["guidance_ran"]:  # no previous chunk, or RTC off: exactly today's chunk
        np.testing.assert_array_equal(actions, policy.infer(raw, noise))
        np.testing.assert_array_equal(normalized, np.asarray(policy.infer_normalized(raw, noise)))


def test_rtc_prefix_as_numpy_equals_tensor() -> None:
    policy, inputs, _ = fixture()
    case = CASES["d3_linear"]
    y = inputs[case["prefix"]["key"]]
    raw, noise = observation(case["sample"]), inputs["noise"][case["sample"]]
    got = [policy.infer(raw, noise, rtc=RTCPrefix(actions=a, delay=3, execution_horizon=8),
                        rtc_config=case_config(case)) for a in (y, y.numpy())]
    np.testing.assert_array_equal(got[0], got[1])


def test_prefix_weights_equal_lerobot_per_case() -> None:
    """The weights LeRobot's RTCProcessor used in each case (E already capped at the remainder's length)."""
    _, _, expected = fixture()
    ran = [c for c in META["cases"] if c["guidance_ran"]]
    assert len(ran) >= 15
    for case in ran:
        delay, horizon, total = case["prefix_weights_call"]
        got = prefix_weights(delay, horizon, total, case["schedule"].lower())
        want = expected[f"case.{case['name']}.prefix_weights"]
        assert got.dtype == torch.float32 and torch.equal(got, want), (case["name"], got, want)


def test_prefix_weights_equal_lerobot_on_a_grid() -> None:
    """LeRobot's get_prefix_weights(start, end, 12) for every start 0..13, end 0..14 and schedule, bit for bit."""
    _, _, expected = fixture()
    grid, g = expected["prefix_weights_grid"], META["prefix_weights_grid"]
    for i, schedule in enumerate(g["schedules"]):
        for a, start in enumerate(g["starts"]):
            for b, end in enumerate(g["ends"]):
                got = prefix_weights(start, end, g["total"], schedule.lower())
                assert torch.equal(got, grid[i, a, b]), (schedule, start, end, got, grid[i, a, b])
