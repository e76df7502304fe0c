"""Language streams: when a stream starts a request (:class:`LanguageSchedule`, its :class:`StreamClock`) and
whose request it is when runners share one engine (:class:`StreamTag`)."""

from __future__ import annotations

from dataclasses import dataclass

from oxygen_ros.engine.tokenizer import CUSTOM_TASK, LANGUAGE_TEMPLATES

__all__ = ["TRIGGERS", "LanguageSchedule", "StreamClock", "StreamTag"]


TRIGGERS = ("periodic", "on_instruction_change", "continuous")


@dataclass(frozen=True)
class LanguageSchedule:
    """One language stream: which frames start one of its requests, and what the request is.

    every_n_frames: a request on every n-th processed frame (0: not frame-counted).
    task: memory | narration | subtask | custom.
    prompt: template fed after the shared prefix (``{instruction}`` replaced); '' = the task's built-in prompt.
    name: the stream's name (LanguageOutput.stream); '' = the task's.
    period_s: a request when at least this much observation time (the frame stamps) passed since the stream's
        last one (0: not timed). With both cadences, either starts one.
    trigger: periodic (the cadences above) | on_instruction_change (one request for each new instruction) |
        continuous (the next request on the frame after the last one finished: one always in flight).
    priority: streams starting on the same frame are admitted in descending priority (ties: configured order),
        so under a full pool with reject_newest the higher-priority request gets the slot; under ``k=auto`` the
        frame's spare decode time goes to higher-priority rows first (every row still advances each frame).
    adapter: name of the engine adapter (``Engine(adapters=...)``) its requests decode with; rows of different
        adapters still share one batched forward.
    """

    every_n_frames: int = 0
    task: str = "memory"
    prompt: str = ""
    max_new_tokens: int = 30
    max_prompt_tokens: int = 16
    name: str = ""
    period_s: float = 0.0
    trigger: str = "periodic"
    priority: int = 0
    adapter: str = ""  # the engine's suffix LoRA its requests decode with ('' = the engine's default)

    def __post_init__(self) -> None:
        if self.task not in (*LANGUAGE_TEMPLATES, CUSTOM_TASK):
            raise ValueError(f"language task must be one of {[*LANGUAGE_TEMPLATES, CUSTOM_TASK]}, got {self.task!r}")
        if self.task == CUSTOM_TASK and not self.prompt:
            raise ValueError("a custom language task needs a prompt")
        if self.trigger not in TRIGGERS:
            raise ValueError(f"trigger must be one of {list(TRIGGERS)}, got {self.trigger!r}")
        if self.every_n_frames < 0 or self.period_s < 0:
            raise ValueError("every_n_frames and period_s must be >= 0")

    @property
    def stream(self) -> str:
        """The stream's name."""
        return self.name or self.task

    @property
    def active(self) -> bool:
        """Whether it ever starts a request."""
        return self.trigger != "periodic" or self.every_n_frames > 0 or self.period_s > 0


class StreamClock:
    """When a stream last started a request (frame count, stamp, instruction) and whether it is due now."""

    def __init__(self, schedule: LanguageSchedule) -> None:
        self.schedule = schedule
        self.last_stamp_ns: int | None = None
        self.last_instruction: str | None = None

    def due(self, processed: int, stamp_ns: int, instruction: str, busy: bool = False) -> bool:
        """Whether the stream starts a request now; ``busy``: one of its requests is still in flight."""
        s = self.schedule
        if s.trigger == "on_instruction_change":
            return bool(instruction) and instruction != self.last_instruction
        if s.trigger == "continuous":
            return not busy
        if s.every_n_frames and processed % s.every_n_frames == 0:
            return True
        return s.period_s > 0 and (self.last_stamp_ns is None
                                   or stamp_ns - self.last_stamp_ns >= round(s.period_s * 1e9))

    def started(self, stamp_ns: int, instruction: str) -> None:
        self.last_stamp_ns, self.last_instruction = stamp_ns, instruction


@dataclass(frozen=True)
class StreamTag:
    """The ``LanguageRequest.tag`` of a stream request started by a runner that has an ``owner`` (runners sharing
    one engine, e.g. a server's clients): whose request it is."""

    owner: object
    stream: str
    frame: int  # the runner's frame count when it started
