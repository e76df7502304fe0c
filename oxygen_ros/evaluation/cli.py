"""Command lines of the bag tools (argparse only; the work is in the modules they call).

    python -m oxygen_ros.evaluation BAG --params-file config/synthetic.yaml [-p name:=value ...] --out DIR
    python -m oxygen_ros.tools.make_demo_bag OUT [--duration 10] [--size 224] [--storage mcap] [--compressed]
    python -m oxygen_ros.tools.replay_bag BAG [--clock] [--rate 1.0] [--loop]

The evaluation takes the node's own parameters: the ``ros__parameters`` of a ROS 2 params YAML (its ``/**``
section and the node's, ``oxygen`` / ``/oxygen``, later ones overriding earlier ones), then ``-p name:=value``
overrides parsed as YAML like ros2's ``-p``. Only the evaluation's own knobs are flags.
"""

from __future__ import annotations

import argparse
import fnmatch
import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = ["NODE_NAME", "main", "make_demo_bag_main", "parse_overrides", "read_params_file", "replay_bag_main"]

NODE_NAME = "oxygen"  # the node's default name (its sections in a params file)
_STORAGE_CHOICES = ("mcap", "sqlite3")


def read_params_file(path: str | Path, node_name: str = NODE_NAME) -> dict[str, Any]:
    """The parameters a ROS 2 params YAML gives node ``node_name``: every section whose key matches the node's
    fully qualified name (``/**``, ``oxygen``, ``/oxygen``, ``/ns/*``, ...), merged in file order; nested maps
    become dotted names.

    Raises:
        ValueError: not a params file, or no section for the node.
    """
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a ROS 2 params file (expected `<node>: ros__parameters: ...`)")
    fqn = "/" + node_name.lstrip("/")
    params: dict[str, Any] = {}
    found = False
    for key, section in data.items():
        pattern = "/" + str(key).lstrip("/")
        if fnmatch.fnmatchcase(fqn, pattern.replace("**", "*")) and isinstance(section, dict):
            found = True
            params.update(_flatten(section.get("ros__parameters") or {}))
    if not found:
        raise ValueError(f"{path}: no `/**:` or `{node_name}:` section with ros__parameters")
    return params


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``name:=value`` items -> {name: value}, values parsed as YAML scalars / lists (``''`` for an empty one).

    Raises:
        ValueError: an item without ``:=`` or a name.
    """
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition(":=")
        if not sep or not name:
            raise ValueError(f"-p expects name:=value, got {item!r}")
        out[name] = yaml.safe_load(value) if value.strip() else ""
    return out


def _evaluate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m oxygen_ros.evaluation",
        description="Offline evaluation: run the node's pipeline over a rosbag2 (sqlite3 or mcap) "
                    "deterministically, without DDS; writes report.json, plots and out_bag/.")
    p.add_argument("bag", type=Path, help="rosbag2 directory (sqlite3 or mcap)")
    p.add_argument("--params-file", type=Path, action="append", default=[],
                   help="ROS 2 params YAML with the node's parameters (repeatable; later files override)")
    p.add_argument("-p", "--param", dest="params", action="append", default=[], metavar="NAME:=VALUE",
                   help="node parameter override, value parsed as YAML (repeatable)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--max-frames", type=int, help="evaluate at most this many ticks")
    p.add_argument("--storage", choices=_STORAGE_CHOICES, help="output bag storage (default: the input's)")
    p.add_argument("--joint-states-topic", default="/joint_states", help="the bag's JointState topic")
    p.add_argument("--instruction-topic", default="/instruction", help="the bag's instruction topic")
    p.add_argument("--node-name", default=NODE_NAME, help="whose sections of the params files to read")
    p.add_argument("--reference", type=Path, metavar="REPORT",
                   help="report.json of another run (e.g. --param mode:=isolated): per-stream exact match of texts")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--overwrite", action="store_true", help="replace an existing out_bag")
    return p


def _print_summary(report: dict[str, Any], out: Path) -> None:
    s, r = report["summary"], report["requests"]

    def fmt(v: float | None, spec: str) -> str:
        return "n/a" if v is None else format(v, spec)

    print(f"{report['frames']}/{report['ticks']} frames ({report['skipped']} skipped {report['skip_reasons']}), "
          f"action {fmt(s['action_hz'], '.1f')} Hz, {fmt(s['tokens_per_s'], '.1f')} tokens/s, "
          f"{r['finished']} language outputs (p50 {fmt(r['latency_frames']['p50'], '.0f')} frames)")
    for stream, m in r.get("exact_match", {}).items():
        print(f"  {stream}: exact match {fmt(m['exact_match'], '.1%')} of {m['matched']} matched requests "
              f"({m['finished']} finished)")
    print(f"digest {report['digest']['sha256']}")
    print(f"wrote {out / 'report.json'}, {len(report['outputs']['plots'])} plots, {out / 'out_bag'}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m oxygen_ros.evaluation`` / ``oxygen-evaluate-bag``: evaluate a bag with the node's parameters."""
    p = _evaluate_parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        params: dict[str, Any] = {}
        for path in args.params_file:
            params.update(read_params_file(path, args.node_name))
        params.update(parse_overrides(args.params))
    except (OSError, ValueError, yaml.YAMLError) as e:
        p.error(str(e))
    from .run import evaluate_bag  # torch and the model stack load only for a real run

    try:
        report = evaluate_bag(args.bag, args.out, params, max_frames=args.max_frames, storage=args.storage,
                              plots=not args.no_plots, progress=False if args.no_progress else None,
                              overwrite=args.overwrite, joint_states_topic=args.joint_states_topic,
                              instruction_topic=args.instruction_topic, reference=args.reference)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # bad parameters, bag or output directory
        print(f"error: {e}", file=sys.stderr)
        return 2
    _print_summary(report, args.out)
    return 0


