"""Bookkeeping of the simulator (ROS-free): episode records, running totals and language scoring against the
world's truth at the observation an output came from (memory, narration, subtask; answers by question)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from oxygen_ros.toy.world import TabletopWorld, answers, expert_subtask, narration_text

__all__ = ["SCORED_TASKS", "EpisodeRecord", "MemoryTruth", "SimCounters", "TRUTH_HISTORY", "TaskScore",
           "scene_truth"]

SCORED_TASKS = ("memory", "narration", "subtask")  # language tasks whose truth the world states per observation

TRUTH_HISTORY = 2048  # observation stamps whose ground-truth memory is kept for scoring


@dataclass
class EpisodeRecord:
    """One finished episode (also the JSON of its ``~/events`` line, with ``"event": "episode"``)."""

    episode: int
    seed: int
    instruction: str
    success: bool
    steps: int
    chunks: int


def scene_truth(world: TabletopWorld) -> dict[str, Any]:
    """What a perfect model says about the current observation: one text per :data:`SCORED_TASKS` task and
    ``"answers"``, every valid question -> its answer."""
    return {"memory": world.memory_text(), "narration": narration_text(world), "subtask": expert_subtask(world),
            "answers": answers(world)}


@dataclass
class TaskScore:
    """Outputs of one language task: received, matched to a published observation, equal to its truth."""

    received: int = 0
    scored: int = 0
    exact: int = 0
    last: tuple[str, str] | None = None  # (text, truth) of the newest scored one

    def add(self, text: str, truth: str | None) -> bool | None:
        """Count one output against ``truth`` (None: its observation is unknown); whether it was exact."""
        self.received += 1
        if truth is None:
            return None
        self.scored += 1
        exact = text.strip() == truth
        self.exact += int(exact)
        self.last = (text, truth)
        return exact


@dataclass
class SimCounters:
    """Running totals (the node logs them at shutdown)."""

    episodes: int = 0
    successes: int = 0
    chunks: int = 0
    stale_chunks: int = 0
    rejected_chunks: int = 0
    setpoints: int = 0  # setpoint_topic: setpoints taken (stale: commanded before the episode; rejected: malformed)
    stale_setpoints: int = 0
    rejected_setpoints: int = 0
    memories: int = 0
    memory_exact: int = 0
    memory_unscored: int = 0
    tasks: dict[str, TaskScore] = field(default_factory=dict)  # every scored task (memory included), by task

    @property
    def memories_scored(self) -> int:
        """Memories matched to a published observation."""
        return self.memories - self.memory_unscored

    def summary(self) -> str:
        """One line of totals (the node's shutdown log)."""
        return (f"{self.successes}/{self.episodes} tasks, memory exact {self.memory_exact}/{self.memories_scored}, "
                f"chunks {self.chunks} (stale {self.stale_chunks}, rejected {self.rejected_chunks})"
                + (f", setpoints {self.setpoints} (stale {self.stale_setpoints}, rejected {self.rejected_setpoints})"
                   if self.setpoints or self.stale_setpoints or self.rejected_setpoints else ""))


class MemoryTruth:
    """The world's truth per published observation stamp (the newest ``capacity`` kept): a memory text, or any
    record of the scene (the simulator keeps ``{task: text, "answers": {question: answer}}``)."""

    def __init__(self, capacity: int = TRUTH_HISTORY) -> None:
        self.capacity = capacity
        self._truth: dict[int, Any] = {}

    def record(self, stamp_ns: int, truth: Any) -> None:
        """Remember the truth of the observation stamped ``stamp_ns``; forget the oldest beyond ``capacity``."""
        self._truth[stamp_ns] = truth
        while len(self._truth) > self.capacity:
            del self._truth[next(iter(self._truth))]

    def get(self, stamp_ns: int) -> Any:
        """The truth of the observation stamped ``stamp_ns``, or None when unknown (never published, forgotten)."""
        return self._truth.get(stamp_ns)

    def __len__(self) -> int:
        return len(self._truth)
