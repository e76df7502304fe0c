"""Write a random-init pi0.5 checkpoint of any config in openpi's (or LeRobot's) format.

    oxygen-make-checkpoint --config tiny --preset libero --out /tmp/ckpt [--tokenizer] [--std 0.3]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from oxygen_ros.policy.synthetic import make_random_checkpoint


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
