"""Write a random-init pi0.5 checkpoint of any config in openpi's (or LeRobot's) format.

    oxygen-make-checkpoint --config tiny --preset libero --out /tmp/ckpt [--tokenizer] [--std 0.3]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from oxygen_ros.engine import Pi05Model, get_config
from oxygen_ros.engine.checkpoint import init_random_weights, save_checkpoint


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
        from oxygen_ros.tools.make_tokenizer import make_test_tokenizer

        make_test_tokenizer(out, vocab_size=cfg.vocab_size)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--preset", default="libero")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layout", choices=["openpi", "lerobot"], default="openpi")
    ap.add_argument("--tokenizer", action="store_true", help="also write a small matching SentencePiece tokenizer")
    ap.add_argument("--std", type=float, default=0.02, help="init scale of the random weights (0.3: varied text)")
    args = ap.parse_args(argv)
    out = make_random_checkpoint(args.out, args.config, args.preset, args.seed, args.layout, args.tokenizer, args.std)
    print(f"wrote {out / 'model.safetensors'}")


if __name__ == "__main__":
    main()
