"""Where the shipped default model lives: the toy pi0.5 trained on the tabletop world, package data in
``oxygen_ros/toy/model/`` (checkpoint, tokenizer, norm stats and its card ``README.md``).

It is the node's ``model: toy`` and the closed-loop demo's model. This module is only its path, computed from the
package's own location and importing nothing, so the product (the node's model loading, the doctor) finds its
default checkpoint without importing the toy room.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["TOY_MODEL_DIR", "toy_model_available"]

TOY_MODEL_DIR = Path(__file__).resolve().parents[1] / "toy" / "model"


def toy_model_available() -> bool:
    """Whether the trained toy model's files are present (the card alone ships before training)."""
    return all((TOY_MODEL_DIR / name).is_file() for name in ("model.safetensors", "tokenizer.model",
                                                             "norm_stats.json"))
