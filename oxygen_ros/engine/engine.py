"""The frame pipeline: one control frame per ``Engine.step``, every mode (``modes.py``) and baseline alike.

  prefill (once) -> denoise (every action head) -> ``on_actions`` callback -> admit -> decode -> finished

The engine only sequences and times the stages; the :class:`~.model_runner.ModelRunner` makes every model call and
builds the decode batches, the :class:`~.scheduler.Scheduler` admits, evicts and picks what decodes this frame.
The ``parallel`` baseline (two engines, concurrently) is in ``baselines.py``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .baselines import ParallelEngine
from .kv_cache import KVCache
from .lora import LoraAdapter
from .model import Pi05Model, Prefix
from .model_runner import ModelRunner
from .modes import UNBOUNDED, EngineConfig, ModeSpec
from .observation import Observation, stack_observations
from .requests import ActionCallback, BatchActionCallback, FinishedRequest, Frame, FrameResult, LanguageRequest
from .rtc import RTCPrefix
from .scheduler import BudgetController, RequestState, Scheduler, SlotAllocator
from .speculative import DraftSource, LastOutputDrafts, acceptance_rate
from .timing import Stopwatch

log = logging.getLogger(__name__)


__all__ = ["UNBOUNDED", "ActionCallback", "BatchActionCallback", "Engine", "EngineConfig", "FinishedRequest",
           "Frame", "FrameResult", "LanguageRequest", "ParallelEngine", "build_engine"]


@dataclass
class _FrameRun:
    """What the stages of one frame share."""

    sw: Stopwatch
    t0: float
    result: FrameResult


class Engine:
    """Runs one control frame at a time: ``step(frame) -> FrameResult``.

    ``spec`` overrides the pipeline shape of ``config.mode`` (the parallel baseline's workers use it).
    """

    def __init__(
        self,
        model: Pi05Model,
        config: EngineConfig | None = None,
        heads: nn.ModuleList | None = None,
        adapter: LoraAdapter | None = None,
        adapter_tasks: set[str] | None = None,
        detokenize: Callable[[list[int]], str] | None = None,
        spec: ModeSpec | None = None,
        drafts: DraftSource | None = None,
        adapters: Mapping[str, LoraAdapter] | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.config.validate()
        self.spec = spec or self.config.spec
        if self.spec.concurrent:
            raise ValueError("a concurrent mode runs two engines: build it with build_engine() (a ParallelEngine)")
        num_slots = self.config.max_inflight + 1 if self.spec.batched else 1
        self.runner = ModelRunner(model, self.config, num_slots, heads, adapter, adapter_tasks, adapters)
        if self.runner.graphs is not None and self.runner.graphs.backend in ("cuda", "compile", "aot"):
            try:
                self.runner.graphs.warm_up()  # capture / compile / load every step now, not inside a frame
            except Exception as e:  # noqa: BLE001 - a default (auto) must not stop a node: fall back to eager
                if self.config.graphs != "auto":
                    raise
                log.warning("graphs auto: %s steps failed (%s: %s); running eager", self.runner.graphs.backend,
                            type(e).__name__, e)
                self.runner.graphs = None
        if self.runner.graphs is not None and self.config.graph_stages == "auto":
            self.runner.choose_graph_stages()
        if self.config.speculate and drafts is None:
            drafts = LastOutputDrafts()
        self.scheduler = Scheduler(self.config, num_slots, batched=self.spec.batched,
                                   drafts=drafts if self.config.speculate else None)
        if not self.config.speculate:  # one-token forwards run the static step's bucket (multi-token ones: the span)
            self.scheduler.forward_rows = self.runner.forward_rows
        self.detokenize = detokenize
        self.frame_index = 0
        self._cancelled: list[FinishedRequest] = []  # cancelled between frames, reported with the next frame
        self.totals = {"rejected": 0, "dropped": 0, "finished": 0, "tokens": 0, "drafted": 0, "draft_accepted": 0}

    # ------------------------------------------------------------------------------------------ public API
    @property
    def backlog(self) -> int:
        """Unfinished language requests."""
        return len(self.scheduler.inflight)

    @property
    def inflight(self) -> list[RequestState]:
        """The unfinished language requests, oldest first."""
        return self.scheduler.inflight

    @property
    def slots(self) -> SlotAllocator:
        """The KV pool's slot allocator."""
        return self.scheduler.slots

    @property
    def budget(self) -> BudgetController:
        """The per-frame decode budget."""
        return self.scheduler.budget

    @property
    def model(self) -> Pi05Model:
        """The model this engine runs."""
        return self.runner.model

    @property
    def cache(self) -> KVCache:
        """The KV pool."""
        return self.runner.cache

    @property
    def acceptance_rate(self) -> float | None:
        """Speculative decoding: accepted / drafted tokens so far (None before any draft)."""
        return acceptance_rate(self.totals)

    def cancel(self, tag: object) -> bool:
        """Cancel the in-flight request tagged ``tag`` (``LanguageRequest.tag``): it is evicted now and its slot
        freed; the next frame's ``FrameResult.finished`` reports it (``cancelled``, the tokens so far, not counted
        as dropped). Call it between frames, from the thread that steps the engine. False when nothing in flight
        has that tag (finished already, not admitted yet, or a mode that decodes each request within its frame)."""
        done = self.scheduler.cancel(tag)
        if done is not None:
            self._cancelled.append(done)
        return done is not None

    def partial(self, tag: object) -> list[int] | None:
        """The tokens generated so far by the in-flight request tagged ``tag`` (None: none in flight)."""
        st = self.scheduler.find(tag)
        return None if st is None else list(st.tokens)

    @property
    def device(self) -> torch.device:
        """The model's device."""
        return self.runner.device

    @property
    def graphs_backend(self) -> str:
        """The ``graphs`` backend that runs (``auto`` resolved; ``off``: eager)."""
        return self.runner.graphs.backend if self.runner.graphs is not None else "off"

    @property
    def graph_stages(self) -> str:
        """Which action stages run their graph step, e.g. ``prefill off, denoise aot`` (``off``: fused eager)."""
        backend = self.graphs_backend
        return ", ".join(f"{s} {backend if on else 'off'}" for s, on in self.runner.graph_stages.items()) \
            if backend != "off" else "prefill off, denoise off"

    @property
    def kernels(self) -> str:
        """The CPU kernels each stage runs on (``kernel_choice.py``), e.g. ``prefill packed, decode packed,
        denoise plain (measured)``; ``keep`` when the engine left the model as it was set."""
        k = self.runner.kernels
        if k is None:
            return "keep"
        return ", ".join(f"{s} {'packed' if getattr(k, s) else 'plain'}" for s in ("prefill", "decode", "denoise")) \
            + f" ({k.source})"

    def memory_bytes(self) -> int:
        """Parameters + KV pool of this engine."""
        return self.runner.memory_bytes()

    def step(self, frame: Frame, on_actions: ActionCallback | None = None) -> FrameResult:
        """Run one control frame. ``on_actions(frame_index, chunks)`` fires as soon as the chunk is denoised,
        before any language work of the frame.

        Raises:
            ValueError: a request names an adapter the engine was not built with (nothing of the frame runs).
        """
        unknown = {r.adapter for r in frame.requests if r.adapter and r.adapter not in self.runner.adapters}
        if unknown:
            raise ValueError(f"unknown adapter(s) {sorted(unknown)}; the engine has {sorted(self.runner.adapters)}")
        sw, t0 = Stopwatch(self.runner.device), time.perf_counter()
        obs = self.runner.prepare(frame.observation)
        run = self._begin(frame, sw, t0)
        prefix, slot = self._act(obs, frame.noise, run, frame.rtc)
        if on_actions is not None:
            on_actions(self.frame_index, run.result.actions)
        self._serve(frame.requests, obs, prefix, slot, run)
        return self._finish(run)

    def step_batch(self, frames: Sequence[Frame], on_actions: BatchActionCallback | None = None) -> FrameResult:
        """Run B observations (several robots, say) as one frame: one prefill and one denoise loop over all of them,
        batched; ``on_actions(i, chunks)`` for each observation as soon as the batch is denoised; then every
        frame's language requests are admitted, each from its own observation's prefix (copied into a pool slot),
        and decoded with everything in flight as in :meth:`step`. ``result.batch_actions[i]`` holds observation
        i's chunks; ``frame_index`` advances by one. Each observation's chunk equals running it alone (up to
        floating-point summation order).

        Raises:
            ValueError: no frames, a guided frame (real-time chunking runs in :meth:`step` only), or a request names
                an adapter the engine was not built with (nothing runs).
        """
        if not frames:
            raise ValueError("step_batch needs at least one frame")
        if self.runner.rtc is not None and any(f.rtc is not None for f in frames):
            raise ValueError("step_batch does not guide chunks (real-time chunking): run guided frames with step")
        unknown = {r.adapter for f in frames for r in f.requests if r.adapter and r.adapter not in self.runner.adapters}
        if unknown:
            raise ValueError(f"unknown adapter(s) {sorted(unknown)}; the engine has {sorted(self.runner.adapters)}")
        sw, t0 = Stopwatch(self.runner.device), time.perf_counter()
        observations = [self.runner.prepare(f.observation) for f in frames]
        run = self._begin(frames[0], sw, t0)
        with sw("prefill"):
            prefix = self.runner.prefill_batch(stack_observations(observations))
        with sw("denoise"):
            run.result.batch_actions = self.runner.denoise_batch(prefix, [f.noise for f in frames])
        if on_actions is not None:
            for i, chunks in enumerate(run.result.batch_actions):
                on_actions(i, chunks)
        for i, frame in enumerate(frames):
            if not frame.requests:
                continue
            self.scheduler.restamp(frame.stamp)
            with sw("manager", sync=False):
                slot = self.scheduler.alloc()
                own = self.runner.adopt(prefix, i, slot)
            if self.spec.batched:
                self._admit(frame.requests, own, slot, run)
            else:
                self._serve(frame.requests, observations[i], own, slot, run)
        if self.spec.batched:
            self._decode(run)  # one loop: every client's requests advance together
        return self._finish(run)

    def step_language(self, frame: Frame) -> FrameResult:
        """The language half of a frame alone (no actions): a prefill of the observation for its requests, then
        each to completion. The parallel baseline's language worker; needs a ``reprefill`` mode."""
        if not self.spec.reprefill:
            raise ValueError("step_language needs a mode whose language prefix is its own prefill (reprefill)")
        sw, t0 = Stopwatch(self.runner.device), time.perf_counter()
        run = self._begin(frame, sw, t0)
        if frame.requests:
            obs = self.runner.prepare(frame.observation)
            self._serve(frame.requests, obs, None, self.scheduler.alloc(), run)
        return self._finish(run)

    # ------------------------------------------------------------------------------------------ stages
    def _begin(self, frame: Frame, sw: Stopwatch, t0: float) -> _FrameRun:
        self.scheduler.begin_frame(self.frame_index, frame.stamp, t0, frame.deadline)
        finished, self._cancelled = self._cancelled, []  # cancelled since the last frame
        return _FrameRun(sw, t0, FrameResult(self.frame_index, [], finished, sw.times, [], 0, 0, stamp=frame.stamp))

    def _act(self, obs: Observation, noise, run: _FrameRun, rtc: RTCPrefix | None = None) -> tuple[Prefix, int]:
        """Prefill into a free slot, then every action head denoises from it (read-only), the first one guided
        toward ``rtc`` (the previous chunk's remainder) when the engine runs real-time chunking."""
        with run.sw("manager", sync=False):
            slot = self.scheduler.alloc()
            guide = self.runner.guide(rtc)
        with run.sw("prefill"):
            prefix = self.runner.prefill(obs, slot)
        with run.sw("denoise"):
            run.result.actions = self.runner.denoise(prefix, noise, guide)
        run.result.guided = guide is not None
        return prefix, slot

    def _serve(self, requests: list[LanguageRequest], obs: Observation, prefix: Prefix | None, slot: int,
               run: _FrameRun) -> None:
        """Admit and decode the frame's language requests.

        Batched: all at once, the first on the action prefill's slot, then one decode loop over everything in flight.
        Otherwise one at a time, each to completion on the frame's slot: after its own prefill of the observation
        (reprefill) or on the action prefix with the previous request's tokens forgotten (shared_kv).
        """
        spec = self.spec
        for group in [requests] if spec.batched else [[r] for r in requests]:
            if spec.reprefill:  # openpi-style: the language task encodes the observation again
                with run.sw("language_prefill"):
                    prefix = self.runner.prefill(obs, slot)
            elif not spec.batched:  # shared_kv: keep the prefix, forget the previous request's tokens
                self.runner.forget_appended(slot, prefix.length)
            self._admit(group, prefix, slot, run)
            self._decode(run)
        if not spec.batched:
            self.scheduler.release(slot)

    def _admit(self, requests: list[LanguageRequest], prefix: Prefix, slot: int, run: _FrameRun) -> None:
        """Scheduler admission; the runner copies the prefix for every further request of the frame."""

        @functools.cache
        def first_token() -> int:
            with run.sw("decode"):
                return self.runner.first_token(prefix)

        with run.sw("manager", sync=False):
            for src, dst in self.scheduler.admit(requests, prefix, slot, first_token, run.result):
                self.runner.copy_prefix(src, dst, prefix.length)

    def _decode(self, run: _FrameRun) -> None:
        """Batched decode forwards until nothing in flight has budget left: each advances its rows by one position."""
        sched, sw = self.scheduler, run.sw
        k = sched.frame_budget()
        if sched.drafts is not None:
            return self._decode_speculative(run, k)
        while True:
            with sw("manager", sync=False):
                batch = sched.schedule(k)
                if batch is None:
                    break
                if (hi := self.runner.static_rows(batch)) is not None:
                    batch = sched.widen(batch, hi)
                inputs = self.runner.prepare_decode(batch)
            t_step = time.perf_counter()
            with sw("decode"):
                tokens = self.runner.run_decode(inputs)
            sched.observe(batch, time.perf_counter() - t_step)
            with sw("manager", sync=False):
                sched.postprocess(batch, tokens, run.result)

    def _decode_speculative(self, run: _FrameRun, k: int) -> None:
        """As ``_decode``, but each active row feeds its next token plus known prompt tokens and drafts, verified
        greedily in the same forward (at most k forwards per request and frame, as without drafts)."""
        sched, sw = self.scheduler, run.sw
        while True:
            with sw("manager", sync=False):
                batch = sched.schedule(k)
                if batch is None:
                    break
                feeds = sched.feeds(batch)
                inputs = self.runner.prepare_decode_multi(batch, feeds)
            t_step = time.perf_counter()
            with sw("decode"):
                preds = self.runner.run_decode_multi(inputs)
            sched.observe(batch, time.perf_counter() - t_step)
            with sw("manager", sync=False):
                self.runner.keep(sched.postprocess_verified(batch, feeds, preds, run.result))

    def _finish(self, run: _FrameRun) -> FrameResult:
        result = run.result
        result.inflight = len(self.scheduler.inflight)
        result.timings["frame"] = time.perf_counter() - run.t0
        self.frame_index += 1
        result.add_to(self.totals)
        if self.detokenize is not None:
            for f in result.finished:
                f.text = self.detokenize(f.tokens)
        return result


def build_engine(model: Pi05Model, config: EngineConfig | None = None, **kw) -> Engine | ParallelEngine:
    """The engine for ``config.mode`` (``parallel``: two engines, the language one on its own model copy)."""
    config = config or EngineConfig()
    config.validate()
    if config.spec.concurrent:
        return ParallelEngine.build(Engine, model, config, **kw)
    return Engine(model, config, **kw)
