"""The embedded demo: a closed loop over ROS 2 topics. The node runs the package's default model (pi0.5 trained on
the tabletop world) and drives the tabletop simulator node: the robot puts blocks on plates while the model's
memories are published and scored. A live table every second (tasks done, frames, action Hz, tokens/s, the last
memory against the world's truth), then a final summary.

    python -m oxygen_ros.ros.demo                      # ~20 s, starts the node itself (config/tabletop.yaml)
    python -m oxygen_ros.ros.demo --duration 60 --set k:=1
    python -m oxygen_ros.ros.demo --no-node            # simulate and watch a node started elsewhere (ros2 launch ...)
    python -m oxygen_ros.ros.demo --scene synthetic    # a tiny random model on a synthetic stream (timing only)

The node runs as a child process (``python -m oxygen_ros.ros.node``, its log in a temporary file); this process hosts
the simulator node (:mod:`oxygen_ros.ros.sim_node`; with ``--scene synthetic`` the scene of
``oxygen_ros.tools.demo_scene``) and listens to the node's outputs over DDS.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.live import Live
from rich.table import Table

from .harness import REPO_ROOT, NodeProcess, Probe, header_ns

__all__ = ["DemoSummary", "main", "run_demo"]

SCENE_CONFIGS = {scene: REPO_ROOT / "config" / f"{scene}.yaml" for scene in ("tabletop", "synthetic")}
DEFAULT_SIM_SEED = 1_000_000  # the closed-loop evaluation's first seed (scenes unseen in training)
STAGES = ("prefill", "denoise", "decode", "frame")
INSTRUCTIONS = ("put the red block on the blue plate", "pick up the green block and place it in the basket")


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


def clean_text(text: str, limit: int = 70) -> str:
    """Printable version of a (random-model) text: control and replacement characters dropped."""
    kept = "".join(ch for ch in text if ch == " " or (unicodedata.category(ch)[0] not in "CZ" and ch != "\ufffd"))
    kept = " ".join(kept.split())
    return kept if len(kept) <= limit else kept[: limit - 1] + "…"


def parse_set(items: Sequence[str]) -> dict[str, Any]:
    """``name:=value`` pairs (values parsed as YAML, like ``-p``)."""
    out = {}
    for item in items:
        name, sep, value = item.partition(":=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"--set expects name:=value, got {item!r}")
        out[name] = yaml.safe_load(value)
    return out


def _params(config: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    data = yaml.safe_load(config.read_text()) or {}
    params = dict(next(iter(data.values()))["ros__parameters"]) if data else {}
    return {**params, **overrides}


def _ms(duration) -> float:
    return duration.sec * 1e3 + duration.nanosec / 1e6


def _window(probe: Probe, seconds: float) -> tuple[int, int, int]:
    """(chunks, language outputs, tokens) received in the last ``seconds``."""
    since = time.monotonic() - seconds
    language = probe.language(since)
    return len(probe.chunks(since)), len(language), sum(o.num_tokens for o in language)


class TabletopScene:
    """The simulator node, hosted in the probe's context and executor (one process, one spin thread)."""

    name = "tabletop"

    def __init__(self, probe: Probe, node: str, seed: int) -> None:
        from rclpy.parameter import Parameter

        from .sim_node import TabletopSimNode

        self.sim = TabletopSimNode(context=probe.context, parameter_overrides=[
            Parameter("autostart", value=False), Parameter("seed", value=seed),
            Parameter("chunk_topic", value=f"{node}/action_chunk"),
            Parameter("language_topic", value=f"{node}/language_output")])
        probe.executor.add_node(self.sim)
        self._probe = probe

    def subscribed(self) -> bool:
        return self.sim.cameras_connected()

    def start(self) -> None:
        self.sim.start()

    def tick(self) -> None:
        pass

    def note(self) -> str:
        w = self.sim.world
        return f"task: {w.instruction!r} (seed {w.seed}, step {w.steps})"

    def rows(self) -> list[tuple[str, str]]:
        c, last = self.sim.counters, self.sim.last_memory
        scored = c.memories - c.memory_unscored
        memory = "(none yet)" if last is None else (
            f"{clean_text(last[0])} ({'= truth' if last[0].strip() == last[1] else 'truth: ' + last[1]})")
        return [("tasks done / episodes", f"{c.successes} / {c.episodes}"),
                ("memory exact match", f"{c.memory_exact} / {scored}" + (f" ({c.memory_exact / scored:.0%})"
                                                                         if scored else "")),
                ("last memory", memory)]

    def summary(self) -> dict[str, int]:
        c = self.sim.counters
        return {"tasks_completed": c.successes, "episodes": c.episodes,
                "memories_scored": c.memories - c.memory_unscored, "memories_exact": c.memory_exact}

    def close(self) -> None:
        self._probe.executor.remove_node(self.sim)
        self.sim.destroy_node()


