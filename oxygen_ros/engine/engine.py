"""Frame-driven inference engines: the unified-KV-cache engine (OxyGen) and the baselines it is compared to.

All modes share the model code, the KV pool and the decode loop; they differ only in where a language request's
prefix comes from and how far it decodes per frame:

  mode        language prefix                        decoding per frame
  oxygen      the action prefill's slot (no copy)    every in-flight request, batched, at most k steps each
  shared_kv   the action prefill's slot (no copy)    each new request to completion, alone (ablation)
  isolated    a second prefill of the observation    each new request to completion, alone (openpi style)
  parallel    a second prefill on a 2nd model copy   to completion, concurrently with the action worker

Every frame: prefill once -> denoise (every action head) -> ``on_actions`` callback -> language.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import nn

from .kv_cache import KVCache
from .lora import LoraAdapter
from .model import Pi05Model, Prefix
from .observation import Observation
from .requests import FinishedRequest, Frame, FrameResult, LanguageRequest
from .scheduler import OVERFLOW_POLICIES, BudgetController, RequestState, SlotAllocator
from .timing import Stopwatch

MODES = ("oxygen", "shared_kv", "isolated", "parallel")
UNBOUNDED = 1 << 30

ActionCallback = Callable[[int, list[torch.Tensor]], None]


@dataclass
class EngineConfig:
    """How the engine schedules work. ``k`` is the per-frame decode budget (oxygen only) or ``"auto"``."""

    mode: str = "oxygen"
    num_steps: int = 10  # S: flow-matching denoise steps
    k: int | str = 5
    deadline_s: float | None = None  # frame deadline for k="auto" (e.g. the control period)
    max_inflight: int = 32  # bound on unfinished language requests (KV pool = max_inflight + 1 slots)
    overflow: str = "reject_newest"  # or "drop_oldest"
    max_new_tokens: int = 64  # longest request the pool is sized for
    max_prompt_tokens: int = 16
    eos_id: int = 1

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {OVERFLOW_POLICIES}, got {self.overflow!r}")
        if self.num_steps < 1 or self.max_inflight < 1 or self.max_new_tokens < 1:
            raise ValueError("num_steps, max_inflight and max_new_tokens must be >= 1")


class Engine:
    """Runs one control frame at a time: ``step(frame) -> FrameResult``."""

    def __init__(
        self,
        model: Pi05Model,
        config: EngineConfig | None = None,
        heads: nn.ModuleList | None = None,
        adapter: LoraAdapter | None = None,
        adapter_tasks: set[str] | None = None,
        detokenize: Callable[[list[int]], str] | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.config.validate()
        self.model = model
        self.heads = [model.head_parts()] + [h.parts() for h in (heads or [])]
        self.adapter = adapter
        self.adapter_tasks = adapter_tasks if adapter_tasks is not None else {"memory"}
        self.detokenize = detokenize
        cfg, ec = model.config, self.config
        self.batched = ec.mode == "oxygen"
        self.budget = BudgetController(ec.k, ec.deadline_s) if self.batched else BudgetController(UNBOUNDED)
        num_slots = ec.max_inflight + 1 if self.batched else 1
        max_len = cfg.max_prefix_len + max(max(h.horizon for h in self.heads), ec.max_prompt_tokens + ec.max_new_tokens)
        self.cache = KVCache(cfg, num_slots, max_len, dtype=model.dtype, device=model.device)
        self.slots = SlotAllocator(num_slots)
        self.inflight: list[RequestState] = []
        self.frame_index = 0
        self.next_request_id = 0
        self.totals = {"rejected": 0, "dropped": 0, "finished": 0, "tokens": 0}

    # ------------------------------------------------------------------------------------------ public API
    @property
    def backlog(self) -> int:
        """Unfinished language requests."""
        return len(self.inflight)

    def memory_bytes(self) -> int:
        """Parameters + KV pool of this engine (both workers for ``parallel``)."""
        params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return params + self.cache.nbytes

    def step(self, frame: Frame, on_actions: ActionCallback | None = None) -> FrameResult:
        """Run one control frame. ``on_actions(frame_index, chunks)`` fires as soon as the chunk is denoised,
        before any language work of the frame."""
        sw = Stopwatch(self.model.device)
        t0 = time.perf_counter()
        obs = self._prepare(frame.observation)
        for r in self.inflight:
            r.frames += 1
            r.frame_steps = 0
        result = FrameResult(self.frame_index, [], [], sw.times, [], 0, 0, stamp=frame.stamp)
        prefix, slot, result.actions = self._act(obs, frame.noise, sw)
        if on_actions is not None:
            on_actions(self.frame_index, result.actions)
        self._language(frame, obs, prefix, slot, t0, sw, result)
        result.inflight = len(self.inflight)
        sw.times["frame"] = time.perf_counter() - t0
        self.frame_index += 1
        self.totals["rejected"] += result.rejected
        self.totals["dropped"] += result.dropped
        self.totals["finished"] += len(result.finished)
        self.totals["tokens"] += result.tokens_generated
        if self.detokenize is not None:
            for f in result.finished:
                f.text = self.detokenize(f.tokens)
        return result

    # ------------------------------------------------------------------------------------------ stages
    def _prepare(self, obs: Observation) -> Observation:
        cfg = self.model.config
        if obs.batch_size != 1:
            raise ValueError(f"the engine runs one observation per frame, got a batch of {obs.batch_size}")
        obs.validate(cfg.num_cameras, cfg.vision.image_size)
        if obs.tokens.shape[1] > cfg.max_token_len:
            raise ValueError(f"prompt of {obs.tokens.shape[1]} tokens exceeds max_token_len={cfg.max_token_len}")
        return obs.to(self.model.device, self.model.dtype)

    def _act(self, obs: Observation, noise, sw: Stopwatch) -> tuple[Prefix, int, list[torch.Tensor]]:
        """Prefill into a free slot, then every action head denoises from it (read-only)."""
        with sw("manager"):
            slot = self.slots.alloc()
        with sw("prefill"):
            prefix = self.model.prefill(obs, self.cache, slice(slot, slot + 1))
        noises = noise if isinstance(noise, list | tuple) else [noise] * len(self.heads)
        with sw("denoise"):
            actions = [
                self.model.denoise(prefix, self.cache, n, self.config.num_steps, head)[0]
                for head, n in zip(self.heads, noises, strict=True)
            ]
        return prefix, slot, actions

    def _language(self, frame, obs, prefix, slot, t0, sw, result) -> None:
        mode = self.config.mode
        if mode == "oxygen":
            self._admit(frame, prefix, slot, t0, sw, result)
            self._decode(self.inflight, self.budget, t0, sw, result)
            return
        for req in frame.requests:
            if mode == "isolated":  # openpi-style: the language task encodes the observation again
                with sw("language_prefill"):
                    prefix = self.model.prefill(obs, self.cache, slice(slot, slot + 1))
            else:  # shared_kv: forget the previous request's tokens, keep the prefix
                self.cache.valid[slot, prefix.length:] = False
            states = self._admit(Frame(frame.observation, [req], stamp=frame.stamp), prefix, slot, t0, sw, result,
                                 release_slot=False)
            self._decode(states, self.budget, t0, sw, result)
        self.slots.free(slot)

    def _admit(self, frame, prefix: Prefix, slot: int, t0: float, sw: Stopwatch, result: FrameResult,
               release_slot: bool = True) -> list[RequestState]:
        """Turn the frame's new requests into in-flight states starting from ``prefix`` (no copy for the first)."""
        ec = self.config
        admitted: list[RequestState] = []
        first_token = None
        with sw("manager"):
            for req in frame.requests:
                if not self._fits(req):
                    result.rejected += 1
                    continue
                if len(self.inflight) >= ec.max_inflight:
                    if ec.overflow == "reject_newest":
                        result.rejected += 1
                        continue
                    self._evict(self.inflight[0], result, dropped=True)
                if admitted:  # a second request on the same frame gets its own copy of the prefix
                    s = self.slots.alloc()
                    self._copy_prefix(slot, s, prefix.length)
                else:
                    s = slot
                st = RequestState(self.next_request_id, req, s, self.frame_index, frame.stamp, prefix.length,
                                  int(prefix.num_valid[0]), t0)
                self.next_request_id += 1
                if not req.prompt_tokens:  # the first token comes straight from the prefix
                    if first_token is None:
                        with sw("decode"):
                            first_token = int(self.model.lm_logits(prefix.last_hidden[:1]).argmax(-1)[0])
                    st.emit(first_token, ec.eos_id)
                    st.steps = st.frame_steps = 1
                    result.tokens_generated += 1
                admitted.append(st)
                self.inflight.append(st)
            if release_slot and not admitted:
                self.slots.free(slot)
            for st in [s for s in admitted if s.done]:
                self._evict(st, result)
        return admitted

    def _decode(self, requests: list[RequestState], budget: BudgetController, t0: float, sw: Stopwatch,
                result: FrameResult) -> None:
        """Batched decode forwards: each step advances every eligible request by one position, in place."""
        k = budget.budget(time.perf_counter() - t0, len(requests), max((r.request.total_steps - r.steps
                                                                        for r in requests), default=0))
        dev = self.model.device
        while True:
            with sw("manager"):
                active = [r for r in requests if not r.done and r.frame_steps < k]
                if not active:
                    break
                by_slot = {r.slot: r for r in self.inflight}
                active_slots = {r.slot for r in active}
                lo, hi = min(active_slots), max(active_slots) + 1
                # per row: token, position, write index. Free slots are dummy rows writing at index 0 of an unused
                # slot; idle live rows write at their next position, which their next real step overwrites.
                n = hi - lo
                tokens, positions, writes, adapted = [0] * n, [0] * n, [0] * n, [0.0] * n
                for s in range(lo, hi):
                    r = by_slot.get(s)
                    if r is None:
                        continue
                    positions[s - lo] = r.num_valid + r.fed
                    writes[s - lo] = r.prefix_len + r.fed
                    if s in active_slots:
                        tokens[s - lo] = r.next_token
                        adapted[s - lo] = float(r.request.task in self.adapter_tasks)
                attn_len = max(writes) + 1
                inputs = torch.tensor([tokens, positions, writes], device=dev)
                lora = None
                if self.adapter is not None and any(adapted):
                    lora = self.adapter
                    lora.row_mask = torch.tensor(adapted, dtype=self.model.dtype, device=dev)[:, None, None]
            t_step = time.perf_counter()
            with sw("decode"):
                logits = self.model.decode_step(self.cache, slice(lo, hi), inputs[0], inputs[1], inputs[2],
                                                attn_len, lora)
                nxt = logits.argmax(-1).tolist()
            budget.observe(hi - lo, time.perf_counter() - t_step)
            result.batch_sizes.append(len(active))
            result.decode_steps += 1
            with sw("manager"):
                for r in active:
                    r.fed += 1
                    r.steps += 1
                    r.frame_steps += 1
                    if r.fed >= len(r.request.prompt_tokens):
                        r.emit(nxt[r.slot - lo], self.config.eos_id)
                        result.tokens_generated += 1
                    if r.done:
                        self._evict(r, result)

    # ------------------------------------------------------------------------------------------ helpers
    def _fits(self, req: LanguageRequest) -> bool:
        ec = self.config
        return 1 <= req.max_new_tokens <= ec.max_new_tokens and len(req.prompt_tokens) <= ec.max_prompt_tokens

    def _copy_prefix(self, src: int, dst: int, length: int) -> None:
        c = self.cache
        c.k[:, dst, :, :length] = c.k[:, src, :, :length]
        c.v[:, dst, :, :length] = c.v[:, src, :, :length]
        c.valid[dst] = False
        c.valid[dst, :length] = c.valid[src, :length]

    def _evict(self, st: RequestState, result: FrameResult, dropped: bool = False) -> None:
        self.inflight.remove(st)
        if self.batched:
            self.slots.free(st.slot)
        result.finished.append(st.finish(time.perf_counter(), dropped))
        result.dropped += int(dropped)


