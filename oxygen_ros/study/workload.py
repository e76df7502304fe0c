"""Language request arrival patterns for benchmarks and tests (deterministic given a seed)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oxygen_ros.engine.requests import LanguageRequest

KINDS = ("every_frame", "every_n", "burst", "poisson", "random_length")


@dataclass
class Workload:
    """Which language requests arrive at each frame.

    every_frame    one request of N tokens per frame (the paper's default)
    every_n        one request every ``period`` frames
    burst          ``burst_size`` requests at once every ``period`` frames
    poisson        Poisson(``rate``) requests per frame
    random_length  one request per frame, N uniform in [min_tokens, max_tokens]
    """

    kind: str = "every_frame"
    max_new_tokens: int = 30
    period: int = 1
    burst_size: int = 4
    rate: float = 1.0
    min_tokens: int = 5
    max_tokens: int = 30
    task: str = "memory"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"workload kind must be one of {KINDS}, got {self.kind!r}")
        self._rng = np.random.default_rng(self.seed)

    def _req(self, n: int) -> LanguageRequest:
        return LanguageRequest(task=self.task, max_new_tokens=int(n))

    def requests(self, frame: int) -> list[LanguageRequest]:
        """Requests arriving at ``frame`` (call with consecutive frames for the seeded kinds)."""
        if self.kind == "every_frame":
            return [self._req(self.max_new_tokens)]
        if self.kind == "every_n":
            return [self._req(self.max_new_tokens)] if frame % self.period == 0 else []
        if self.kind == "burst":
            return [self._req(self.max_new_tokens) for _ in range(self.burst_size)] if frame % self.period == 0 else []
        if self.kind == "poisson":
            return [self._req(self.max_new_tokens) for _ in range(self._rng.poisson(self.rate))]
        return [self._req(self._rng.integers(self.min_tokens, self.max_tokens + 1))]

    def schedule(self, frames: int) -> list[list[LanguageRequest]]:
        """The requests of frames 0..frames-1 (a fresh, reproducible sequence)."""
        self._rng = np.random.default_rng(self.seed)
        return [self.requests(f) for f in range(frames)]
