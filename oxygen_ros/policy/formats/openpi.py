"""openpi PyTorch checkpoints (``examples/convert_jax_model_to_pytorch.py`` output) and openpi's data transforms.

The directory holds ``model.safetensors``, the converter's ``config.json`` (``action_dim``, ``action_horizon``,
variants, precision) and ``assets/<asset_id>/norm_stats.json``. What openpi keeps in its train config (the robot's
data transforms) is chosen by ``openpi_config`` or known from the asset id (:data:`OPENPI_CONFIGS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import PolicyConfigError
from ..spec import FeatureNorm, PolicySpec
from . import SpecOptions
from .common import as_stats, find_tokenizer, read_json

__all__ = ["OPENPI_CONFIGS", "OpenpiConfig", "find_assets", "read_norm_stats", "read_openpi"]

OPENPI_SLOTS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")


@dataclass(frozen=True)
class OpenpiConfig:
    """The parts of an openpi train config that shape inference (``training/config.py``, ``policies/*``)."""

    name: str
    asset_id: str | None
    state_in_prompt: bool  # Pi0Config.discrete_state_input
    action_dims: int | None  # the data config's output cut; None = the action statistics' length
    delta_mask: tuple[bool, ...] = ()
    adapter: str = "none"
    horizon: int | None = None
    cameras: tuple[str, ...] = ("base_0_rgb", "left_wrist_0_rgb")  # slots the robot feeds


def _bool_mask(*dims: int) -> tuple[bool, ...]:
    """openpi's ``make_bool_mask``: +n = n True, -n = n False."""
    return tuple(d > 0 for d in dims for _ in range(abs(d)))


OPENPI_CONFIGS = {c.name: c for c in (
    OpenpiConfig("pi05_libero", "physical-intelligence/libero", False, 7, horizon=10),
    OpenpiConfig("pi05_droid", "droid", True, 8, horizon=15),
    OpenpiConfig("pi05_aloha", "trossen", True, 14, _bool_mask(6, -1, 6, -1), "aloha", horizon=50,
                 cameras=("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")),
    OpenpiConfig("generic", None, True, None, cameras=("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")),
)}


def find_assets(directory: Path) -> list[str]:
    """Asset ids = folders under ``assets/`` holding a norm_stats.json (ids may be nested, e.g. org/name)."""
    root = directory / "assets"
    if not root.is_dir():
        return []
    return sorted(str(p.parent.relative_to(root)) for p in root.rglob("norm_stats.json"))


def _norm(path: Path, stats: dict, key: str, mode: str) -> FeatureNorm:
    if key not in stats or not isinstance(stats[key], dict):
        raise PolicyConfigError(f"{path}: field 'norm_stats.{key}' missing")
    arrays = as_stats(stats[key], f"{path}:norm_stats.{key}")
    needed = ("q01", "q99") if mode == "quantiles" else ("mean", "std")
    missing = [n for n in needed if n not in arrays]
    if missing:
        raise PolicyConfigError(f"{path}: norm_stats.{key} lacks {missing} needed for {mode} normalisation")
    return FeatureNorm(mode, {n: arrays[n] for n in needed}, "openpi", 1e-6)


def read_norm_stats(path: Path, mode: str) -> tuple[FeatureNorm | None, FeatureNorm]:
    """State and action normalisation from an openpi ``norm_stats.json`` (``{"norm_stats": {"state", "actions"}}``,
    the top-level key optional). Without ``state`` the state passes unnormalised, as openpi's Normalize does."""
    if not path.is_file():
        raise PolicyConfigError(f"{path}: norm stats file does not exist")
    data = read_json(path)
    stats = data.get("norm_stats", data) if isinstance(data, dict) else None
    if not isinstance(stats, dict):
        raise PolicyConfigError(f"{path}: expected {{'norm_stats': {{'state': ..., 'actions': ...}}}}")
    state = _norm(path, stats, "state", mode) if "state" in stats else None
    return state, _norm(path, stats, "actions", mode)


def _choose_asset(directory: Path, requested: str) -> str:
    """The asset id: the requested one (must exist), else the only one present, else ''."""
    assets = find_assets(directory)
    if requested and requested not in assets:
        raise PolicyConfigError(f"asset_id: {requested!r} has no {directory}/assets/{requested}/norm_stats.json "
                                f"(found: {assets or 'none'})")
    if not requested and len(assets) > 1:
        raise PolicyConfigError(f"{directory}/assets: several norm stats {assets}; choose one with asset_id")
    return requested or (assets[0] if assets else "")


def _choose_config(requested: str, asset_id: str) -> OpenpiConfig:
    if requested and requested not in OPENPI_CONFIGS:
        raise PolicyConfigError(f"openpi_config: unknown {requested!r}; known: {', '.join(OPENPI_CONFIGS)}")
    name = requested or next((c.name for c in OPENPI_CONFIGS.values() if c.asset_id and c.asset_id == asset_id),
                             "generic")
    return OPENPI_CONFIGS[name]


def _norms(directory: Path, options: SpecOptions, asset_id: str) -> tuple[FeatureNorm | None, FeatureNorm | None,
                                                                          str | None]:
    """State and action normalisation (and a note saying from where), or (None, None, None) for ``none``."""
    if options.normalization == "none":
        return None, None, None
    mode = {"auto": "quantiles", "quantile": "quantiles", "mean_std": "mean_std"}[options.normalization]
    if options.norm_stats_path:
        path = Path(options.norm_stats_path).expanduser()
        return (*read_norm_stats(path, mode), f"norm stats {path} ({mode}, norm_stats_path)")
    if not asset_id:
        raise PolicyConfigError(f"{directory}: no assets/<asset_id>/norm_stats.json (openpi keeps the "
                                "normalisation statistics there); set normalization: none to run unnormalised "
                                "on purpose")
    path = directory / "assets" / asset_id / "norm_stats.json"
    return (*read_norm_stats(path, mode), f"norm stats {path} ({mode})")


def read_openpi(directory: Path, options: SpecOptions, model_image_size: int) -> tuple[PolicySpec, dict]:
    """The spec of an openpi PyTorch checkpoint and the model-config overrides it implies."""
    cfg_path = directory / "config.json"
    cfg = read_json(cfg_path) if cfg_path.is_file() else {}
    asset_id = _choose_asset(directory, options.asset_id)
    preset = _choose_config(options.openpi_config, asset_id)
    notes = [f"openpi data transforms of {preset.name}"
             + ("" if options.openpi_config else f" (from asset id {asset_id!r})")]
    state_norm, action_norm, where = _norms(directory, options, asset_id)
    notes += [where] if where else []
    horizon = cfg.get("action_horizon", preset.horizon)
    if horizon is None:
        raise PolicyConfigError(f"{cfg_path}: field 'action_horizon' missing (the converter writes it) and "
                                f"openpi_config {preset.name} has no default")
    action_dims = preset.action_dims or (action_norm.dim if action_norm else None)
    if action_dims is None:
        raise PolicyConfigError(f"{directory}: cannot tell the action dims (no statistics, generic config); set "
                                "openpi_config")
    tokenizer = find_tokenizer(Path(options.tokenizer_path) if options.tokenizer_path else None, directory,
                               directory / "assets")
    if tokenizer is None:
        raise PolicyConfigError("tokenizer_path: openpi checkpoints do not ship the PaliGemma tokenizer; set "
                                "tokenizer_path to its paligemma_tokenizer.model")
    spec = PolicySpec(
        framework="openpi", checkpoint=directory, camera_slots=OPENPI_SLOTS, missing_camera="in_place",
        image_resize="pil_bilinear", image_size=model_image_size,
        state_dim=state_norm.dim if state_norm else None, action_dims=int(action_dims), chunk_size=int(horizon),
        n_action_steps=int(horizon), state_norm=state_norm, action_norm=action_norm,
        state_in_prompt=preset.state_in_prompt, delta_mask=preset.delta_mask, robot_adapter=preset.adapter,
        tokenizer=tokenizer, max_token_len=200, time_schedule="accumulate", default_cameras=preset.cameras,
        notes=tuple(notes), openpi_config=preset.name)
    overrides = {"camera_names": OPENPI_SLOTS, "action_horizon": int(horizon), "max_token_len": 200,
                 "time_schedule": "accumulate"}
    return spec, overrides