class ParallelEngine(Engine):
    """The MPS-style baseline: an action worker and a language worker, each with its own model copy, run
    concurrently; the frame ends when the slower one does."""

    def __init__(self, model: Pi05Model, config: EngineConfig | None = None, **kw) -> None:
        config = copy.copy(config or EngineConfig(mode="parallel"))
        worker_config = copy.copy(config)
        worker_config.mode = config.mode = "isolated"  # each worker runs the isolated pipeline on its own copy
        super().__init__(model, config, **kw)
        self.language_worker = Engine(copy.deepcopy(model), worker_config, adapter=kw.get("adapter"),
                                      adapter_tasks=kw.get("adapter_tasks"), detokenize=kw.get("detokenize"))
        self.config.mode = "parallel"
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="language-worker")

    def memory_bytes(self) -> int:
        return super().memory_bytes() + self.language_worker.memory_bytes()

    def step(self, frame: Frame, on_actions: ActionCallback | None = None) -> FrameResult:
        t0 = time.perf_counter()
        lang = self._pool.submit(self._language_frame, frame)
        result = super().step(Frame(frame.observation, [], frame.noise, frame.stamp), on_actions)
        lr = lang.result()
        result.finished, result.tokens_generated = lr.finished, lr.tokens_generated
        result.batch_sizes, result.decode_steps, result.rejected = lr.batch_sizes, lr.decode_steps, lr.rejected
        for stage in ("language_prefill", "decode"):
            result.timings[stage] = lr.timings.get(stage, 0.0)
        result.timings["frame"] = time.perf_counter() - t0
        self.totals["tokens"] += lr.tokens_generated
        self.totals["finished"] += len(lr.finished)
        return result

    def _language_frame(self, frame: Frame) -> FrameResult:
        """The language worker's frame: its own prefill of the observation, then each request to completion."""
        w = self.language_worker
        sw = Stopwatch(w.model.device)
        t0 = time.perf_counter()
        result = FrameResult(w.frame_index, [], [], sw.times, [], 0, 0, stamp=frame.stamp)
        if frame.requests:
            w._language(frame, w._prepare(frame.observation), None, w.slots.alloc(), t0, sw, result)
        if w.detokenize is not None:
            for f in result.finished:
                f.text = w.detokenize(f.tokens)
        w.frame_index += 1
        return result

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def build_engine(model: Pi05Model, config: EngineConfig | None = None, **kw) -> Engine:
    """The engine for ``config.mode`` (``parallel`` gets its own worker and model copy)."""
    config = config or EngineConfig()
    if config.mode == "parallel":
        return ParallelEngine(model, config, **kw)
    return Engine(model, config, **kw)


__all__ = ["MODES", "Engine", "EngineConfig", "FinishedRequest", "Frame", "FrameResult", "LanguageRequest",
           "ParallelEngine", "build_engine"]
