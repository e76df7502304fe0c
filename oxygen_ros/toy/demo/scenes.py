"""What the demo's probe process hosts besides the probe: the tabletop simulator node (closed loop, the default) or
the synthetic camera/state stream. Both offer the same small interface to the demo loop (subscribed, start, tick,
note, rows, summary, close)."""

from __future__ import annotations

import time
import unicodedata
from typing import Protocol

from rclpy.parameter import Parameter

from oxygen_ros.testing.probe import Probe
from oxygen_ros.toy.sim.node import TabletopSimNode

__all__ = ["INSTRUCTIONS", "Scene", "SyntheticScene", "TabletopScene", "clean_text"]

INSTRUCTIONS = ("put the red block on the blue plate", "pick up the green block and place it in the basket")


def clean_text(text: str, limit: int = 70) -> str:
    """Printable version of a (random-model) text: control and replacement characters dropped."""
    kept = "".join(ch for ch in text if ch == " " or (unicodedata.category(ch)[0] not in "CZ" and ch != "\ufffd"))
    kept = " ".join(kept.split())
    return kept if len(kept) <= limit else kept[: limit - 1] + "…"


class Scene(Protocol):
    """What the demo loop needs from a scene."""

    name: str

    def subscribed(self) -> bool:
        """The node subscribed to what the scene publishes (discovery done)."""

    def start(self) -> None:
        """Start publishing."""

    def tick(self) -> None:
        """Called by the demo loop about once a second."""

    def note(self) -> str:
        """One line for the live table's title."""

    def rows(self) -> list[tuple[str, str]]:
        """The scene's (metric, value) rows of the live table."""

    def summary(self) -> dict[str, int]:
        """The scene's fields of :class:`oxygen_ros.toy.demo.run.DemoSummary`."""

    def close(self) -> None:
        """Stop publishing and release the scene's nodes."""


class TabletopScene:
    """The simulator node, hosted in the probe's context and executor (one process, one spin thread); a
    :class:`Scene`."""

    name = "tabletop"

    def __init__(self, probe: Probe, node: str, seed: int, ask_every_s: float = 0.0, setpoint_topic: str = "") -> None:
        """``setpoint_topic``: the simulator follows that setpoint stream (the chunk executor's JointState output)
        instead of executing the node's chunks itself."""
        self.sim = TabletopSimNode(context=probe.context, parameter_overrides=[
            Parameter("autostart", value=False), Parameter("seed", value=seed),
            Parameter("chunk_topic", value=f"{node}/action_chunk"),
            Parameter("language_topic", value=f"{node}/language_output"),
            Parameter("setpoint_topic", value=setpoint_topic), Parameter("setpoint_type", value="joint_state")])
        probe.executor.add_node(self.sim)
        self._probe = probe
        self.asker = None  # questions over the node's ~/ask action (ask_every_s > 0)
        if ask_every_s > 0:
            from .asker import QuestionAsker

            self.asker = QuestionAsker(probe, node, self.sim, ask_every_s, seed)

    def subscribed(self) -> bool:
        return self.sim.cameras_connected()

    def start(self) -> None:
        self.sim.start()

    def tick(self) -> None:
        if self.asker is not None:
            self.asker.tick()

    def note(self) -> str:
        w = self.sim.world
        return f"task: {w.instruction!r} (seed {w.seed}, step {w.steps})"

    def rows(self) -> list[tuple[str, str]]:
        c, last = self.sim.counters, self.sim.last_memory
        scored = c.memories - c.memory_unscored
        memory = "(none yet)" if last is None else (
            f"{clean_text(last[0])} ({'= truth' if last[0].strip() == last[1] else 'truth: ' + last[1]})")
        rows = [("tasks done / episodes", f"{c.successes} / {c.episodes}"),
                ("memory exact match", f"{c.memory_exact} / {scored}" + (f" ({c.memory_exact / scored:.0%})"
                                                                         if scored else "")),
                ("last memory", memory)]
        for task, score in sorted(c.tasks.items()):  # the other streams the node runs (narration, subtask)
            if task == "memory" or score.last is None:
                continue
            text, truth = score.last
            verdict = "= truth" if text.strip() == truth else f"truth: {truth}"
            rows += [(f"{task} exact match", f"{score.exact} / {score.scored} ({score.exact / score.scored:.0%})"),
                     (f"last {task}", f"{clean_text(text)} ({verdict})")]
        return rows + (self.asker.rows() if self.asker is not None else [])

    def summary(self) -> dict[str, int]:
        c = self.sim.counters
        out = {"tasks_completed": c.successes, "episodes": c.episodes, "setpoints": c.setpoints,
               "memories_scored": c.memories - c.memory_unscored, "memories_exact": c.memory_exact,
               "language_exact": {t: (s.exact, s.scored) for t, s in sorted(c.tasks.items())}}
        if self.asker is not None:
            t = self.asker.totals
            out |= {"answers_asked": t.asked, "answers_exact": t.exact, "answers_scored": t.answered}
        return out

    def close(self) -> None:
        if self.asker is not None:
            self.asker.close()
        self._probe.executor.remove_node(self.sim)
        self.sim.destroy_node()


class SyntheticScene:
    """The synthetic camera/state stream of :mod:`oxygen_ros.testing.synthetic_scene` (published by the probe) with
    changing instructions; a :class:`Scene`."""

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
