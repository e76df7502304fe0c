"""``oxygen-make-demo-bag``: a deterministic rosbag2 of the synthetic demo scene
(:mod:`oxygen_ros.evaluation.demo_bag`), or bags of the toy tabletop world driven by its expert
(:mod:`oxygen_ros.toy.demo_fleet`), for the bag evaluation and the tests.

    oxygen-make-demo-bag OUT [--duration 10] [--size 224] [--storage mcap] [--compressed]
    oxygen-make-demo-bag OUT --scene tabletop --count 20
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """``oxygen-make-demo-bag``: write the synthetic demo bag, or
    tabletop-world bags (``--scene tabletop [--count N]``) with the expert's commands and the world's language."""
    from oxygen_ros.evaluation.demo_bag import DEFAULT_CAMERAS, DEFAULT_INSTRUCTION, DEFAULT_JOINT_NAMES, make_demo_bag

    p = argparse.ArgumentParser(description="Write a deterministic rosbag2 of the synthetic demo scene (cameras, "
                                            "joint states, instruction) with rosbags; or, with --scene tabletop, "
                                            "episodes of the tabletop world driven by its expert, with the "
                                            "expert's commands on /expert/joint_trajectory and the world's "
                                            "subtask and narration on /annotations/*.")
    p.add_argument("out", type=Path, help="bag directory to create (--count > 1: a directory of bags)")
    p.add_argument("--scene", choices=("synthetic", "tabletop"), default="synthetic")
    p.add_argument("--count", type=int, default=1, help="tabletop: this many bags, one per seed")
    p.add_argument("--duration", type=float, default=10.0, help="synthetic: seconds of bag time (default 10)")
    p.add_argument("--rate", type=float, help="camera and joint-state rate in Hz (default 10; tabletop: its 20 Hz "
                                              "step rate)")
    p.add_argument("--cameras", nargs="+", default=list(DEFAULT_CAMERAS), help="camera names (viewpoints)")
    p.add_argument("--size", type=int, default=224, help="square image size in pixels (default 224)")
    p.add_argument("--instruction", default=DEFAULT_INSTRUCTION)
    p.add_argument("--instruction-period", type=float, default=3.0, help="re-send the instruction every N s")
    p.add_argument("--joint-names", nargs="+", default=list(DEFAULT_JOINT_NAMES))
    p.add_argument("--storage", choices=("mcap", "sqlite3"), default="sqlite3")
    p.add_argument("--topic-fmt", default="/cameras/{name}/image_raw", help="camera topic, {name} = camera")
    p.add_argument("--compressed", action="store_true", help="write jpeg CompressedImage on <topic>/compressed")
    p.add_argument("--seed", type=int, help="scene seed (synthetic default 0; tabletop: the first episode seed, "
                                            "default 1000000, the world's evaluation seeds)")
    p.add_argument("--tail", type=float, default=0.5, help="tabletop: seconds recorded after the episode ends")
    p.add_argument("--overwrite", action="store_true", help="replace an existing bag directory")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.count < 1 or (args.count > 1 and args.scene != "tabletop"):
        p.error("--count: at least 1, and more than 1 only with --scene tabletop")
    if args.out.exists():
        if not args.overwrite:
            p.error(f"{args.out} exists (use --overwrite)")
        from oxygen_ros.evaluation.fleet import find_bags, is_bag

        if is_bag(args.out):
            shutil.rmtree(args.out)
        elif args.count > 1 and args.out.is_dir():
            for bag in find_bags([args.out]):
                shutil.rmtree(bag)
        else:
            p.error(f"{args.out} exists and is not a rosbag2 directory; not removing it")
    progress = False if args.no_progress else None
    if args.scene == "tabletop":
        from oxygen_ros.toy.demo_fleet import FIRST_SEED, make_demo_fleet, make_tabletop_bag

        seed, rate = FIRST_SEED if args.seed is None else args.seed, args.rate or 20.0
        if args.count == 1:
            make_tabletop_bag(args.out, seed, rate, tail_s=args.tail, storage=args.storage)
            print(f"wrote {args.out}")
        else:
            paths = make_demo_fleet(args.out, args.count, seed, step_rate_hz=rate, tail_s=args.tail,
                                    storage=args.storage, progress=progress)
            print(f"wrote {len(paths)} bags to {args.out} (seeds {seed}..{seed + args.count - 1})")
        return 0
    path = make_demo_bag(
        args.out, args.duration, args.rate or 10.0, args.cameras, args.size, args.instruction, args.joint_names,
        args.storage, args.topic_fmt, args.compressed, seed=args.seed or 0,
        instruction_period_s=args.instruction_period, progress=progress,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
