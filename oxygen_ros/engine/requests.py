"""What goes into and comes out of one engine frame."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .observation import Observation


@dataclass
class LanguageRequest:
    """A language task started from a frame's observation (memory, narration, subtask, ...).

    ``prompt_tokens`` (optional, no BOS) are fed after the shared prefix before generation starts; with none,
    the first token comes straight from the prefix (the paper's setting).
    """

    task: str = "memory"
    max_new_tokens: int = 30
    prompt_tokens: list[int] = field(default_factory=list)

    @property
    def total_steps(self) -> int:
        """Positions the request advances through: prompt tokens fed + tokens generated, minus the one the
        prefix (no prompt) or the last prompt token's forward yields for free."""
        return self.max_new_tokens + max(len(self.prompt_tokens) - 1, 0)


@dataclass
class Frame:
    """One control frame: a batch-of-one observation, new language requests, optional fixed noise."""

    observation: Observation
    requests: list[LanguageRequest] = field(default_factory=list)
    noise: torch.Tensor | list[torch.Tensor] | None = None  # [1, H, A] per action head
    stamp: Any = None  # the observation time, carried into results unchanged


@dataclass
class FinishedRequest:
    """A language request that completed (EOS or max tokens) or was dropped."""

    request_id: int
    task: str
    frame_index: int  # originating frame
    stamp: Any  # originating frame's observation stamp
    tokens: list[int]
    eos: bool  # True: ended at EOS (included in tokens); False: reached max_new_tokens (truncated)
    latency_s: float  # from the start of the originating frame to completion
    frames: int  # frames it spanned
    dropped: bool = False  # evicted by the drop_oldest overflow policy before finishing
    text: str | None = None


@dataclass
class FrameResult:
    frame_index: int
    actions: list[torch.Tensor]  # one [H, A] float32 chunk per action head
    finished: list[FinishedRequest]
    timings: dict[str, float]  # seconds: prefill, denoise, decode, manager, frame
    batch_sizes: list[int]  # rows advanced in each batched decode forward of this frame
    tokens_generated: int  # real tokens emitted this frame (no padding, nothing after EOS)
    inflight: int  # unfinished requests after this frame
    rejected: int = 0  # new requests refused this frame (pool full, reject_newest)
    dropped: int = 0  # in-flight requests evicted this frame (pool full, drop_oldest)
    decode_steps: int = 0  # batched decode forwards this frame
    stamp: Any = None


# ``on_actions(frame_index, chunks)``: called with a frame's action chunks (one per head) before its language work.
ActionCallback = Callable[[int, list[torch.Tensor]], None]
