"""Write small checkpoints laid out exactly as LeRobot 0.6 and openpi's converter save them (for tests)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file as save_numpy

from oxygen_ros.engine import Pi05Model
from oxygen_ros.engine.checkpoint import CONFIG_NAME, save_checkpoint
from oxygen_ros.engine.small_tokenizer import make_test_tokenizer

STAT_NAMES = ("mean", "std", "min", "max", "q01", "q10", "q90", "q99")


def feature_stats(dim: int, seed: int, scale: float = 0.3) -> dict[str, np.ndarray]:
    """Plausible per-dim statistics (float32) of one feature."""
    rng = np.random.default_rng(seed)
    mean = rng.normal(0, 0.5, dim)
    std = rng.uniform(0.5, 1.5, dim) * scale
    out = {"mean": mean, "std": std, "min": mean - 3 * std, "max": mean + 3 * std, "q01": mean - 2.3 * std,
           "q10": mean - 1.3 * std, "q90": mean + 1.3 * std, "q99": mean + 2.3 * std}
    return {k: v.astype(np.float32) for k, v in out.items()}


def write_lerobot(directory: Path, model: Pi05Model, *, cameras: list[str], state_dim: int, action_dim: int,
                  chunk_size: int, n_action_steps: int | None = None, norm: str = "MEAN_STD",
                  relative: bool = False, action_names: list[str] | None = None, empty_cameras: int = 0,
                  tokenizer_name: str = "tokenizer", extra_config: dict | None = None) -> Path:
    """``directory/checkpoint`` as ``PI05Policy.save_pretrained`` + processors write it, tokenizer beside it."""
    ckpt = directory / "checkpoint"
    save_checkpoint(model, ckpt, layout="lerobot")
    feats = {f"observation.images.{c}": {"type": "VISUAL", "shape": [3, 480, 640]} for c in cameras}
    feats["observation.state"] = {"type": "STATE", "shape": [state_dim]}
    cfg = {"type": "pi05", "n_obs_steps": 1, "input_features": feats,
           "output_features": {"action": {"type": "ACTION", "shape": [action_dim]}},
           "paligemma_variant": "gemma_2b", "action_expert_variant": "gemma_300m", "dtype": "float32",
           "chunk_size": chunk_size, "n_action_steps": n_action_steps or chunk_size, "max_state_dim": 32,
           "max_action_dim": 32, "num_inference_steps": 10, "use_relative_actions": relative,
           "relative_exclude_joints": ["gripper"], "rtc_config": None,
           "image_resolution": [model.config.vision.image_size] * 2,
           "empty_cameras": empty_cameras, "tokenizer_max_length": model.config.max_token_len,
           "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": norm, "ACTION": norm}, "use_peft": False}
    cfg.update(extra_config or {})
    (ckpt / CONFIG_NAME).write_text(json.dumps(cfg, indent=2))
    stats = {f"observation.state.{k}": v for k, v in feature_stats(state_dim, 1).items()}
    stats |= {f"action.{k}": v for k, v in feature_stats(action_dim, 2, 0.4).items()}
    save_numpy(stats, str(ckpt / "policy_preprocessor_step_3_normalizer_processor.safetensors"))
    save_numpy({k: v for k, v in stats.items() if k.startswith("action.")},
               str(ckpt / "policy_postprocessor_step_0_unnormalizer_processor.safetensors"))
    norm_map = {"VISUAL": "IDENTITY", "STATE": norm, "ACTION": norm}
    features = {**feats, "action": {"type": "ACTION", "shape": [action_dim]}}
    rel = {"enabled": relative, "exclude_joints": ["gripper"], "action_names": action_names}
    pre = {"name": "policy_preprocessor", "steps": [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "relative_actions_processor", "config": rel},
        {"registry_name": "normalizer_processor", "config": {"eps": 1e-8, "features": features, "norm_map": norm_map},
         "state_file": "policy_preprocessor_step_3_normalizer_processor.safetensors"},
        {"registry_name": "pi05_prepare_state_tokenizer_processor_step", "config": {}},
        {"registry_name": "tokenizer_processor", "config": {
            "max_length": model.config.max_token_len, "task_key": "task", "padding_side": "right",
            "padding": "max_length", "truncation": True, "tokenizer_name": tokenizer_name}},
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}]}
    post = {"name": "policy_postprocessor", "steps": [
        {"registry_name": "unnormalizer_processor", "config": {
            "eps": 1e-8, "features": {"action": {"type": "ACTION", "shape": [action_dim]}}, "norm_map": norm_map},
         "state_file": "policy_postprocessor_step_0_unnormalizer_processor.safetensors"},
        {"registry_name": "absolute_actions_processor", "config": {"enabled": relative}},
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}]}
    (ckpt / "policy_preprocessor.json").write_text(json.dumps(pre, indent=2))
    (ckpt / "policy_postprocessor.json").write_text(json.dumps(post, indent=2))
    make_test_tokenizer(directory / "tokenizer", vocab_size=model.config.vocab_size)
    return ckpt


def write_openpi(directory: Path, model: Pi05Model, *, state_dim: int, action_dim: int, horizon: int,
                 asset_ids: tuple[str, ...] = ("droid",), tokenizer: bool = True) -> Path:
    """An openpi PyTorch checkpoint as the converter writes it (+ a test tokenizer, which openpi does not ship)."""
    save_checkpoint(model, directory, layout="openpi")
    (directory / CONFIG_NAME).write_text(json.dumps({
        "action_dim": model.config.action_dim, "action_horizon": horizon, "paligemma_variant": "gemma_2b",
        "action_expert_variant": "gemma_300m", "precision": "float32"}))
    for i, asset in enumerate(asset_ids):
        s, a = feature_stats(state_dim, 10 + i), feature_stats(action_dim, 20 + i)
        stats = {"norm_stats": {"state": {k: s[k].tolist() for k in ("mean", "std", "q01", "q99")},
                                "actions": {k: a[k].tolist() for k in ("mean", "std", "q01", "q99")}}}
        (directory / "assets" / asset).mkdir(parents=True, exist_ok=True)
        (directory / "assets" / asset / "norm_stats.json").write_text(json.dumps(stats))
    if tokenizer:
        make_test_tokenizer(directory, vocab_size=model.config.vocab_size)
    return directory