class SyntheticScene:
    """The synthetic camera/state stream of :mod:`oxygen_ros.tools.demo_scene` with changing instructions."""

    name = "synthetic"

    def __init__(self, probe: Probe, camera_rate_hz: float) -> None:
        self._probe, self._rate = probe, camera_rate_hz
        self._index, self._next = 0, 0.0

    def subscribed(self) -> bool:
        return all(p.get_subscription_count() > 0 for p in self._probe.camera_pubs.values())

    def start(self) -> None:
        self._probe.start_stream(self._rate)
        self._next = time.monotonic()

    def tick(self) -> None:
        if time.monotonic() >= self._next:  # re-sent for late joiners; changes every 10 s
            self._probe.publish_instruction(INSTRUCTIONS[self._index // 5 % len(INSTRUCTIONS)])
            self._index += 1
            self._next += 2.0

    def note(self) -> str:
        return f"instruction: {INSTRUCTIONS[max(0, self._index - 1) // 5 % len(INSTRUCTIONS)]!r} (random model)"

    def rows(self) -> list[tuple[str, str]]:
        language = self._probe.language()
        return [("last language output", clean_text(language[-1].text) if language else "(none yet)")]

    def summary(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        self._probe.stop_stream()


def _table(probe: Probe, scene: TabletopScene | SyntheticScene, elapsed: float, duration: float,
           horizon: int) -> Table:
    chunks, _, tokens = _window(probe, 2.0)
    all_chunks, language, diag = probe.chunks(), probe.language(), probe.diagnostics()
    last = probe.chunks()[-1] if all_chunks else None
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


def run_demo(duration: float = 20.0, config: Path | None = None, overrides: dict[str, Any] | None = None,
             start_node: bool = True, domain_id: int | None = None, image_size: int = 224, camera_rate_hz: float = 15.0,
             console: Console | None = None, scene: str = "tabletop", sim_seed: int = DEFAULT_SIM_SEED) -> DemoSummary:
    """Run the demo for ``duration`` seconds and return the summary. ``scene``: "tabletop" (the simulator node, closed
    loop) or "synthetic" (a synthetic stream of ``image_size`` px at ``camera_rate_hz``); ``config`` defaults to the
    scene's preset."""
    if scene not in SCENE_CONFIGS:
        raise ValueError(f"scene must be one of {sorted(SCENE_CONFIGS)}, got {scene!r}")
    console = console or Console()
    config = config or SCENE_CONFIGS[scene]
    overrides = dict(overrides or {})
    params = _params(config, overrides)
    cameras = list(params.get("camera_names") or ["base_0_rgb", "left_wrist_0_rgb"])
    topics = list(params.get("camera_topics") or [f"/cameras/{c}/image_raw" for c in cameras])
    joints = list(params["joint_names"])
    horizon = int(params.get("action_horizon") or 0)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    if domain_id is None:
        domain_id = int(os.environ.get("ROS_DOMAIN_ID", 0)) if not start_node else 150 + os.getpid() % 80

    node = NodeProcess(config, overrides, domain_id=domain_id) if start_node else None
    if node is not None:
        node.start()
        console.print(f"[bold]node[/] python -m oxygen_ros.ros.node ({config.name}), log: {node.log_path}",
                      soft_wrap=True)
    console.print(f"[bold]watch it[/]: ROS_DOMAIN_ID={domain_id} ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST "
                  "ros2 topic echo /oxygen/language_output", soft_wrap=True)
    probe_cameras = list(zip(cameras, topics, strict=True)) if scene == "synthetic" else []
    probe = Probe(probe_cameras, joints, image_size=image_size, domain_id=domain_id, name=f"oxygen_demo_{scene}")
    world: TabletopScene | SyntheticScene | None = None
    exit_code = None
    try:
        world = TabletopScene(probe, "/oxygen", sim_seed) if scene == "tabletop" else SyntheticScene(probe,
                                                                                                      camera_rate_hz)
        with console.status("waiting for the node to subscribe to the cameras ..."):
            if not probe.wait_for(world.subscribed, 60):
                raise RuntimeError("the node never subscribed to the cameras" + (
                    f"; its log:\n{node.output()[-3000:]}" if node is not None else ""))
        world.start()
        t0 = time.monotonic()
        live = Live(console=console, refresh_per_second=2, transient=False) if console.is_terminal else None
        if live is not None:
            live.start()
        try:
            while (elapsed := time.monotonic() - t0) < duration:
                world.tick()
                if node is not None and not node.alive:
                    raise RuntimeError(f"the node exited:\n{node.output()[-3000:]}")
                if not horizon and probe.chunks():
                    horizon = int(probe.chunks()[0].horizon)
                if live is not None:
                    live.update(_table(probe, world, elapsed, duration, horizon))
                else:
                    chunks, _, tokens = _window(probe, 1.0)
                    console.print(f"{elapsed:5.1f} s  frames {len(probe.chunks()):4d}  {chunks * horizon:4.0f} "
                                  f"actions/s  {tokens:4.0f} tokens/s  "
                                  + "  ".join(f"{k}: {v}" for k, v in world.rows()), soft_wrap=True)
                time.sleep(1.0 - (time.monotonic() - t0) % 1.0)
        finally:
            if live is not None:
                live.stop()
        wall = time.monotonic() - t0
        scene_summary = world.summary()
        world.close()
        diagnostics = probe.diagnostics()
        if node is not None:
            exit_code = node.stop(signal.SIGINT, timeout=15)
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
    finally:
        probe.close()
        if node is not None and node.alive:
            node.stop(signal.SIGINT, timeout=15)


def print_summary(s: DemoSummary, console: Console) -> None:
    table = Table(title=f"oxygen_ros demo ({s.scene}): summary", title_justify="left")
    table.add_column("metric", style="cyan")
    table.add_column("value")
    d = s.diagnostics
    rows = [("tasks done / episodes", f"{s.tasks_completed} / {s.episodes}"),
            ("memory exact match", f"{s.memories_exact} / {s.memories_scored}")] if s.scene == "tabletop" else []
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
    ):
        table.add_row(name, value)
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns 0 when chunks and language outputs were seen, the node exited cleanly and
    (tabletop scene) the robot completed at least one task."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of streaming (default 20)")
    ap.add_argument("--scene", choices=sorted(SCENE_CONFIGS), default="tabletop",
                    help="tabletop: closed loop with the simulator (default); synthetic: random model, timing only")
    ap.add_argument("--config", type=Path, help="node params file (default: config/tabletop.yaml or synthetic.yaml)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME:=VALUE", help="override a node parameter")
    ap.add_argument("--no-node", action="store_true", help="do not start the node (use one started elsewhere)")
    ap.add_argument("--domain-id", type=int, help="ROS domain (default: a private one, or $ROS_DOMAIN_ID with "
                                                  "--no-node)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SIM_SEED, help="first episode seed of the simulator")
    ap.add_argument("--image-size", type=int, default=224, help="synthetic scene: camera image size (default 224)")
    ap.add_argument("--camera-rate", type=float, default=15.0, help="synthetic scene: camera rate (default 15 Hz)")
    args = ap.parse_args(argv)
    console = Console()
    try:
        summary = run_demo(args.duration, args.config, parse_set(args.set), not args.no_node, args.domain_id,
                           args.image_size, args.camera_rate, console, args.scene, args.seed)
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
    except (RuntimeError, ValueError, argparse.ArgumentTypeError) as e:
        console.print(f"[red]demo failed:[/] {e}")
        return 1
    print_summary(summary, console)
    ok = summary.frames > 0 and summary.language_outputs > 0 and summary.node_exit_code in (0, None)
    if summary.scene == "tabletop" and not summary.tasks_completed:
        console.print("[red]no task completed[/]")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
