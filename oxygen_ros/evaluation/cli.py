"""Command lines of the bag tools (argparse only; the work is in the modules they call).

    python -m oxygen_ros.evaluation BAG --params-file config/synthetic.yaml [-p name:=value ...] --out DIR
    python -m oxygen_ros.evaluation BAG BAG ... | DIR | 'GLOB' --params-file ... --out DIR [--ray-address ADDR]
    oxygen-replay-bag BAG [--clock] [--rate 1.0] [--loop]

The evaluation takes the node's own parameters: the ``ros__parameters`` of a ROS 2 params YAML (its ``/**``
section and the node's, ``oxygen`` / ``/oxygen``, later ones overriding earlier ones), then ``-p name:=value``
overrides parsed as YAML like ros2's ``-p``. Only the evaluation's own knobs are flags.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = ["NODE_NAME", "main", "parse_overrides", "read_params_file", "replay_bag_main"]

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
                    "deterministically, without DDS, and score it against what the robot was commanded; writes "
                    "report.json, plots and out_bag/. Several bags, a directory of bags or a glob: a fleet "
                    "evaluation (on Ray when installed) writing fleet.json, fleet.md and plots.")
    p.add_argument("bags", nargs="+", help="rosbag2 directory (sqlite3 or mcap); several, a directory of bags or a "
                                           "quoted glob evaluate a fleet")
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
    t = p.add_argument_group("timing (docs/evaluation-determinism.md)")
    t.add_argument("--timing", choices=("bag", "wall"), default="bag",
                   help="bag (default): deterministic, rtc.delay auto follows a modeled latency on the bag's clock, "
                        "k_auto runs the fixed k, kernels auto the plain ones; wall: the measured timing feeds "
                        "back as on the robot (results depend on the host's load)")
    t.add_argument("--latency", type=float, metavar="SECONDS",
                   help="with --timing bag: modeled tick -> chunk-ready latency (default: half the control period)")
    s = p.add_argument_group("scores against the recording")
    s.add_argument("--reference-topic", default="",
                   help="what the robot was commanded: JointTrajectory, JointState or ActionChunk topic "
                        "(default: the future joint states)")
    s.add_argument("--reference-joints", nargs="+", default=[], metavar="JOINT",
                   help="joints to score (default: the action names the reference has)")
    s.add_argument("--reference-language", action="append", default=[], metavar="STREAM=TOPIC",
                   help="score a language stream against an annotation topic (std_msgs/String or LanguageOutput; "
                        "repeatable)")
    s.add_argument("--tolerance", type=float, default=0.05, help="a chunk within tolerance: max |error| <= this")
    f = p.add_argument_group("fleet (several bags)")
    f.add_argument("--ray-address", help="run on this Ray cluster (default: a local Ray when installed)")
    f.add_argument("--no-ray", action="store_true", help="evaluate the bags sequentially in this process")
    f.add_argument("--workers", type=int, help="Ray actors (default: one per GPU, else CPUs / --cpus-per-worker)")
    f.add_argument("--cpus-per-worker", type=float, default=1.0)
    f.add_argument("--gpus-per-worker", type=float, help="default: 1 where the cluster has GPUs")
    f.add_argument("--rerun", action="store_true", help="evaluate bags again that the output's cache holds")
    f.add_argument("--fleet", action="store_true", help="a fleet evaluation even of a single bag")
    return p


def _scoring(p: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    from .reference import ScoringOptions

    topics: dict[str, str] = {}
    for item in args.reference_language:
        stream, sep, topic = item.partition("=")
        if not sep or not stream or not topic:
            p.error(f"--reference-language expects STREAM=TOPIC, got {item!r}")
        topics[stream] = topic
    if args.tolerance < 0:
        p.error("--tolerance must not be negative")
    return ScoringOptions(args.reference_topic, tuple(args.reference_joints), topics, args.tolerance)


def _timing(p: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    from .timing import ReplayTiming

    if args.latency is not None and args.timing != "bag":
        p.error("--latency models the bag clock; it does not apply to --timing wall")
    try:
        return ReplayTiming(args.timing, args.latency)
    except ValueError as e:
        p.error(str(e))


def _is_fleet(args: argparse.Namespace) -> bool:
    from .fleet import is_bag

    return args.fleet or len(args.bags) > 1 or glob.has_magic(args.bags[0]) or not is_bag(Path(args.bags[0]))


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
    scores = report["scores"]
    a = scores["actions"]
    if a:
        print(f"actions vs {scores['reference_topic']}: MAE {fmt(a['mae'], '.4f')} (first action "
              f"{fmt(a['first_action']['mae'], '.4f')}, executed part {fmt(a['executed']['mae'], '.4f')}) over "
              f"{a['chunks']} chunks; within {a['tolerance']}: {fmt(a['within_tolerance']['executed'], '.0%')}")
    else:
        print(f"actions not scored: {scores['note']}")
    for stream, m in scores["language"].items():
        print(f"  {stream} vs {m['topic']}: exact match {fmt(m['exact_match'], '.1%')}, edit distance "
              f"{fmt(m['edit_distance'], '.3f')} ({m['scored']} scored)")
    print(f"digest {report['digest']['sha256']}")
    print(f"wrote {out / 'report.json'}, {len(report['outputs']['plots'])} plots, {out / 'out_bag'}")


def _run_fleet(p: argparse.ArgumentParser, args: argparse.Namespace, params: dict[str, Any]) -> int:
    from .fleet import evaluate_fleet
    from .fleet_report import fleet_table

    if args.reference is not None:
        p.error("--reference compares one bag's report; it does not apply to a fleet")
    if args.no_ray and args.ray_address:
        p.error("--no-ray and --ray-address contradict each other")
    try:
        fleet = evaluate_fleet(args.bags, args.out, params, scoring=_scoring(p, args), max_frames=args.max_frames,
                               joint_states_topic=args.joint_states_topic, instruction_topic=args.instruction_topic,
                               use_ray=False if args.no_ray else None, ray_address=args.ray_address,
                               workers=args.workers, cpus_per_worker=args.cpus_per_worker,
                               gpus_per_worker=args.gpus_per_worker, rerun=args.rerun, plots=not args.no_plots,
                               progress=False if args.no_progress else None, timing=_timing(p, args))
    except (FileNotFoundError, ImportError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(fleet_table(fleet))
    print(f"wrote {args.out / 'fleet.json'}, {args.out / 'fleet.md'}, {len(fleet['outputs']['plots'])} plots")
    return 1 if fleet["bags"]["failed"] else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m oxygen_ros.evaluation`` / ``oxygen-evaluate-bag``: evaluate a bag (or a fleet of bags) with the
    node's parameters; exit 0, 1 when a fleet bag failed, 2 on bad arguments or a failed single bag."""
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
    if _is_fleet(args):
        return _run_fleet(p, args, params)
    from .run import evaluate_bag  # torch and the model stack load only for a real run

    try:
        report = evaluate_bag(args.bags[0], args.out, params, max_frames=args.max_frames, storage=args.storage,
                              plots=not args.no_plots, progress=False if args.no_progress else None,
                              overwrite=args.overwrite, joint_states_topic=args.joint_states_topic,
                              instruction_topic=args.instruction_topic, reference=args.reference,
                              scoring=_scoring(p, args), timing=_timing(p, args))
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # bad parameters, bag or output directory
        print(f"error: {e}", file=sys.stderr)
        return 2
    _print_summary(report, args.out)
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
    """``oxygen-replay-bag``: publish a bag, paced, over DDS."""
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