def make_demo_bag_main(argv: Sequence[str] | None = None) -> int:
    """``python -m oxygen_ros.tools.make_demo_bag`` / ``oxygen-make-demo-bag``: write the synthetic demo bag."""
    from .demo_bag import DEFAULT_CAMERAS, DEFAULT_INSTRUCTION, DEFAULT_JOINT_NAMES, make_demo_bag

    p = argparse.ArgumentParser(description="Write a deterministic rosbag2 of the synthetic demo scene (cameras, "
                                            "joint states, instruction) with rosbags.")
    p.add_argument("out", type=Path, help="bag directory to create")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of bag time (default 10)")
    p.add_argument("--rate", type=float, default=10.0, help="camera and joint-state rate in Hz (default 10)")
    p.add_argument("--cameras", nargs="+", default=list(DEFAULT_CAMERAS), help="camera names (viewpoints)")
    p.add_argument("--size", type=int, default=224, help="square image size in pixels (default 224)")
    p.add_argument("--instruction", default=DEFAULT_INSTRUCTION)
    p.add_argument("--instruction-period", type=float, default=3.0, help="re-send the instruction every N s")
    p.add_argument("--joint-names", nargs="+", default=list(DEFAULT_JOINT_NAMES))
    p.add_argument("--storage", choices=_STORAGE_CHOICES, default="sqlite3")
    p.add_argument("--topic-fmt", default="/cameras/{name}/image_raw", help="camera topic, {name} = camera")
    p.add_argument("--compressed", action="store_true", help="write jpeg CompressedImage on <topic>/compressed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an existing bag directory")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.out.exists():
        if not args.overwrite:
            p.error(f"{args.out} exists (use --overwrite)")
        if not (args.out / "metadata.yaml").exists():
            p.error(f"{args.out} exists and is not a rosbag2 directory; not removing it")
        shutil.rmtree(args.out)
    path = make_demo_bag(
        args.out, args.duration, args.rate, args.cameras, args.size, args.instruction, args.joint_names,
        args.storage, args.topic_fmt, args.compressed, seed=args.seed, instruction_period_s=args.instruction_period,
        progress=False if args.no_progress else None,
    )
    print(f"wrote {path}")
    return 0


def _replay_parser(latched: Sequence[str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Replay a rosbag2 (sqlite3 or mcap) onto ROS 2 topics without "
                                            "ros2cli/rosbag2, using rosbags + rclpy.")
    p.add_argument("bag", type=Path, help="rosbag2 directory (or a single .db3/.mcap file)")
    p.add_argument("--rate", type=float, default=1.0, help="playback speed factor (default 1.0)")
    p.add_argument("--loop", action="store_true", help="replay until interrupted")
    p.add_argument("--topics", nargs="+", help="replay only these topics")
    p.add_argument("--clock", action="store_true", help="publish the bag time on /clock")
    p.add_argument("--clock-hz", type=float, default=40.0, help="/clock rate between messages (default 40)")
    p.add_argument("--start-delay", type=float, default=0.0, help="seconds to wait before playing")
    p.add_argument("--wait-subscribers", type=float, default=0.0,
                   help="wait up to N s for a subscriber on every topic before playing")
    p.add_argument("--qos-best-effort", action="store_true", help="BEST_EFFORT instead of RELIABLE publishers")
    p.add_argument("--qos-depth", type=int, default=10)
    p.add_argument("--latch", nargs="*", default=list(latched),
                   help=f"topics published TRANSIENT_LOCAL (default: {' '.join(latched)})")
    p.add_argument("--max-duration", type=float, help="stop after N wall-clock seconds")
    p.add_argument("--node-name", default="oxygen_replay")
    return p


def replay_bag_main(argv: Sequence[str] | None = None) -> int:
    """``python -m oxygen_ros.tools.replay_bag`` / ``oxygen-replay-bag``: publish a bag, paced, over DDS."""
    import rclpy  # the replayer needs ROS 2: imported only here
    from rosbags.highlevel import AnyReaderError
    from rosbags.rosbag2 import ReaderError

    from .replay import DEFAULT_LATCHED, BagReplayer

    p = _replay_parser(DEFAULT_LATCHED)
    args = p.parse_args(argv)
    if not args.bag.exists():
        p.error(f"{args.bag} does not exist")

    rclpy.init()
    replayer = None
    try:
        replayer = BagReplayer(
            args.bag, node_name=args.node_name, rate=args.rate, loop=args.loop, topics=args.topics,
            clock=args.clock, clock_hz=args.clock_hz, start_delay=args.start_delay,
            qos_best_effort=args.qos_best_effort, qos_depth=args.qos_depth, latched_topics=args.latch,
            wait_for_subscribers=args.wait_subscribers,
        )
        log = replayer.node.get_logger()
        log.info(f"replaying {args.bag} ({replayer.bag_duration_s:.1f} s, x{args.rate}): {', '.join(replayer.topics)}")
        stats = replayer.run(max_duration=args.max_duration)
        # print, not log: after Ctrl-C the context (and with it /rosout) is already shut down
        print(f"published {stats.total} messages, {stats.clock_published} clock, {stats.passes} passes "
              f"in {stats.wall_s:.1f} s{' (interrupted)' if stats.interrupted else ''}", flush=True)
    except KeyboardInterrupt:
        pass
    except (AnyReaderError, ReaderError, OSError, ValueError) as exc:  # bad bag or arguments
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if replayer is not None:
            replayer.close()
        rclpy.try_shutdown()
    return 0
