"""One control frame, defined once: prepare the observation, start the frame's language request, run the engine,
turn the chunk into robot units the moment it is denoised, and time it all the same way everywhere.

The node, the bag evaluation and the toy closed-loop evaluation are shells around :class:`FrameRunner`: they
differ only in where observations come from and where outputs go.

Latencies (seconds, ``time.monotonic``):

- ``inference_s``: frame start (``step`` called) -> robot-unit chunk ready;
- ``latency_s``: arrival of the newest input the frame used (``arrived``; the frame start when not given, e.g.
  offline) -> chunk ready. This is ``ActionChunk.inference_latency``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.requests import Frame, FrameResult, LanguageRequest
from oxygen_ros.engine.tokenizer import CUSTOM_TASK, LANGUAGE_TEMPLATES

from .policy import Policy, PreparedObservation, RawObservation

__all__ = ["ChunkOutput", "FrameOutput", "FrameRunner", "LanguageSchedule", "seeded_noise"]


@dataclass(frozen=True)
class LanguageSchedule:
    """Which frames start a language request, and which.

    every_n_frames: a request on every n-th processed frame (0: no language).
    task: memory | narration | subtask | custom.
    prompt: template fed after the shared prefix (``{instruction}`` replaced); '' = the task's built-in prompt.
    """

    every_n_frames: int = 0
    task: str = "memory"
    prompt: str = ""
    max_new_tokens: int = 30
    max_prompt_tokens: int = 16

    def __post_init__(self) -> None:
        if self.task not in (*LANGUAGE_TEMPLATES, CUSTOM_TASK):
            raise ValueError(f"language task must be one of {[*LANGUAGE_TEMPLATES, CUSTOM_TASK]}, got {self.task!r}")
        if self.task == CUSTOM_TASK and not self.prompt:
            raise ValueError("a custom language task needs a prompt")


@dataclass
class ChunkOutput:
    """A denoised chunk in robot units, handed out before any language work of its frame."""

    frame_index: int
    stamp_ns: int
    actions: np.ndarray  # [n_execute, D]: the part the robot executes
    chunk: np.ndarray  # [H, D]: everything the model denoised
    latency_s: float
    inference_s: float


@dataclass
class FrameOutput:
    """What one frame produced."""

    chunk: ChunkOutput
    result: FrameResult
    prepared: PreparedObservation
    preprocess_s: float
    new_requests: int


def seeded_noise(seed: int) -> Callable[[int, int, int], torch.Tensor]:
    """Noise x_1 [1, H, A] fixed by (seed, frame index): reproducible runs, the same for every engine mode."""

    def noise(frame_index: int, horizon: int, dim: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed + frame_index)
        return torch.randn(1, horizon, dim, generator=gen)

    return noise


class FrameRunner:
    """Drives an engine with a policy, one frame per :meth:`step`.

    Args:
        policy: checkpoint contract, model and tokenizer.
        engine_factory: builds the engine (again after a failed frame, see :meth:`reset`).
        language: the request schedule.
        noise: ``noise(frame_index, H, A)`` -> [1, H, A]; default :func:`seeded_noise` (seed 0).
        n_execute: actions of each chunk to execute (default: the checkpoint's ``n_action_steps``).
    """

    def __init__(self, policy: Policy, engine_factory: Callable[[], Engine], language: LanguageSchedule | None = None,
                 noise: Callable[[int, int, int], torch.Tensor] | None = None, n_execute: int | None = None) -> None:
        self.policy = policy
        self._factory = engine_factory
        self.engine = engine_factory()
        self.language = language or LanguageSchedule()
        self.noise = noise or seeded_noise(0)
        self.n_execute = int(n_execute or policy.spec.n_action_steps)
        if not 0 < self.n_execute <= policy.spec.chunk_size:
            raise ValueError(f"n_execute {self.n_execute} must be in 1..{policy.spec.chunk_size} (the chunk size)")
        self.processed = 0
        self._prompt_cache: tuple[str, list[int]] | None = None

    @property
    def backlog(self) -> int:
        """Unfinished language requests."""
        return self.engine.backlog

    def reset(self) -> None:
        """A fresh engine (after a failed frame: its in-flight requests are lost)."""
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()
        self.engine = self._factory()

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    def request_tokens(self, instruction: str) -> list[int]:
        """Prompt tokens of this instruction's request (cached for a repeated instruction)."""
        if self._prompt_cache is not None and self._prompt_cache[0] == instruction:
            return self._prompt_cache[1]
        lang, tok = self.language, self.policy.tokenizer
        if lang.prompt:
            tokens = tok.encode(lang.prompt.format(instruction=instruction))[: lang.max_prompt_tokens]
        else:
            tokens = tok.tokenize_request(lang.task, None, max_len=lang.max_prompt_tokens)
        self._prompt_cache = (instruction, tokens)
        return tokens

    def step(self, observation: RawObservation | PreparedObservation, *, stamp_ns: int = 0,
             arrived: float | None = None, instruction: str | None = None, start_language: bool = True,
             on_chunk: Callable[[ChunkOutput], None] | None = None) -> FrameOutput:
        """Run one frame. ``on_chunk`` gets the robot-unit chunk before any decoding of the frame.

        ``arrived`` is the ``time.monotonic()`` instant the newest input arrived; ``instruction`` the request
        prompt's instruction (default: the observation's task).
        """
        t0 = time.monotonic()
        if isinstance(observation, RawObservation):
            instruction = observation.task if instruction is None else instruction
            prepared = self.policy.prepare(observation)
        else:
            prepared = observation
        t_prep = time.monotonic()
        index = self.engine.frame_index
        lang = self.language
        requests = []
        if start_language and lang.every_n_frames and self.processed % lang.every_n_frames == 0:
            prompt = list(self.request_tokens(instruction or ""))
            requests.append(LanguageRequest(lang.task, lang.max_new_tokens, prompt))
        spec = self.policy.spec
        noise = self.noise(index, spec.chunk_size, self.policy.model.config.action_dim)
        out: list[ChunkOutput] = []

        def handle(frame_index: int, chunks: list[torch.Tensor]) -> None:
            robot = self.policy.postprocess(chunks[0], prepared)
            now = time.monotonic()
            since = t0 if arrived is None else arrived
            chunk = ChunkOutput(frame_index, stamp_ns, robot[: self.n_execute], robot, now - since, now - t0)
            out.append(chunk)
            if on_chunk is not None:
                on_chunk(chunk)

        result = self.engine.step(Frame(prepared.observation, requests, noise, stamp=stamp_ns), on_actions=handle)
        self.processed += 1
        if not out:  # engines always call back; keep the contract even if one did not
            handle(result.frame_index, result.actions)
        return FrameOutput(out[0], result, prepared, t_prep - t0, len(requests))
