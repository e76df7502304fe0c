"""``oxygen-compile``: build the compiled steps of ``graphs: aot`` into the cache directory once, ahead of the node.

    oxygen-compile /models/pi05_libero --max-inflight 32 --threads 2
    oxygen-compile --config small --preset libero --rtc
    oxygen-compile --config tiny --cache-dir /tmp/compiled --mode isolated

A compiled step depends on the model's sizes, not its weights: ``--config`` (random weights of a named size) builds
the same entries as a checkpoint of that size. The engine settings that shape the steps must match the node's:
``max_inflight`` and ``mode`` (the decode buckets), ``num_steps``, real-time chunking, dtype and the thread count.
Entries already there are loaded (and checked), not rebuilt. Prints one line per step and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence

import torch

from oxygen_ros.engine import get_config
from oxygen_ros.engine.checkpoint import init_random_weights, load_checkpoint
from oxygen_ros.engine.config import DTYPES, MODEL_CONFIGS, WORKLOAD_PRESETS
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.model import Pi05Model
from oxygen_ros.engine.modes import NODE_MODES
from oxygen_ros.engine.rtc import RTCConfig


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="oxygen-compile", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", nargs="?", help="checkpoint directory (its sizes decide the steps)")
    ap.add_argument("--config", choices=sorted(MODEL_CONFIGS), help="a named model size instead of a checkpoint")
    ap.add_argument("--preset", choices=sorted(WORKLOAD_PRESETS), help="workload preset of --config")
    ap.add_argument("--cache-dir", default="", help="the node's compile_cache_dir ('' = the XDG default)")
    ap.add_argument("--mode", default="oxygen", choices=NODE_MODES)
    ap.add_argument("--max-inflight", type=int, default=32)
    ap.add_argument("--num-steps", type=int, default=0, help="0 = the model's")
    ap.add_argument("--max-new-tokens", type=int, default=30)
    ap.add_argument("--max-prompt-tokens", type=int, default=48,
                    help="the node's max(max_prompt_tokens, ask.max_prompt_tokens) (ask on: 48)")
    ap.add_argument("--rtc", action="store_true", help="also the real-time-chunking (identity) denoise")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--threads", type=int, default=0, help="torch threads the node runs with (0 = torch's default)")
    args = ap.parse_args(argv)
    if (args.checkpoint is None) == (args.config is None):
        ap.error("give a CHECKPOINT or --config NAME (one of them)")
    return args


def load_model(args: argparse.Namespace) -> Pi05Model:
    dtype = DTYPES[args.dtype]
    if args.config:
        model = init_random_weights(Pi05Model(get_config(args.config, args.preset)))
        return model.to(dtype=dtype).eval()
    return load_checkpoint(args.checkpoint, dtype=dtype)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        model = load_model(args)
    except (OSError, ValueError) as e:
        print(f"oxygen-compile: {e}", file=sys.stderr)
        return 2
    config = EngineConfig(mode=args.mode, num_steps=args.num_steps or model.config.num_steps,
                          max_inflight=args.max_inflight, max_new_tokens=args.max_new_tokens,
                          max_prompt_tokens=args.max_prompt_tokens, graphs="aot",
                          rtc=RTCConfig() if args.rtc else None, compile_cache_dir=args.cache_dir or None)
    t0 = time.perf_counter()
    engine = build_engine(model, config)
    total = time.perf_counter() - t0
    report = engine.runner.graphs.load_report
    for r in report:
        print(f"{r['step']:>12}  {r['how']:>6}  {r['seconds']:7.1f} s  {r['path']}")
    print(json.dumps({"model": model.config.name, "threads": torch.get_num_threads(), "seconds": total,
                      "steps": report}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
