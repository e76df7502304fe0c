"""The embedded demo: a closed loop over ROS 2 topics. The node runs the package's default model (pi0.5 trained on
the tabletop world) and drives the tabletop simulator node: the robot puts blocks on plates while the model's
memories are published and scored. A live table every second (tasks done, frames, action Hz, tokens/s, the last
memory against the world's truth), then a final summary.

    python -m oxygen_ros.toy.demo                      # ~20 s, starts the node itself (the tabletop.yaml preset)
    python -m oxygen_ros.toy.demo --duration 60 --set k:=1
    python -m oxygen_ros.toy.demo --no-node            # simulate and watch a node started elsewhere (ros2 launch ...)
    python -m oxygen_ros.toy.demo --scene synthetic    # a tiny random model on a synthetic stream (timing only)
    python -m oxygen_ros.toy.demo --executor           # through the chunk executor: node -> executor -> simulator

The node runs as a child process (``python -m oxygen_ros.ros``, its log in a temporary file); this process hosts
the simulator node (:mod:`oxygen_ros.toy.sim`; with ``--scene synthetic`` the scene of
:mod:`oxygen_ros.testing.synthetic_scene`) and listens to the node's outputs over DDS. Presets are found by
:func:`oxygen_ros.toy.demo.config.find_config`.

With ``--executor`` (tabletop) the chunk executor runs as a third process (``python -m oxygen_ros.executor``, the
same preset, ``command_rate_hz`` 100, JointState output on ``/oxygen_executor/command``): it turns the node's chunks
into a setpoint stream that the simulator follows (its ``setpoint_topic``), and the node guides real-time chunking
toward what the executor executes (``rtc.remainder_source: executor``, unless ``--set`` says otherwise).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
from rich.console import Console
from rich.live import Live
from rich.table import Table

from oxygen_ros.ros.dds import dds_profile_environment, default_profile_path
from oxygen_ros.ros.stamps import duration_s
from oxygen_ros.testing.probe import Probe, header_ns
from oxygen_ros.testing.process import NodeProcess

from .config import find_config, load_params, parse_set
from .scenes import Scene, SyntheticScene, TabletopScene, clean_text

__all__ = ["DEFAULT_SIM_SEED", "SCENES", "DemoSummary", "main", "print_summary", "run_demo"]

SCENES = ("synthetic", "tabletop")  # each scene's preset is config/<scene>.yaml
DEFAULT_SIM_SEED = 1_000_000  # the closed-loop evaluation's first seed (scenes unseen in training)
STAGES = ("prefill", "denoise", "decode", "frame")
EXECUTOR_COMMAND_TOPIC = "/oxygen_executor/command"  # --executor: the setpoints the simulator follows
EXECUTOR_RATE_HZ = 100.0


@dataclass
class DemoSummary:
    """What the demo measured (receive side, over the whole run)."""

    frames: int
    action_hz: float
    frame_hz: float
    tokens_per_s: float
    language_outputs: int
    mean_latency_ms: float
    last_text: str
    node_exit_code: int | None
    diagnostics: dict[str, str]
    scene: str = "tabletop"
    tasks_completed: int = 0  # tabletop: episodes that ended in success
    episodes: int = 0  # tabletop: episodes finished (success or out of steps)
    memories_scored: int = 0  # tabletop: memory outputs matched to an observation of the simulator
    memories_exact: int = 0
    language_exact: dict[str, tuple[int, int]] = field(default_factory=dict)  # tabletop: task -> (exact, scored)
    answers_asked: int = 0  # tabletop: questions sent to ~/ask
    answers_scored: int = 0  # of which answered (scored against the truth)
    answers_exact: int = 0
    setpoints: int = 0  # tabletop --executor: setpoints the simulator followed (it executes no chunk then)
    executor: dict[str, str] = field(default_factory=dict)  # --executor: its diagnostics (underruns, state, ...)
    executor_exit_code: int | None = None


class ExecutorWatch:
    """The chunk executor's newest /diagnostics values (``oxygen_executor: executor``), heard by the probe."""

    def __init__(self, probe: Probe, name: str = "oxygen_executor: executor") -> None:
        self._name, self._values, self._lock = name, {}, threading.Lock()
        probe.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name == self._name:
                with self._lock:
                    self._values = {kv.key: kv.value for kv in status.values}

    def values(self) -> dict[str, str]:
        with self._lock:
            return dict(self._values)


