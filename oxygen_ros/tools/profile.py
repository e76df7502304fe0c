"""Per-stage latency and memory of pi0.5 for a config/device/dtype (calibrates the CPU benchmark configs).

    oxygen-profile --config small --preset libero --batches 1 2 4 8 16 32
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from oxygen_ros.bench.models import add_model_args, resolve_dtype
from oxygen_ros.bench.profile import format_profile, profile_config
from oxygen_ros.engine import get_config


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of ``oxygen-profile``."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="small", help="model config: tiny, small, pi05")
    ap.add_argument("--preset", default="libero", help="workload preset: libero, droid, aloha")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=None, help="valid prompt tokens (default: max_token_len)")
    add_model_args(ap, seed=False)
    ap.add_argument("--lora-rank", type=int, default=0,
                    help="also time decode steps with a random suffix LoRA of this rank on every projection")
    ap.add_argument("--json", default=None, help="also write the result to this JSON file")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """``oxygen-profile``: print the stage costs of the benchmark model (and write them as JSON)."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    res = profile_config(args.config, args.preset, device, resolve_dtype(args.dtype, device), args.batches,
                         args.repeats, prompt_len=args.prompt_len, onednn=not args.no_onednn,
                         lora_rank=args.lora_rank)
    print(format_profile(res, get_config(args.config, args.preset).num_steps, args.lora_rank))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
