"""Random-weight pi0.5 checkpoints in our layout, with a matching small tokenizer: what tests, demos and the
node's ``model: random_tiny`` run when no trained model is wanted."""

from __future__ import annotations

from pathlib import Path

import torch

from oxygen_ros.engine import Pi05Model, get_config
from oxygen_ros.engine.checkpoint import init_random_weights, save_checkpoint
from oxygen_ros.engine.small_tokenizer import make_test_tokenizer

__all__ = ["make_random_checkpoint"]


def make_random_checkpoint(out: Path, config: str = "tiny", preset: str | None = "libero", seed: int = 0,
                           layout: str = "openpi", tokenizer: bool = False, std: float = 0.02, **overrides) -> Path:
    """Random weights for ``config`` saved to ``out``; optionally a matching test tokenizer beside them.

    ``std`` is the init scale of the random weights: the default 0.02 keeps activations small (benchmarks, unit
    tests) but makes generated text degenerate (one token repeated); about 0.3 gives varied text (demos).
    ``overrides`` replace config fields after the preset (e.g. ``max_token_len``, ``camera_names``,
    ``action_dim``, ``action_horizon``).
    """
    cfg = get_config(config, preset, **overrides)
    if tokenizer and cfg.vocab_size > 1034:
        raise ValueError("the generated test tokenizer supports vocab_size <= 1034; use a real tokenizer")
    with torch.device("cpu"):
        model = init_random_weights(Pi05Model(cfg), seed=seed, std=std)
    save_checkpoint(model, out, layout=layout)
    if tokenizer:
        make_test_tokenizer(out, vocab_size=cfg.vocab_size)
    return out
