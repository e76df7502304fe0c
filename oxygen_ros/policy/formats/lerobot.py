"""LeRobot pi05 checkpoints (``PI05Policy.save_pretrained`` + the processors' ``save_pretrained``, LeRobot 0.6).

Read from the files, never assumed: camera slots = the VISUAL ``input_features`` in order plus
``empty_cameras`` placeholders; state dim; action dims kept (``output_features.action.shape``); ``chunk_size`` and
``n_action_steps``; ``image_resolution``; normalisation per feature type from the normaliser steps' ``norm_map``
with their ``eps`` and their statistics files; relative actions from the ``relative_actions_processor`` step;
the tokenizer name and ``max_length`` from the ``tokenizer_processor`` step; observation renames.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from oxygen_ros.engine.rtc import RTCConfig

from ..errors import PolicyConfigError
from ..normalize import STATS_NEEDED
from ..spec import FeatureNorm, PolicySpec
from . import SpecOptions
from .common import as_stats, find_tokenizer, read_json

__all__ = ["IMAGE_PREFIX", "read_lerobot"]

IMAGE_PREFIX = "observation.images."
STATE_KEY = "observation.state"
ACTION_KEY = "action"
_MODES = {"IDENTITY": "identity", "MEAN_STD": "mean_std", "QUANTILES": "quantiles", "QUANTILE10": "quantile10",
          "MIN_MAX": "min_max"}
_PRE_STEPS = {"rename_observations_processor", "to_batch_processor", "relative_actions_processor",
              "normalizer_processor", "pi05_prepare_state_tokenizer_processor_step", "tokenizer_processor",
              "device_processor"}
_POST_STEPS = {"unnormalizer_processor", "absolute_actions_processor", "device_processor"}
# Fields whose non-default value changes inference in ways this package does not implement.
_UNSUPPORTED = {"use_peft": False, "n_obs_steps": 1}


def _steps(path: Path, known: set[str]) -> dict[str, dict]:
    data = read_json(path)
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, list):
        raise PolicyConfigError(f"{path}: field 'steps': expected a list of processor steps")
    out: dict[str, dict] = {}
    for i, step in enumerate(steps):
        name = step.get("registry_name") if isinstance(step, dict) else None
        if name not in known:
            raise PolicyConfigError(f"{path}: steps[{i}].registry_name {name!r} is not supported (known: "
                                    f"{', '.join(sorted(known))})")
        out[name] = step
    return out


def _stats_file(directory: Path, step: dict, where: str) -> dict[str, np.ndarray]:
    name = step.get("state_file")
    if not name:
        return {}
    path = directory / name
    try:
        return load_file(str(path))
    except FileNotFoundError as e:
        raise PolicyConfigError(f"{where}.state_file: {path} does not exist") from e
    except (SafetensorError, OSError, ValueError) as e:
        raise PolicyConfigError(f"{path}: cannot read safetensors statistics ({e})") from e


def _feature_norm(step: dict, flat: dict[str, np.ndarray], key: str, kind: str, where: str, path: Path,
                  normalization: str) -> FeatureNorm | None:
    cfg = step.get("config", {})
    norm_map = cfg.get("norm_map", {})
    raw_mode = norm_map.get(kind, "IDENTITY")
    if raw_mode not in _MODES:
        raise PolicyConfigError(f"{where}.config.norm_map.{kind}: unsupported mode {raw_mode!r}")
    mode = _MODES[raw_mode]
    if mode == "identity":
        return None
    stats = {k[len(key) + 1:]: v for k, v in flat.items() if k.startswith(key + ".")}
    needed = STATS_NEEDED[mode]
    missing = [s for s in needed if s not in stats]
    if missing:
        if normalization == "none":
            return None
        raise PolicyConfigError(
            f"{path}: no {', '.join(f'{key}.{m}' for m in missing)} statistics for {raw_mode} normalisation of "
            f"{key} (LeRobot would silently skip it); set normalization: none to run unnormalised on purpose")
    eps = float(cfg.get("eps", 1e-8))
    arrays = as_stats({s: stats[s] for s in needed}, f"{path}:{key}", dtype=np.float32)
    return FeatureNorm(mode, arrays, "lerobot", eps)


def _resolve_tokenizer(directory: Path, name: str, override: str) -> tuple[Path | None, str]:
    if override:
        found = find_tokenizer(Path(override))
        if found is None:
            raise PolicyConfigError(f"tokenizer_path: no SentencePiece model at {override}")
        return found, f"tokenizer {found} (tokenizer_path)"
    if not name:
        return None, "no tokenizer recorded"
    candidates: list[Path] = []
    if not os.path.isabs(name):  # LeRobot resolves a relative name against the working directory
        candidates += [directory.parent / name, directory / name, Path.cwd() / name]
    else:
        candidates.append(Path(name))
    hub = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
    snapshots = hub / f"models--{name.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir():
        candidates += sorted(snapshots.iterdir())
    found = find_tokenizer(*candidates)
    return found, f"tokenizer {found} (recorded name {name!r})"


def _check_options(cfg: dict, cfg_path: Path, options: SpecOptions) -> None:
    if cfg.get("type") != "pi05":
        raise PolicyConfigError(f"{cfg_path}: field 'type' is {cfg.get('type')!r}; only LeRobot 'pi05' is supported")
    for field, default in _UNSUPPORTED.items():
        if cfg.get(field, default) != default:
            raise PolicyConfigError(f"{cfg_path}: field {field!r} = {cfg[field]!r} is not supported (inference "
                                    f"here assumes {default!r})")
    if options.norm_stats_path:
        raise PolicyConfigError("norm_stats_path: not used for LeRobot checkpoints (their statistics are read from "
                                "the policy_*processor files); leave it empty")
    if options.normalization not in ("auto", "none"):
        raise PolicyConfigError(f"normalization: {options.normalization!r} cannot override a LeRobot checkpoint "
                                "(its normalization_mapping decides); use auto or none")


def _features(cfg: dict, cfg_path: Path) -> tuple[list[str], int | None]:
    """The VISUAL feature keys in order and the state dim; any other input feature is refused."""
    features = cfg.get("input_features")
    if not isinstance(features, dict):
        raise PolicyConfigError(f"{cfg_path}: field 'input_features' missing or not an object")
    cameras: list[str] = []
    state_dim = None
    for key, feat in features.items():
        kind = feat.get("type") if isinstance(feat, dict) else None
        if kind == "VISUAL":
            cameras.append(key)
        elif kind == "STATE" and key == STATE_KEY:
            state_dim = int(np.prod(feat.get("shape", [0])))
        else:
            raise PolicyConfigError(f"{cfg_path}: input_features.{key} (type {kind!r}) is not supported by pi05 "
                                    "inference here (only VISUAL cameras and observation.state)")
    if not cameras:
        raise PolicyConfigError(f"{cfg_path}: input_features has no VISUAL camera")
    return cameras, state_dim


def _chunking(cfg: dict, cfg_path: Path, image_size: int) -> tuple[int, int, int]:
    """(action dims kept, chunk_size, n_action_steps), checked against each other and the model's image size."""
    try:
        action_dims = int(cfg["output_features"][ACTION_KEY]["shape"][0])
        chunk = int(cfg["chunk_size"])
        n_exec = int(cfg.get("n_action_steps", chunk))
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise PolicyConfigError(f"{cfg_path}: missing or malformed field ({e}): need output_features.action.shape, "
                                "chunk_size") from e
    if not 0 < n_exec <= chunk:
        raise PolicyConfigError(f"{cfg_path}: n_action_steps {n_exec} must be in 1..chunk_size ({chunk})")
    res = cfg.get("image_resolution", [224, 224])
    if list(res) != [image_size, image_size]:
        raise PolicyConfigError(f"{cfg_path}: image_resolution {res} != the model's {image_size}x{image_size} "
                                "image input")
    return action_dims, chunk, n_exec


