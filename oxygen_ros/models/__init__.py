"""Models shipped inside the package.

``toy``: our pi0.5 at toy scale trained on the tabletop world (:mod:`oxygen_ros.world`): checkpoint, tokenizer and
norm stats, the package's default model (the node's ``model: toy``, the closed-loop demo). See ``toy/README.md``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["TOY_MODEL_DIR", "toy_model_available"]

TOY_MODEL_DIR = Path(__file__).resolve().parent / "toy"


def toy_model_available() -> bool:
    """Whether the trained toy model's files are present (the card alone ships before training)."""
    return all((TOY_MODEL_DIR / name).is_file() for name in ("model.safetensors", "tokenizer.model",
                                                             "norm_stats.json"))
