"""What goes into and comes out of one engine frame."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .observation import Observation
from .rtc import RTCPrefix


@dataclass
class LanguageRequest:
    """A language task started from a frame's observation (memory, narration, subtask, ...).

    ``prompt_tokens`` (optional, no BOS) are fed after the shared prefix before generation starts; with none,
    the first token comes straight from the prefix (the paper's setting). ``tag`` is the caller's handle on the
    request (e.g. an action goal): carried unchanged into its ``RequestState``, ``FinishedRequest`` and
    ``FrameResult.rejected_requests``, and what ``Engine.cancel`` / ``Engine.partial`` look it up by (``==``).
    """

    task: str = "memory"
    max_new_tokens: int = 30
    prompt_tokens: list[int] = field(default_factory=list)
    stream: str = ""  # with ``task``, names the stream whose last output drafts this one (speculative decoding)
    priority: int = 0  # k="auto": when the frame's time runs short, higher-priority rows get the extra steps
    adapter: str = ""  # name of the suffix LoRA its rows decode with ('' = the engine's default for its task)
    tag: object = field(default=None, compare=False)  # the caller's handle (see above)

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
    # real-time chunking: the previous chunk's remainder the first head's chunk continues (EngineConfig.rtc)
    rtc: RTCPrefix | None = None
    # the ``time.perf_counter`` instant the frame should end by (a control tick's deadline), which ``k = auto``
    # budgets decoding against; None: ``EngineConfig.deadline_s`` after the frame's start
    deadline: float | None = None


@dataclass
class FinishedRequest:
    """A language request that completed (EOS or max tokens), was dropped, or was cancelled (``Engine.cancel``:
    ``tokens`` are those generated until then)."""

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
    stream: str = ""  # the request's stream (LanguageRequest.stream)
    tag: object = None  # the request's LanguageRequest.tag
    cancelled: bool = False  # evicted by Engine.cancel before finishing (not counted as dropped)


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
    drafted: int = 0  # speculative draft tokens fed this frame
    draft_accepted: int = 0  # of which accepted (identical to what plain decoding generates)
    stamp: Any = None
    guided: bool = False  # the first head's chunk was guided by real-time chunking (Frame.rtc under EngineConfig.rtc)
    # the new requests refused this frame, each with its reason: "pool full", "prompt too long" or
    # "max_new_tokens out of range" (``rejected`` counts them)
    rejected_requests: list[tuple[LanguageRequest, str]] = field(default_factory=list)
    # ``Engine.step_batch``: per observation of the batch, its chunks (one per head); ``actions`` stays empty
    batch_actions: list[list[torch.Tensor]] = field(default_factory=list)

    def add_to(self, totals: dict[str, int]) -> None:
        """Count this frame into an engine's running ``totals``."""
        totals["rejected"] += self.rejected
        totals["dropped"] += self.dropped
        totals["finished"] += len(self.finished)
        totals["tokens"] += self.tokens_generated
        totals["drafted"] += self.drafted
        totals["draft_accepted"] += self.draft_accepted


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
    def tag(self) -> object:
        """The request's ``LanguageRequest.tag``."""
        return self.request.tag

    @property
    def next_token(self) -> int:
        """The token its next decode step feeds: the next prompt token, then its last generated one."""
        prompt = self.request.prompt_tokens
        return prompt[self.fed] if self.fed < len(prompt) else self.tokens[-1]

    @property
    def done(self) -> bool:
        """Ended at EOS or reached its ``max_new_tokens``."""
        return self.eos or len(self.tokens) >= self.request.max_new_tokens

    def emit(self, token: int, eos_id: int) -> None:
        """Record a generated token."""
        self.tokens.append(token)
        self.eos = token == eos_id

    def finish(self, now: float, dropped: bool = False, cancelled: bool = False) -> FinishedRequest:
        """Its result, with the latency from its frame's start to ``now``."""
        return FinishedRequest(self.request_id, self.request.task, self.frame_index, self.stamp, list(self.tokens),
                               self.eos, now - self.start_time, self.frames, dropped, stream=self.request.stream,
                               tag=self.request.tag, cancelled=cancelled)


# ``on_actions(frame_index, chunks)``: called with a frame's action chunks (one per head) before its language work.
ActionCallback = Callable[[int, list[torch.Tensor]], None]
# ``on_actions(i, chunks)`` of ``Engine.step_batch``: observation i's chunks, as soon as the whole batch is denoised.
BatchActionCallback = Callable[[int, list[torch.Tensor]], None]