def _processors(directory: Path) -> tuple[dict[str, dict], dict[str, dict], Path, Path]:
    pre_path, post_path = directory / "policy_preprocessor.json", directory / "policy_postprocessor.json"
    for p in (pre_path, post_path):
        if not p.is_file():
            raise PolicyConfigError(f"{p}: missing (LeRobot saves it with the processors; the normalisation "
                                    "statistics are referenced from it)")
    pre, post = _steps(pre_path, _PRE_STEPS), _steps(post_path, _POST_STEPS)
    if "pi05_prepare_state_tokenizer_processor_step" not in pre or "tokenizer_processor" not in pre:
        raise PolicyConfigError(f"{pre_path}: needs the pi05 state/prompt step and the tokenizer step")
    if "normalizer_processor" not in pre or "unnormalizer_processor" not in post:
        missing = pre_path if "normalizer_processor" not in pre else post_path
        raise PolicyConfigError(f"{missing}: no (un)normalizer step")
    return pre, post, pre_path, post_path


def _norms(directory: Path, pre: dict, post: dict, pre_path: Path, post_path: Path,
           normalization: str) -> tuple[FeatureNorm | None, FeatureNorm | None]:
    if normalization == "none":
        return None, None
    norm_step, unnorm_step = pre["normalizer_processor"], post["unnormalizer_processor"]
    state = _feature_norm(norm_step, _stats_file(directory, norm_step, str(pre_path)), STATE_KEY, "STATE",
                          f"{pre_path}:normalizer_processor", directory / str(norm_step.get("state_file")),
                          normalization)
    action = _feature_norm(unnorm_step, _stats_file(directory, unnorm_step, str(post_path)), ACTION_KEY, "ACTION",
                           f"{post_path}:unnormalizer_processor", directory / str(unnorm_step.get("state_file")),
                           normalization)
    return state, action