def _ms(duration: Any) -> float:
    return duration_s(duration) * 1e3


def _window(probe: Probe, seconds: float) -> tuple[int, int, int]:
    """(chunks, language outputs, tokens) received in the last ``seconds``."""
    since = time.monotonic() - seconds
    language = probe.language(since)
    return len(probe.chunks(since)), len(language), sum(o.num_tokens for o in language)


def _table(probe: Probe, scene: Scene, elapsed: float, duration: float, horizon: int) -> Table:
    chunks, _, tokens = _window(probe, 2.0)
    all_chunks, language, diag = probe.chunks(), probe.language(), probe.diagnostics()
    last = all_chunks[-1] if all_chunks else None
    table = Table(title=f"oxygen_ros demo  {elapsed:5.1f} / {duration:.0f} s   {scene.note()}", title_justify="left")
    table.add_column("metric", style="cyan", no_wrap=True)
    table.add_column("value", overflow="fold")
    latency = "" if last is None else f"{_ms(last.inference_latency):.0f} ms"
    rows = [
        ("node", f"{diag.get('state', 'starting')} ({diag.get('mode', '?')})"),
        ("frames (action chunks)", str(len(all_chunks))),
        ("frame rate", f"{chunks / 2.0:.1f} Hz"),
        ("action rate", f"{chunks / 2.0 * horizon:.0f} actions/s (H={horizon})"),
        ("language", f"{len(language)} outputs, {tokens / 2.0:.0f} tokens/s"),
        ("stage times (EMA, ms)", " ".join(f"{s} {diag.get(f'{s}_ms', '-')}" for s in STAGES)),
        ("latency (obs -> chunk)", latency),
        ("backlog / deadline misses", f"{diag.get('language_backlog', '-')} / {diag.get('deadline_misses', '-')}"),
        ("skipped / rejected", f"{diag.get('skipped_frames', '-')} / {diag.get('rejected_inputs', '-')}"),
        *scene.rows(),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def _wait_subscribed(probe: Probe, scene: Scene, node: NodeProcess | None, console: Console) -> None:
    with console.status("waiting for the node to subscribe to the cameras ..."):
        if not probe.wait_for(scene.subscribed, 60):
            raise RuntimeError("the node never subscribed to the cameras" + (
                f"; its log:\n{node.output()[-3000:]}" if node is not None else ""))


def _progress(probe: Probe, scene: Scene) -> dict[str, Any]:
    """The counts so far, under :class:`DemoSummary`'s names: ``frames``, ``language_outputs`` and the scene's."""
    return {"frames": len(probe.chunks()), "language_outputs": len(probe.language()), **scene.summary()}


def _watch(probe: Probe, scene: Scene, node: NodeProcess | None, duration: float, horizon: int,
           console: Console, executor: NodeProcess | None = None,
           until: Callable[[dict[str, Any]], bool] | None = None,
           max_duration: float | None = None) -> tuple[float, int]:
    """Show the live table (a line per second when not on a terminal) for ``duration`` seconds, then on until
    ``until(progress)`` holds or ``max_duration`` passed (when ``until`` is given); returns the wall time and the
    action horizon (taken from the first chunk when the preset leaves it to the model)."""
    t0 = time.monotonic()
    limit = max(duration, max_duration or duration)

    def going(elapsed: float) -> bool:
        if elapsed < duration:
            return True
        return until is not None and elapsed < limit and not until(_progress(probe, scene))

    live = Live(console=console, refresh_per_second=2, transient=False) if console.is_terminal else None
    if live is not None:
        live.start()
    try:
        while going(elapsed := time.monotonic() - t0):
            scene.tick()
            if node is not None and not node.alive:
                raise RuntimeError(f"the node exited:\n{node.output()[-3000:]}")
            if executor is not None and not executor.alive:
                raise RuntimeError(f"the executor exited:\n{executor.output()[-3000:]}")
            if not horizon and probe.chunks():
                horizon = int(probe.chunks()[0].horizon)
            if live is not None:
                live.update(_table(probe, scene, elapsed, duration, horizon))
            else:
                chunks, _, tokens = _window(probe, 1.0)
                console.print(f"{elapsed:5.1f} s  frames {len(probe.chunks()):4d}  {chunks * horizon:4.0f} "
                              f"actions/s  {tokens:4.0f} tokens/s  "
                              + "  ".join(f"{k}: {v}" for k, v in scene.rows()), soft_wrap=True)
            time.sleep(1.0 - (time.monotonic() - t0) % 1.0)
    finally:
        if live is not None:
            live.stop()
    return time.monotonic() - t0, horizon


def _summarize(probe: Probe, scene: str, wall: float, horizon: int, exit_code: int | None,
               diagnostics: dict[str, str], scene_summary: dict[str, int]) -> DemoSummary:
    chunks, language = probe.chunks(), probe.language()
    latencies = [_ms(c.inference_latency) for c in chunks]
    stamps = sorted(header_ns(c) for c in chunks)
    span = (stamps[-1] - stamps[0]) / 1e9 if len(stamps) > 1 else 0.0
    frame_hz = (len(stamps) - 1) / span if span > 0 else 0.0
    return DemoSummary(
        frames=len(chunks), action_hz=frame_hz * horizon, frame_hz=frame_hz,
        tokens_per_s=sum(o.num_tokens for o in language) / wall, language_outputs=len(language),
        mean_latency_ms=sum(latencies) / len(latencies) if latencies else float("nan"),
        last_text=clean_text(language[-1].text) if language else "", node_exit_code=exit_code,
        diagnostics=diagnostics, scene=scene, **scene_summary)


def run_demo(duration: float = 20.0, config: Path | None = None, overrides: dict[str, Any] | None = None,
             start_node: bool = True, domain_id: int | None = None, image_size: int = 224, camera_rate_hz: float = 15.0,
             console: Console | None = None, scene: str = "tabletop", sim_seed: int = DEFAULT_SIM_SEED,
             ask_every_s: float = 3.0, executor: bool = False, until: Callable[[dict[str, Any]], bool] | None = None,
             max_duration: float | None = None) -> DemoSummary:
    """Run the demo for ``duration`` seconds and return the summary. ``scene``: "tabletop" (the simulator node, closed
    loop) or "synthetic" (a synthetic stream of ``image_size`` px at ``camera_rate_hz``); ``config`` defaults to the
    scene's preset (:func:`~oxygen_ros.toy.demo.config.find_config`). Tabletop: a question about the scene goes to the
    node's ``~/ask`` action every ``ask_every_s`` seconds (0: none), its answer scored against the world.
    ``executor``: drive the simulator through the chunk executor process (tabletop only; module docstring).
    ``until``: after ``duration``, go on until it holds for the counts so far (``frames``, ``language_outputs`` and
    the scene's :class:`DemoSummary` fields) or ``max_duration`` seconds passed: a test waits for what it checks
    instead of a busy host's frame rate."""
    if scene not in SCENES:
        raise ValueError(f"scene must be one of {sorted(SCENES)}, got {scene!r}")
    if executor and scene != "tabletop":
        raise ValueError("--executor drives the tabletop simulator; the synthetic scene has no robot")
    console = console or Console()
    config = config or find_config(scene)
    overrides = dict(overrides or {})
    if executor:
        overrides.setdefault("rtc.remainder_source", "executor")
    params = load_params(config, overrides)
    cameras = list(params.get("camera_names") or ["base_0_rgb", "left_wrist_0_rgb"])
    topics = list(params.get("camera_topics") or [f"/cameras/{c}/image_raw" for c in cameras])
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    if domain_id is None:
        domain_id = int(os.environ.get("ROS_DOMAIN_ID", 0)) if not start_node else 150 + os.getpid() % 80

    # the Fast DDS profile that carries real camera images, for the node and this process (the simulator), applied
    # exactly as the launch file applies it; a profile the environment names wins
    dds_env, dds_why = dds_profile_environment(default_profile_path())
    console.print(f"[bold]DDS[/] {dds_why}", soft_wrap=True)
    restore = {k: os.environ.get(k) for k in dds_env}
    os.environ.update(dds_env)  # read when this process creates its first DDS participant (the probe below)
    node = NodeProcess(config, overrides, domain_id=domain_id) if start_node else None
    if node is not None:
        node.env.update(dds_env)
        node.start()
        console.print(f"[bold]node[/] python -m oxygen_ros.ros ({config.name}), log: {node.log_path}",
                      soft_wrap=True)
    chunk_executor = None
    if executor:
        chunk_executor = NodeProcess(config, {"chunk_topic": "/oxygen/action_chunk", "halt_topic": "/oxygen/halt",
                                              "command_rate_hz": EXECUTOR_RATE_HZ, "output": "joint_state",
                                              "output_topic": EXECUTOR_COMMAND_TOPIC},
                                     domain_id=domain_id, module="oxygen_ros.executor")
        chunk_executor.env.update(dds_env)
        chunk_executor.start()
        console.print(f"[bold]executor[/] python -m oxygen_ros.executor ({EXECUTOR_RATE_HZ:g} Hz -> "
                      f"{EXECUTOR_COMMAND_TOPIC}), log: {chunk_executor.log_path}", soft_wrap=True)
    console.print(f"[bold]watch it[/]: ROS_DOMAIN_ID={domain_id} ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST "
                  "ros2 topic echo /oxygen/language_output", soft_wrap=True)
    probe_cameras = list(zip(cameras, topics, strict=True)) if scene == "synthetic" else []
    probe = Probe(probe_cameras, list(params["joint_names"]), image_size=image_size, domain_id=domain_id,
                  name=f"oxygen_demo_{scene}")
    executor_watch = ExecutorWatch(probe) if executor else None
    try:
        world: Scene = TabletopScene(probe, "/oxygen", sim_seed, ask_every_s,
                                     EXECUTOR_COMMAND_TOPIC if executor else "") if scene == "tabletop" \
            else SyntheticScene(probe, camera_rate_hz)
        _wait_subscribed(probe, world, node, console)
        world.start()
        wall, horizon = _watch(probe, world, node, duration, int(params.get("action_horizon") or 0), console,
                               chunk_executor, until, max_duration)
        scene_summary = world.summary()
        world.close()
        diagnostics = probe.diagnostics()
        executor_diag = executor_watch.values() if executor_watch is not None else {}
        exit_code = node.stop(signal.SIGINT, timeout=15) if node is not None else None
        summary = _summarize(probe, scene, wall, horizon, exit_code, diagnostics, scene_summary)
        if chunk_executor is not None:
            summary.executor = executor_diag
            summary.executor_exit_code = chunk_executor.stop(signal.SIGINT, timeout=15)
        return summary
    finally:
        probe.close()
        if node is not None and node.alive:
            node.stop(signal.SIGINT, timeout=15)
        if chunk_executor is not None and chunk_executor.alive:
            chunk_executor.stop(signal.SIGINT, timeout=15)
        for key, value in restore.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def print_summary(s: DemoSummary, console: Console) -> None:
    """Print the summary table."""
    table = Table(title=f"oxygen_ros demo ({s.scene}): summary", title_justify="left")
    table.add_column("metric", style="cyan")
    table.add_column("value")
    d = s.diagnostics
    rows = [("tasks done / episodes", f"{s.tasks_completed} / {s.episodes}"),
            ("memory exact match", f"{s.memories_exact} / {s.memories_scored}")] if s.scene == "tabletop" else []
    rows += [(f"{task} exact match", f"{exact} / {scored}") for task, (exact, scored) in s.language_exact.items()
             if task != "memory"]
    if s.answers_asked:
        rows.append(("answers exact (~/ask)", f"{s.answers_exact} / {s.answers_scored} ({s.answers_asked} asked)"))
    for name, value in (
        *rows,
        ("frames (action chunks)", str(s.frames)),
        ("frame rate / action rate", f"{s.frame_hz:.1f} Hz / {s.action_hz:.0f} actions/s"),
        ("language outputs / tokens per s", f"{s.language_outputs} / {s.tokens_per_s:.0f}"),
        ("mean latency (obs -> chunk)", f"{s.mean_latency_ms:.0f} ms"),
        ("stage times (EMA, ms)", " ".join(f"{k} {d.get(f'{k}_ms', '-')}" for k in STAGES)),
        ("deadline misses / skipped / rejected", f"{d.get('deadline_misses', '-')} / {d.get('skipped_frames', '-')} / "
                                                 f"{d.get('rejected_inputs', '-')}"),
        ("last language output", s.last_text or "(none)"),
        ("node exit code", "-" if s.node_exit_code is None else str(s.node_exit_code)),
        *_executor_rows(s),
    ):
        table.add_row(name, value)
    console.print(table)


def _executor_rows(s: DemoSummary) -> list[tuple[str, str]]:
    """--executor: what the executor reported (its /diagnostics status) and how it exited."""
    if s.executor_exit_code is None and not s.executor:
        return []
    e = s.executor
    keys = ("state", "command_rate_hz", "switch", "interpolation", "setpoints", "underruns", "chunks.used")
    return [("executor", ", ".join(f"{k} {e[k]}" for k in keys if k in e) or "(no diagnostics received)"),
            ("executor exit code", "-" if s.executor_exit_code is None else str(s.executor_exit_code))]


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns 0 when chunks and language outputs were seen, the node exited cleanly and
    (tabletop scene) the robot completed at least one task."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of streaming (default 20)")
    ap.add_argument("--scene", choices=sorted(SCENES), default="tabletop",
                    help="tabletop: closed loop with the simulator (default); synthetic: random model, timing only")
    ap.add_argument("--config", type=Path, help="node params file (default: the scene's preset, tabletop.yaml or "
                                                "synthetic.yaml: the checkout's config/ or share/oxygen_ros/config)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME:=VALUE", help="override a node parameter")
    ap.add_argument("--no-node", action="store_true", help="do not start the node (use one started elsewhere)")
    ap.add_argument("--domain-id", type=int, help="ROS domain (default: a private one, or $ROS_DOMAIN_ID with "
                                                  "--no-node)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SIM_SEED, help="first episode seed of the simulator")
    ap.add_argument("--image-size", type=int, default=224, help="synthetic scene: camera image size (default 224)")
    ap.add_argument("--camera-rate", type=float, default=15.0, help="synthetic scene: camera rate (default 15 Hz)")
    ap.add_argument("--ask-every", type=float, default=3.0, metavar="S",
                    help="tabletop: ask the node a question over ~/ask every S seconds (default 3; 0: never)")
    ap.add_argument("--executor", action="store_true",
                    help="tabletop: run the chunk executor too and drive the simulator with its setpoint stream")
    args = ap.parse_args(argv)
    console = Console()
    try:
        summary = run_demo(args.duration, args.config, parse_set(args.set), not args.no_node, args.domain_id,
                           args.image_size, args.camera_rate, console, args.scene, args.seed, args.ask_every,
                           args.executor)
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
    except (RuntimeError, ValueError, FileNotFoundError, argparse.ArgumentTypeError) as e:
        console.print(f"[red]demo failed:[/] {e}")
        return 1
    print_summary(summary, console)
    ok = summary.frames > 0 and summary.language_outputs > 0 and summary.node_exit_code in (0, None)
    if args.executor and summary.executor_exit_code not in (0, None):
        console.print(f"[red]the executor exited with {summary.executor_exit_code}[/]")
        ok = False
    if summary.scene == "tabletop" and not summary.tasks_completed:
        console.print("[red]no task completed[/]")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
