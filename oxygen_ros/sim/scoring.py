"""Bookkeeping of the simulator (ROS-free): episode records, running totals and memory scoring against the
world's truth at the observation a memory came from."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EpisodeRecord", "MemoryTruth", "SimCounters", "TRUTH_HISTORY"]

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


@dataclass
class SimCounters:
    """Running totals (the node logs them at shutdown)."""

    episodes: int = 0
    successes: int = 0
    chunks: int = 0
    stale_chunks: int = 0
    rejected_chunks: int = 0
    memories: int = 0
    memory_exact: int = 0
    memory_unscored: int = 0

    @property
    def memories_scored(self) -> int:
        """Memories matched to a published observation."""
        return self.memories - self.memory_unscored

    def summary(self) -> str:
        """One line of totals (the node's shutdown log)."""
        return (f"{self.successes}/{self.episodes} tasks, memory exact {self.memory_exact}/{self.memories_scored}, "
                f"chunks {self.chunks} (stale {self.stale_chunks}, rejected {self.rejected_chunks})")


class MemoryTruth:
    """The world's ground-truth memory text per published observation stamp (the newest ``capacity`` kept)."""

    def __init__(self, capacity: int = TRUTH_HISTORY) -> None:
        self.capacity = capacity
        self._truth: dict[int, str] = {}

    def record(self, stamp_ns: int, truth: str) -> None:
        """Remember the truth of the observation stamped ``stamp_ns``; forget the oldest beyond ``capacity``."""
        self._truth[stamp_ns] = truth
        while len(self._truth) > self.capacity:
            del self._truth[next(iter(self._truth))]

    def get(self, stamp_ns: int) -> str | None:
        """The truth of the observation stamped ``stamp_ns``, or None when unknown (never published, forgotten)."""
        return self._truth.get(stamp_ns)

    def __len__(self) -> int:
        return len(self._truth)
