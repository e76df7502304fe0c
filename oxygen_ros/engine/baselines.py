"""The baselines OxyGen is compared against, built from the same engine.

``shared_kv`` and ``isolated`` are configurations of the one frame pipeline (``MODE_SPECS`` in ``modes.py``): no
cross-frame batching, each request decoded to completion on the frame's slot, from the action prefix or from a
second prefill. ``parallel`` (MPS-style) composes two such engines, each on its own model copy, and runs a frame's
action work and language work concurrently.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import torch
from torch import nn

from .lora import LoraAdapter
from .model import Pi05Model
from .modes import EngineConfig, ModeSpec
from .requests import ActionCallback, Frame, FrameResult
from .scheduler import RequestState
from .speculative import acceptance_rate

# Each parallel worker runs the isolated pipeline: one slot, its own prefill, requests to completion.
WORKER_SPEC = ModeSpec(batched=False, reprefill=True)


class Worker(Protocol):
    """What ``ParallelEngine`` needs of its two workers (``Engine`` provides it)."""

    frame_index: int

    @property
    def backlog(self) -> int: ...

    @property
    def inflight(self) -> list[RequestState]: ...

    @property
    def graphs_backend(self) -> str: ...

    def memory_bytes(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    def cancel(self, tag: object) -> bool: ...

    def partial(self, tag: object) -> list[int] | None: ...

    def step(self, frame: Frame, on_actions: ActionCallback | None = None) -> FrameResult: ...

    def step_language(self, frame: Frame) -> FrameResult: ...


class ParallelEngine:
    """The MPS-style baseline: an action worker and a language worker, each an engine with its own model copy, run
    every frame concurrently; the frame ends when the slower one does. ``Engine``'s public API (``step``, ``config``,
    ``frame_index``, ``backlog``, ``inflight``, ``totals``, ``cancel``, ``partial``, ``memory_bytes``) plus
    ``close``."""

    def __init__(self, action_worker: Worker, language_worker: Worker, config: EngineConfig) -> None:
        self.config = config
        self.action_worker = action_worker
        self.language_worker = language_worker
        self.totals = {"rejected": 0, "dropped": 0, "finished": 0, "tokens": 0, "drafted": 0, "draft_accepted": 0}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="language-worker")
        # on CUDA the language worker launches on a stream of its own, so its kernels can overlap the action
        # worker's (both on the default stream would serialise them); elsewhere None
        dev = getattr(language_worker, "device", torch.device("cpu"))
        self.language_stream = torch.cuda.Stream(device=dev) if dev.type == "cuda" else None

    @classmethod
    def build(cls, make_engine: Callable[..., Worker], model: Pi05Model, config: EngineConfig,
              heads: nn.ModuleList | None = None, adapter: LoraAdapter | None = None,
              adapter_tasks: set[str] | None = None, detokenize: Callable[[list[int]], str] | None = None,
              adapters: Mapping[str, LoraAdapter] | None = None) -> ParallelEngine:
        """Both workers from ``make_engine`` (the ``Engine`` class): actions on ``model`` with every head, language
        on a deep copy of it."""
        actions = make_engine(model, config, heads, adapter, adapter_tasks, detokenize, spec=WORKER_SPEC,
                              adapters=adapters)
        language = make_engine(copy.deepcopy(model), config, adapter=adapter, adapter_tasks=adapter_tasks,
                               detokenize=detokenize, spec=WORKER_SPEC, adapters=adapters)
        return cls(actions, language, config)

    @property
    def frame_index(self) -> int:
        """Frames run so far."""
        return self.action_worker.frame_index

    @property
    def backlog(self) -> int:
        """Unfinished language requests (none between frames: every request runs to completion)."""
        return self.action_worker.backlog + self.language_worker.backlog

    @property
    def inflight(self) -> list[RequestState]:
        """Unfinished language requests, as ``Engine.inflight`` (empty between frames)."""
        return self.action_worker.inflight + self.language_worker.inflight

    @property
    def acceptance_rate(self) -> float | None:
        """Speculative decoding: accepted / drafted tokens so far (None before any draft)."""
        return acceptance_rate(self.totals)

    def cancel(self, tag: object) -> bool:
        """As ``Engine.cancel`` (between frames nothing is in flight here: every request runs within its frame)."""
        return self.language_worker.cancel(tag) or self.action_worker.cancel(tag)

    def partial(self, tag: object) -> list[int] | None:
        """As ``Engine.partial``."""
        tokens = self.language_worker.partial(tag)
        return tokens if tokens is not None else self.action_worker.partial(tag)

    @property
    def graphs_backend(self) -> str:
        """The workers' ``graphs`` backend (both are built from one config)."""
        return self.action_worker.graphs_backend

    def memory_bytes(self) -> int:
        """Parameters + KV pools of both workers."""
        return self.action_worker.memory_bytes() + self.language_worker.memory_bytes()

    def step(self, frame: Frame, on_actions: ActionCallback | None = None) -> FrameResult:
        """The frame's language requests go to the language worker while the action worker prefills and denoises;
        the result merges both (actions from one, language and its timings from the other)."""
        t0 = time.perf_counter()
        language = self._pool.submit(self._language_step, frame)
        result = self.action_worker.step(dataclasses.replace(frame, requests=[]), on_actions)
        lr = language.result()
        result.finished, result.tokens_generated = lr.finished, lr.tokens_generated
        result.batch_sizes, result.decode_steps, result.rejected = lr.batch_sizes, lr.decode_steps, lr.rejected
        result.rejected_requests = lr.rejected_requests
        result.drafted, result.draft_accepted = lr.drafted, lr.draft_accepted
        for stage in ("language_prefill", "decode"):
            result.timings[stage] = lr.timings.get(stage, 0.0)
        result.timings["frame"] = time.perf_counter() - t0
        result.add_to(self.totals)
        return result

    def _language_step(self, frame: Frame) -> FrameResult:
        """The language worker's frame, on its own CUDA stream when there is one (the current stream is per
        thread: set here, in the worker's thread). Its tokens are read on the host, which waits for the stream."""
        if self.language_stream is None:
            return self.language_worker.step_language(frame)
        with torch.cuda.stream(self.language_stream):
            return self.language_worker.step_language(frame)

    def close(self) -> None:
        """Stop the language worker's thread."""
        self._pool.shutdown(wait=True)
