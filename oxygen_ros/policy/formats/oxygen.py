"""This package's own checkpoints: ``config.json`` (``oxygen_ros`` model config), ``model.safetensors``,
``norm_stats.json`` (openpi's format and formulas) and ``tokenizer.model`` side by side.

They follow openpi's conventions (three named camera slots, missing cameras masked in place, PIL resize,
quantile statistics), with one difference the toy models were trained with: the normalised state is clipped to
[-1, 1] before it is discretised into the prompt.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...engine.config import Pi05Config
from ..errors import PolicyConfigError
from ..spec import PolicySpec
from . import SpecOptions
from .common import find_tokenizer
from .openpi import read_norm_stats

__all__ = ["NORM_STATS_NAME", "read_oxygen"]

NORM_STATS_NAME = "norm_stats.json"


def read_oxygen(directory: Path, options: SpecOptions, config: Pi05Config,
                generated: bool = False) -> tuple[PolicySpec, dict]:
    """The spec of one of our checkpoints (``generated``: a random model made on the fly, no statistics)."""
    mode = {"auto": "quantiles", "quantile": "quantiles", "mean_std": "mean_std", "none": None}[options.normalization]
    stats_path = directory / NORM_STATS_NAME
    state_norm = action_norm = None
    notes = []
    if mode is not None and options.norm_stats_path:
        stats_path = Path(options.norm_stats_path).expanduser()
    if mode is not None and stats_path.is_file():
        state_norm, action_norm = read_norm_stats(stats_path, mode)
        notes.append(f"norm stats {stats_path} ({mode})")
    elif mode is not None and (options.norm_stats_path or not generated):
        raise PolicyConfigError(f"{stats_path}: missing; set normalization: none to run this checkpoint "
                                "unnormalised on purpose")
    tokenizer = find_tokenizer(Path(options.tokenizer_path) if options.tokenizer_path else None, directory)
    if tokenizer is None:
        raise PolicyConfigError(f"tokenizer_path: not set and no tokenizer.model in {directory}")
    action_dims = action_norm.dim if action_norm is not None else config.action_dim
    n_action_steps = _n_action_steps(directory, config.action_horizon)
    spec = PolicySpec(
        framework="oxygen", checkpoint=directory, camera_slots=tuple(config.camera_names), missing_camera="in_place",
        image_resize="pil_bilinear", image_size=config.vision.image_size,
        state_dim=state_norm.dim if state_norm else None, action_dims=int(action_dims),
        chunk_size=config.action_horizon, n_action_steps=n_action_steps, state_norm=state_norm,
        action_norm=action_norm, state_in_prompt=True, clip_state=True, tokenizer=tokenizer,
        max_token_len=config.max_token_len, time_schedule=config.time_schedule,
        default_cameras=tuple(config.camera_names), notes=tuple(notes))
    return spec, {}


def _n_action_steps(directory: Path, horizon: int) -> int:
    """``config.json``'s ``n_action_steps`` (actions executed per frame, written by training), else the chunk."""
    path = directory / "config.json"
    try:
        value = json.loads(path.read_text()).get("n_action_steps", horizon) if path.is_file() else horizon
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return horizon  # the config reader reports a broken config.json
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= horizon:
        raise PolicyConfigError(f"{path}: n_action_steps {value!r} must be an integer in 1..{horizon} (the chunk)")
    return value
