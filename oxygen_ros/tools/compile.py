"""``oxygen-compile``: build the compiled steps of ``graphs: aot`` into the cache directory once, ahead of the node.

    oxygen-compile --params-file config/libero.yaml /models/pi05_libero [-p name:=value ...]   (what the node loads)
    oxygen-compile /models/pi05_libero --max-inflight 32 --threads 2
    oxygen-compile --config small --preset libero --rtc
    oxygen-compile --config tiny --cache-dir /tmp/compiled --mode isolated

With ``--params-file`` (the node's ROS 2 params YAML, plus ``-p`` overrides and the checkpoint) the engine key is
the node's own: the checkpoint is loaded and reconciled by the node's loader (``load_node_policy``: ``dtype: auto``
resolved per checkpoint, islands included) and the engine configuration built by the node's ``engine_config``
(mode, streams' and questions' prompt lengths, KV pool, real-time chunking), with the node's ``torch_threads`` and
``compile_cache_dir``; only ``graphs`` is set to ``aot``. Nothing is repeated by hand.

Without it: a compiled step depends on the model's sizes, not its weights: ``--config`` (random weights of a named
size) builds the same entries as a checkpoint of that size. The engine settings that shape the steps must then match
the node's: ``max_inflight`` and ``mode`` (the decode buckets), ``num_steps``, real-time chunking, dtype and the
thread count. Entries already there are loaded (and checked), not rebuilt. Prints one line per step and a JSON
summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Sequence

import torch

from oxygen_ros.engine import get_config
from oxygen_ros.engine.backends.precision import PRECISIONS, apply_precision
from oxygen_ros.engine.checkpoint import init_random_weights, load_checkpoint
from oxygen_ros.engine.config import MODEL_CONFIGS, WORKLOAD_PRESETS
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.model import Pi05Model
from oxygen_ros.engine.modes import NODE_MODES
from oxygen_ros.engine.rtc import RTCConfig


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="oxygen-compile", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", nargs="?", help="checkpoint directory (its sizes decide the steps)")
    ap.add_argument("--params-file", action="append", default=[],
                    help="the node's params YAML (repeatable): derive every engine setting as the node does")
    ap.add_argument("-p", dest="overrides", action="append", default=[], metavar="NAME:=VALUE",
                    help="a node parameter over the params files (with --params-file)")
    ap.add_argument("--node-name", default="oxygen", help="whose sections of the params files to read")
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
    ap.add_argument("--dtype", default="float32", choices=sorted(PRECISIONS),
                    help="precision (bfloat16_islands: openpi's mixed bf16); with --params-file the node's dtype")
    ap.add_argument("--threads", type=int, default=0, help="torch threads the node runs with (0 = torch's default)")
    args = ap.parse_args(argv)
    if args.params_file:
        if args.config:
            ap.error("--params-file takes the node's checkpoint (CHECKPOINT or checkpoint_path / model), not --config")
    elif (args.checkpoint is None) == (args.config is None):
        ap.error("give a CHECKPOINT or --config NAME (one of them), or --params-file")
    elif args.overrides:
        ap.error("-p needs --params-file")
    return args


def load_model(args: argparse.Namespace) -> Pi05Model:
    if args.config:
        model = init_random_weights(Pi05Model(get_config(args.config, args.preset)))
    else:
        model = load_checkpoint(args.checkpoint, dtype=torch.float32)
    return apply_precision(model, args.dtype).eval()


def node_engine(args: argparse.Namespace) -> tuple[Pi05Model, EngineConfig, int, list[str]]:
    """The node's model, engine configuration (``graphs: aot``) and torch threads from its params files, and the
    notes its loader logged: through the node's own ``load_node_policy`` / ``engine_config`` / ``rtc_config``."""
    from oxygen_ros.evaluation.cli import parse_overrides, read_params_file
    from oxygen_ros.runtime.model_loader import engine_config, load_node_policy, rtc_config
    from oxygen_ros.runtime.params import validate

    values: dict = {}
    for path in args.params_file:
        values.update(read_params_file(path, args.node_name))
    values.update(parse_overrides(args.overrides))
    if args.checkpoint:
        values["checkpoint_path"] = args.checkpoint
    p = validate(values)
    threads = args.threads or p.torch_threads
    if threads:
        torch.set_num_threads(threads)  # before loading: kernels=auto measures with the node's threads
    loaded = load_node_policy(p)
    try:
        p, policy = loaded.params, loaded.policy
        config = engine_config(p, policy.tokenizer.eos_id, rtc=rtc_config(p, policy))
        config = dataclasses.replace(config, graphs="aot",
                                     compile_cache_dir=args.cache_dir or p.compile_cache_dir or None)
        return policy.model, config, torch.get_num_threads(), list(loaded.notes)
    finally:
        loaded.release()  # a generated model's files (random_tiny); the model stays in memory


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.params_file:
            model, config, _, notes = node_engine(args)
            for note in notes:
                print(f"node: {note}")
        else:
            model = load_model(args)
            config = EngineConfig(mode=args.mode, num_steps=args.num_steps or model.config.num_steps,
                                  max_inflight=args.max_inflight, max_new_tokens=args.max_new_tokens,
                                  max_prompt_tokens=args.max_prompt_tokens, graphs="aot",
                                  rtc=RTCConfig() if args.rtc else None, compile_cache_dir=args.cache_dir or None)
    except (OSError, ValueError) as e:  # PolicyConfigError and ParamError are ValueErrors
        print(f"oxygen-compile: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    engine = build_engine(model, config)
    total = time.perf_counter() - t0
    report = engine.runner.graphs.load_report
    for r in report:
        print(f"{r['step']:>12}  {r['how']:>6}  {r['seconds']:7.1f} s  {r['path']}")
    print(json.dumps({"model": model.config.name, "threads": torch.get_num_threads(), "seconds": total,
                      "dtype": str(model.dtype).removeprefix("torch."), "rounded": model.rounded,
                      "engine": {"mode": config.mode, "num_steps": config.num_steps,
                                 "max_inflight": config.max_inflight, "max_new_tokens": config.max_new_tokens,
                                 "max_prompt_tokens": config.max_prompt_tokens, "speculate": config.speculate,
                                 "rtc": config.rtc is not None and config.rtc.enabled,
                                 "cache_dir": str(engine.runner.graphs.cache_dir or "default")},
                      "steps": report}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