def _delta_mask(pre: dict, post: dict, where: str, action_dims: int) -> tuple[bool, ...]:
    rel = pre.get("relative_actions_processor", {}).get("config", {})
    absolute = post.get("absolute_actions_processor", {}).get("config", {})
    if not (rel.get("enabled") or absolute.get("enabled")):
        return ()
    if not (rel.get("enabled") and absolute.get("enabled")):
        raise PolicyConfigError(f"{where}: relative_actions_processor and absolute_actions_processor must be "
                                "enabled together")
    return tuple(_relative_mask(action_dims, rel.get("exclude_joints") or [], rel.get("action_names")))


def read_lerobot(directory: Path, options: SpecOptions, model_image_size: int) -> tuple[PolicySpec, dict]:
    """The spec of a LeRobot pi05 checkpoint and the model-config overrides it implies."""
    cfg_path = directory / "config.json"
    cfg: dict[str, Any] = read_json(cfg_path)
    _check_options(cfg, cfg_path, options)
    cameras, state_dim = _features(cfg, cfg_path)
    empty = int(cfg.get("empty_cameras", 0) or 0)
    slots = [k.removeprefix(IMAGE_PREFIX) for k in cameras] + [f"empty_camera_{i}" for i in range(empty)]
    action_dims, chunk, n_exec = _chunking(cfg, cfg_path, model_image_size)
    pre, post, pre_path, post_path = _processors(directory)
    state_norm, action_norm = _norms(directory, pre, post, pre_path, post_path, options.normalization)
    delta_mask = _delta_mask(pre, post, f"{pre_path} / {post_path}", action_dims)
    tok_cfg = pre["tokenizer_processor"].get("config", {})
    tokenizer, tok_note = _resolve_tokenizer(directory, str(tok_cfg.get("tokenizer_name", "")),
                                             options.tokenizer_path)
    if tokenizer is None:
        raise PolicyConfigError(f"{pre_path}: tokenizer_processor.config.tokenizer_name "
                                f"{tok_cfg.get('tokenizer_name')!r} is not available locally; set tokenizer_path to "
                                "PaliGemma's SentencePiece tokenizer.model")
    rename = pre.get("rename_observations_processor", {}).get("config", {}).get("rename_map", {}) or {}
    dtype = cfg.get("dtype", "float32")
    if dtype not in ("float32", "bfloat16"):  # PI05Config.__post_init__ accepts only these
        raise PolicyConfigError(f"{cfg_path}: field 'dtype' is {dtype!r}; LeRobot pi05 runs float32 or bfloat16")
    spec = PolicySpec(
        framework="lerobot", checkpoint=directory, camera_slots=tuple(slots), missing_camera="append",
        image_resize="torch_bilinear", image_size=model_image_size, state_dim=state_dim, action_dims=action_dims,
        chunk_size=chunk, n_action_steps=n_exec, state_norm=state_norm, action_norm=action_norm,
        state_in_prompt=True, clip_state=False, delta_mask=delta_mask, tokenizer=tokenizer,
        max_token_len=int(tok_cfg.get("max_length", cfg.get("tokenizer_max_length", 200))), time_schedule="exact",
        default_cameras=tuple(k.removeprefix(IMAGE_PREFIX) for k in cameras),
        rename_map={str(k): str(v) for k, v in rename.items()}, rtc=_rtc_config(cfg.get("rtc_config"), cfg_path),
        checkpoint_dtype=dtype,
        notes=(f"{cfg_path}: {len(cameras)} cameras + {empty} empty, chunk {chunk} / execute {n_exec}", tok_note))
    overrides = {"camera_names": tuple(slots), "action_horizon": chunk, "max_token_len": spec.max_token_len,
                 "num_steps": int(cfg.get("num_inference_steps", 10)), "time_schedule": "exact"}
    return spec, overrides


def _rtc_config(raw: Any, cfg_path: Path) -> RTCConfig | None:
    """LeRobot's ``RTCConfig`` (``predict_action_chunk`` guidance; J = identity, as LeRobot computes it)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise PolicyConfigError(f"{cfg_path}: field 'rtc_config': expected an object or null, got {raw!r}")
    try:
        return RTCConfig(enabled=bool(raw.get("enabled", True)), guidance="identity",
                         schedule=str(raw.get("prefix_attention_schedule", "LINEAR")).lower(),
                         max_guidance_weight=float(raw.get("max_guidance_weight", 10.0)),
                         execution_horizon=int(raw.get("execution_horizon", 10)))
    except (TypeError, ValueError) as e:
        raise PolicyConfigError(f"{cfg_path}: field 'rtc_config': {e}") from e


def _relative_mask(action_dim: int, exclude: list[str], names: list[str] | None) -> list[bool]:
    """LeRobot's ``RelativeActionsProcessorStep._build_mask``: dims whose name contains an excluded token stay
    absolute; without names every dim is relative."""
    tokens = [str(n).lower() for n in exclude if n]
    if not tokens or names is None:
        return [True] * action_dim
    mask = [not any(t == str(n).lower() or t in str(n).lower() for t in tokens) for n in names[:action_dim]]
    return mask + [True] * (action_dim - len(mask))
