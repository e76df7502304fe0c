"""Checkpoint directories as their frameworks write them, read into one :class:`~oxygen_ros.policy.spec.PolicySpec`.

``detect_layout`` tells the three apart by their files:

- ``lerobot``: ``config.json`` with ``"type"`` and ``policy_preprocessor.json`` (LeRobot ``save_pretrained``);
- ``oxygen``: ``config.json`` with an ``"oxygen_ros"`` model config (this package's checkpoints);
- ``openpi``: ``model.safetensors`` with the converter's ``config.json`` and/or ``assets/<asset_id>/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import PolicyConfigError
from .common import read_json

__all__ = ["LAYOUTS", "SpecOptions", "detect_layout"]

LAYOUTS = ("oxygen", "openpi", "lerobot")


@dataclass(frozen=True)
class SpecOptions:
    """What a user may (or must) add to what the checkpoint says.

    Attributes:
        tokenizer_path: SentencePiece model (file or directory); '' = the checkpoint's own or its recorded one.
        asset_id: openpi ``assets/<asset_id>``; '' = the only one present.
        openpi_config: openpi train config whose data transforms apply (pi05_libero | pi05_droid | pi05_aloha |
            generic); '' = known from the asset id, else generic.
        normalization: auto (the checkpoint's) | none (explicitly unnormalised) | quantile | mean_std (override
            for openpi and our checkpoints).
        norm_stats_path: an openpi-format norm_stats.json replacing the checkpoint's (openpi and ours only).
    """

    tokenizer_path: str = ""
    asset_id: str = ""
    openpi_config: str = ""
    normalization: str = "auto"
    norm_stats_path: str = ""


def detect_layout(directory: Path) -> str:
    """Which framework wrote ``directory``.

    Raises:
        PolicyConfigError: not a directory, no weights, or none of the known layouts.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise PolicyConfigError(f"checkpoint {directory}: not a directory")
    if not (directory / "model.safetensors").is_file():
        raise PolicyConfigError(f"checkpoint {directory}: no model.safetensors")
    config = directory / "config.json"
    data = read_json(config) if config.is_file() else {}
    if not isinstance(data, dict):
        raise PolicyConfigError(f"{config}: expected a JSON object, got {type(data).__name__}")
    if "oxygen_ros" in data:
        return "oxygen"
    if (directory / "policy_preprocessor.json").is_file() or "type" in data:
        return "lerobot"
    if (directory / "assets").is_dir() or {"action_horizon", "paligemma_variant"} & set(data):
        return "openpi"
    raise PolicyConfigError(
        f"checkpoint {directory}: unknown layout (expected LeRobot's config.json + policy_preprocessor.json, "
        "openpi's config.json / assets/<asset_id>/norm_stats.json, or this package's config.json)")
