"""Request bookkeeping for cross-frame continuous batching: slots, admission, the per-frame budget k.

Nothing here touches K/V tensors: a request owns one slot of the preallocated ``KVCache`` from admission to
eviction, and the model writes into that slot in place.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from .requests import FinishedRequest, LanguageRequest

OVERFLOW_POLICIES = ("reject_newest", "drop_oldest")


class SlotAllocator:
    """Free list of cache slots; always hands out the lowest free slot so live slots stay packed."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._free = list(range(num_slots))
        heapq.heapify(self._free)

    def alloc(self) -> int:
        if not self._free:
            raise RuntimeError("KV pool exhausted (admission control should prevent this)")
        return heapq.heappop(self._free)

    def free(self, slot: int) -> None:
        heapq.heappush(self._free, slot)

    @property
    def num_free(self) -> int:
        return len(self._free)


@dataclass
class RequestState:
    """A resumable language request: its slot, where it writes next, what it has produced."""

    request_id: int
    request: LanguageRequest
    slot: int
    frame_index: int
    stamp: Any
    prefix_len: int  # padded prefix length P of its slot
    num_valid: int  # valid prefix tokens = position of its first appended token
    start_time: float
    tokens: list[int] = field(default_factory=list)
    fed: int = 0  # tokens appended to its cache so far
    steps: int = 0  # positions advanced in total
    frame_steps: int = 0  # positions advanced in the current frame
    eos: bool = False
    frames: int = 1

    @property
    def next_token(self) -> int:
        prompt = self.request.prompt_tokens
        return prompt[self.fed] if self.fed < len(prompt) else self.tokens[-1]

    @property
    def done(self) -> bool:
        return self.eos or len(self.tokens) >= self.request.max_new_tokens

    def emit(self, token: int, eos_id: int) -> None:
        self.tokens.append(token)
        self.eos = token == eos_id

    def finish(self, now: float, dropped: bool = False) -> FinishedRequest:
        return FinishedRequest(self.request_id, self.request.task, self.frame_index, self.stamp, list(self.tokens),
                               self.eos, now - self.start_time, self.frames, dropped)


class BudgetController:
    """Per-frame decode budget: a fixed k, or ``auto``: as many batched steps as fit before the frame deadline.

    ``auto`` keeps an exponential moving average of the measured decode-step time per batch size and picks
    k = floor(time left * safety / step cost), at least ``k_min`` (so language always progresses) and no more
    than the backlog needs.
    """

    def __init__(self, k: int | str, deadline_s: float | None = None, k_min: int = 1, k_max: int = 64,
                 safety: float = 0.9, ema: float = 0.3) -> None:
        if k != "auto" and (not isinstance(k, int) or k < 1):
            raise ValueError(f"k must be a positive integer or 'auto', got {k!r}")
        if k == "auto" and not deadline_s:
            raise ValueError("k='auto' needs a frame deadline (deadline_s)")
        self.k, self.deadline_s, self.k_min, self.k_max = k, deadline_s, k_min, k_max
        self.safety, self.ema = safety, ema
        self._cost: dict[int, float] = {}

    @property
    def auto(self) -> bool:
        return self.k == "auto"

    def observe(self, batch: int, seconds: float) -> None:
        old = self._cost.get(batch)
        self._cost[batch] = seconds if old is None else (1 - self.ema) * old + self.ema * seconds

    def step_cost(self, batch: int) -> float | None:
        if batch in self._cost:
            return self._cost[batch]
        larger = [b for b in self._cost if b >= batch]
        if larger:  # a bigger batch is an upper bound
            return self._cost[min(larger)]
        if self._cost:  # extrapolate from the largest measured batch, linearly in rows
            b = max(self._cost)
            return self._cost[b] * batch / b
        return None

    def budget(self, elapsed_s: float, batch: int, backlog_steps: int) -> int:
        """Decode steps for this frame, given the time already spent and the current in-flight batch."""
        if not self.auto:
            return int(self.k)
        cost = self.step_cost(max(batch, 1))
        if cost is None:
            return self.k_min  # first frame: measure
        fit = math.floor(max(self.deadline_s - elapsed_s, 0.0) * self.safety / cost)
        return max(self.k_min, min(fit, self.k_max, max(backlog_steps, self.k_min)))
