"""Request scheduling for cross-frame continuous batching: admission, eviction, the decode batch, the budget k.

Nothing here touches K/V tensors: a request owns one slot of the preallocated ``KVCache`` from admission to
eviction, the model runner writes into that slot in place, and the scheduler only says which slots decode when.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .modes import OVERFLOW_POLICIES, UNBOUNDED, EngineConfig
from .requests import FinishedRequest, FrameResult, LanguageRequest, RequestState
from .slots import SlotAllocator
from .speculative import DraftSource, row_feed, verify

if TYPE_CHECKING:
    from .model import Prefix

__all__ = ["OVERFLOW_POLICIES", "BudgetController", "DecodeBatch", "RequestState", "Scheduler", "SlotAllocator"]


class BudgetController:
    """Per-frame decode budget: a fixed k, or ``auto``: as many batched steps as fit before the frame deadline.

    ``auto`` budgets against a high percentile (``quantile``, default p90, the ``higher`` sample) of the last
    ``window`` measured decode-step times per batch size, not their mean: a frame must fit when its steps run slow,
    and the steps of one frame are not independent draws (a busy core slows them all). It picks
    k = floor(time left * safety / step cost), at least ``k_min`` (so language always progresses) and no more
    than the backlog needs. The time left is to the frame's own deadline when it has one (a frame that started
    late gets less, so lateness does not carry over), else to ``deadline_s`` after its start.
    """

    def __init__(self, k: int | str, deadline_s: float | None = None, k_min: int = 1, k_max: int = 64,
                 safety: float = 0.85, window: int = 32, quantile: float = 0.9) -> None:
        if k != "auto" and (not isinstance(k, int) or k < 1):
            raise ValueError(f"k must be a positive integer or 'auto', got {k!r}")
        if k == "auto" and not deadline_s:
            raise ValueError("k='auto' needs a frame deadline (deadline_s)")
        self.k, self.deadline_s, self.k_min, self.k_max = k, deadline_s, k_min, k_max
        self.safety, self.window, self.quantile = safety, window, quantile
        self._times: dict[int, deque[float]] = {}
        self._cost: dict[int, float] = {}  # the percentile per batch size, refreshed on each observation

    @property
    def auto(self) -> bool:
        """Whether k adapts to the deadline."""
        return self.k == "auto"

    def observe(self, batch: int, seconds: float) -> None:
        """Record the measured time of one decode forward over ``batch`` rows."""
        times = self._times.setdefault(batch, deque(maxlen=self.window))
        times.append(seconds)
        ranked = sorted(times)
        self._cost[batch] = ranked[min(len(ranked) - 1, math.ceil(self.quantile * len(ranked)) - 1)]

    def step_cost(self, batch: int) -> float | None:
        """Estimated seconds of one decode forward over ``batch`` rows (None before any measurement)."""
        if batch in self._cost:
            return self._cost[batch]
        larger = [b for b in self._cost if b >= batch]
        if larger:  # a bigger batch is an upper bound
            return self._cost[min(larger)]
        if self._cost:  # extrapolate from the largest measured batch, linearly in rows
            b = max(self._cost)
            return self._cost[b] * batch / b
        return None

    def time_left(self, elapsed_s: float, deadline: float | None = None) -> float:
        """Seconds left for decoding: to ``deadline`` (a ``time.perf_counter`` instant) when given, else to
        ``deadline_s`` after the frame's start; never negative."""
        left = deadline - time.perf_counter() if deadline is not None else self.deadline_s - elapsed_s
        return max(left, 0.0)

    def budget(self, elapsed_s: float, batch: int, backlog_steps: int, deadline: float | None = None) -> int:
        """Decode steps for this frame, given the time already spent and the rows a forward over the in-flight
        requests runs (``batch``: ``Scheduler.forward_rows``)."""
        if not self.auto:
            return int(self.k)
        cost = self.step_cost(max(batch, 1))
        if cost is None:
            return self.k_min  # first frame: measure
        fit = math.floor(self.time_left(elapsed_s, deadline) * self.safety / cost)
        return max(self.k_min, min(fit, self.k_max, max(backlog_steps, self.k_min)))


@dataclass
class DecodeBatch:
    """One batched decode forward over the contiguous cache slots ``[lo, lo + len(rows))``."""

    lo: int
    rows: list[RequestState | None]  # per slot: its live request (None: a free slot, run as a dummy row)
    active: list[RequestState]  # the requests this forward advances; other live rows idle

    @property
    def slots(self) -> slice:
        """The cache slots of the batch."""
        return slice(self.lo, self.lo + len(self.rows))


class Scheduler:
    """Admission, eviction and decode selection for one engine's language requests.

    It holds the slot pool and every in-flight :class:`RequestState`. ``batched`` (oxygen): a request owns its slot
    from admission to eviction and decodes at most ``k`` steps a frame; otherwise the frame owns its one slot and each
    request decodes on it to completion.
    """

    def __init__(self, config: EngineConfig, num_slots: int, batched: bool,
                 drafts: DraftSource | None = None) -> None:
        self.config = config
        self.batched = batched
        self.drafts = drafts  # speculative decoding's draft source (None: one token per row and forward)
        self.slots = SlotAllocator(num_slots)
        self.budget = BudgetController(config.k, config.deadline_s) if batched else BudgetController(UNBOUNDED)
        self._deadline: float | None = None  # the current frame's end (begin_frame)
        self.inflight: list[RequestState] = []
        self.next_request_id = 0
        self._frame: tuple[int, Any, float] = (0, None, 0.0)  # index, stamp, start time of the current frame
        self._allow: dict[int, int] = {}  # request id -> steps this frame, where priorities set them (auto)
        # rows a decode forward over the slots [lo, hi) really runs: the span eagerly; the engine sets the runner's
        # (a static / captured step widens it to its bucket [0, b)), so auto prices a step by what it runs
        self.forward_rows: Callable[[int, int], int] = lambda lo, hi: hi - lo

    # ------------------------------------------------------------------------------------------ frames and slots
    def begin_frame(self, index: int, stamp: Any, start_time: float, deadline: float | None = None) -> None:
        """A new frame: every in-flight request spans one more frame and gets a fresh per-frame budget;
        ``deadline``: the ``time.perf_counter`` instant it should end by (None: ``deadline_s`` after its start)."""
        self._frame = (index, stamp, start_time)
        self._deadline = deadline
        for r in self.inflight:
            r.frames += 1
            r.frame_steps = 0

    def restamp(self, stamp: Any) -> None:
        """The observation stamp the requests admitted next start from (a batched frame's observations differ)."""
        self._frame = (self._frame[0], stamp, self._frame[2])

    def alloc(self) -> int:
        """A slot for the frame's prefill."""
        return self.slots.alloc()

    def release(self, slot: int) -> None:
        """Return a frame's slot that no request took over."""
        self.slots.free(slot)

    # ------------------------------------------------------------------------------------------ admission
    def fits(self, req: LanguageRequest) -> bool:
        """Whether the pool is sized for the request (longer ones are rejected, not fatal)."""
        ec = self.config
        return 1 <= req.max_new_tokens <= ec.max_new_tokens and len(req.prompt_tokens) <= ec.max_prompt_tokens

    def rejection(self, req: LanguageRequest) -> str | None:
        """Why the pool cannot take the request whatever is in flight (None: it :meth:`fits`)."""
        ec = self.config
        if not 1 <= req.max_new_tokens <= ec.max_new_tokens:
            return "max_new_tokens out of range"
        if len(req.prompt_tokens) > ec.max_prompt_tokens:
            return "prompt too long"
        return None

    def reject(self, req: LanguageRequest, reason: str, result: FrameResult) -> None:
        """Refuse a new request: counted in ``result.rejected`` and listed with its reason."""
        result.rejected += 1
        result.rejected_requests.append((req, reason))

    def admit(self, requests: list[LanguageRequest], prefix: Prefix, slot: int, first_token: Callable[[], int],
              result: FrameResult) -> list[tuple[int, int]]:
        """Turn new requests into in-flight states that start from ``prefix`` in ``slot``.

        The first request takes ``slot`` itself (no copy); each further one gets a slot of its own and the returned
        ``(src, dst)`` prefix copies say what the model runner must copy. A full pool rejects the newest request or
        drops the oldest in flight (``config.overflow``). ``first_token()`` is the prefix's greedy next token, the
        first output of a request without prompt tokens. Batched: ``slot`` is released if no request took it.
        """
        ec = self.config
        admitted: list[RequestState] = []
        copies: list[tuple[int, int]] = []
        index, stamp, start = self._frame
        slot_owned = slot_freed = False  # `slot` holds the prefix; the engine allocated it for this frame
        for req in requests:
            reason = self.rejection(req)
            if reason is not None:
                self.reject(req, reason, result)
                continue
            if len(self.inflight) >= ec.max_inflight:
                if ec.overflow == "reject_newest":
                    self.reject(req, "pool full", result)
                    continue
                victim = self.inflight[0]
                self.evict(victim, result, dropped=True)
                if victim in admitted:  # a request of this very frame: it no longer holds its slot
                    admitted.remove(victim)
                    if victim.slot == slot:
                        slot_owned, slot_freed = False, self.batched
            if not slot_owned and not slot_freed:
                s = slot
            else:  # the prefix stays in `slot` until this frame's copies are made, even if `slot` was freed
                s = self.slots.alloc()
                if s != slot:
                    copies.append((slot, s))
            slot_owned |= s == slot
            st = RequestState(self.next_request_id, req, s, index, stamp, prefix.length, int(prefix.num_valid[0]),
                              start)
            self.next_request_id += 1
            if not req.prompt_tokens:  # the first token comes straight from the prefix
                st.emit(first_token(), ec.eos_id)
                st.steps = st.frame_steps = 1
                result.tokens_generated += 1
            admitted.append(st)
            self.inflight.append(st)
        if self.batched and not slot_owned and not slot_freed:
            self.slots.free(slot)
        for st in [s for s in admitted if s.done]:
            self.evict(st, result)
        return copies

    def evict(self, st: RequestState, result: FrameResult, dropped: bool = False) -> None:
        """Finish ``st`` (completed, or ``dropped`` by the overflow policy) and free its slot if it owns one."""
        self.inflight.remove(st)
        if self.batched:
            self.slots.free(st.slot)
        if self.drafts is not None and not dropped:
            self.drafts.observe(st)
        result.finished.append(st.finish(time.perf_counter(), dropped))
        result.dropped += int(dropped)

    def find(self, tag: object) -> RequestState | None:
        """The in-flight request whose ``LanguageRequest.tag == tag`` (None: none, or ``tag`` is None)."""
        if tag is None:
            return None
        return next((r for r in self.inflight if r.request.tag == tag), None)

    def cancel(self, tag: object) -> FinishedRequest | None:
        """Evict the in-flight request tagged ``tag`` now (between frames) and free its slot. Returns its result
        (``cancelled``, the tokens so far; not dropped, and the drafts do not learn from it), None when no request
        in flight has that tag."""
        st = self.find(tag)
        if st is None:
            return None
        self.inflight.remove(st)
        if self.batched:
            self.slots.free(st.slot)
        return st.finish(time.perf_counter(), cancelled=True)

    # ------------------------------------------------------------------------------------------ decoding
    def frame_budget(self) -> int:
        """Decode steps each in-flight request may advance this frame (``k``, or what ``auto`` fits).

        ``auto`` with requests of different priorities: every row still gets ``k_min`` steps (nothing starves:
        each in-flight request advances every frame), and the time left after those goes to the highest-priority
        rows first, in forwards over just them (see :meth:`_priority_allowances`)."""
        reqs = self.inflight
        backlog = max((r.request.total_steps - r.steps for r in reqs), default=0)
        elapsed = time.perf_counter() - self._frame[2]
        rows = self.forward_rows(min(r.slot for r in reqs), max(r.slot for r in reqs) + 1) if reqs else 1
        k = self.budget.budget(elapsed, rows, backlog, self._deadline)
        live = [r for r in reqs if not r.done]
        self._allow = (self._priority_allowances(live, elapsed)
                       if self.budget.auto and len({r.request.priority for r in live}) > 1 else {})
        return k

    def _priority_allowances(self, reqs: list[RequestState], elapsed: float) -> dict[int, int]:
        """Per request id, its steps this frame under ``auto`` when priorities differ: ``k_min`` for all, then,
        level by level from the highest priority, as many extra forwards over the rows of at least that priority
        as the time left pays for (their cost estimated from the measured step times of their slot span)."""
        b = self.budget

        def cost(rows: list[RequestState]) -> float | None:
            return b.step_cost(self.forward_rows(min(r.slot for r in rows), max(r.slot for r in rows) + 1))

        full = cost(reqs)
        if full is None:  # nothing measured yet: k_min for everyone
            return {}
        # in the units of ``k``: steps counted from the frame's start (a request's free first token included)
        cap = {r.request_id: r.frame_steps + r.request.total_steps - r.steps for r in reqs}
        allow = {i: min(b.k_min, c) for i, c in cap.items()}
        left = b.time_left(elapsed, self._deadline) * b.safety - b.k_min * full
        for level in sorted({r.request.priority for r in reqs}, reverse=True):
            rows = [r for r in reqs if r.request.priority >= level]
            want = max(cap[r.request_id] - allow[r.request_id] for r in rows)
            c = cost(rows)
            extra = min(want, b.k_max - b.k_min, math.floor(max(left, 0.0) / c) if c else want)
            if extra <= 0:
                if want > 0:
                    break  # no time for this level; lower levels span at least as many rows
                continue
            for r in rows:
                allow[r.request_id] = min(cap[r.request_id], allow[r.request_id] + extra)
            left -= extra * c
        return allow

    def schedule(self, k: int) -> DecodeBatch | None:
        """The next decode forward: every unfinished request with budget left, over the slot range they span
        (live rows in between idle, free slots are dummy rows); None when nothing is left to decode this frame."""
        allow = self._allow
        active = [r for r in self.inflight if not r.done and r.frame_steps < allow.get(r.request_id, k)]
        if not active:
            return None
        by_slot = {r.slot: r for r in self.inflight}
        lo = min(r.slot for r in active)
        hi = max(r.slot for r in active) + 1
        return DecodeBatch(lo, [by_slot.get(s) for s in range(lo, hi)], active)

    def widen(self, batch: DecodeBatch, hi: int) -> DecodeBatch:
        """The same forward over slots ``[0, hi)`` (a static-shape step): the extra slots are idle rows."""
        by_slot = {r.slot: r for r in self.inflight}
        return DecodeBatch(0, [by_slot.get(s) for s in range(hi)], batch.active)

    def observe(self, batch: DecodeBatch, seconds: float) -> None:
        """Feed the measured time of a decode forward to the budget controller."""
        self.budget.observe(len(batch.rows), seconds)

    def postprocess(self, batch: DecodeBatch, next_tokens: list[int], result: FrameResult) -> None:
        """Advance the batch's active requests by the forward's greedy tokens; evict those that finished."""
        result.batch_sizes.append(len(batch.active))
        result.decode_steps += 1
        for r in batch.active:
            r.fed += 1
            r.steps += 1
            r.frame_steps += 1
            if r.fed >= len(r.request.prompt_tokens):
                r.emit(next_tokens[r.slot - batch.lo], self.config.eos_id)
                result.tokens_generated += 1
            if r.done:
                self.evict(r, result)

    # ------------------------------------------------------------------------------------------ speculative decoding
    def feeds(self, batch: DecodeBatch) -> list[tuple[list[int], int]]:
        """Per active request: the tokens it feeds this forward (next token, rest of its prompt, drafts; at most
        ``1 + config.speculate``) and how many of them are known (not drafts)."""
        return [row_feed(r, self.drafts, 1 + self.config.speculate) for r in batch.active]

    def postprocess_verified(self, batch: DecodeBatch, feeds: list[tuple[list[int], int]], preds: list[list[int]],
                             result: FrameResult) -> list[tuple[int, int, int]]:
        """Greedy acceptance of a multi-token forward (``preds[row]``: the argmax after each fed token); advances
        and evicts like :meth:`postprocess`. Returns ``(slot, first write index, kept)`` of every active row: the
        cache positions whose K/V the caller marks valid."""
        result.batch_sizes.append(len(batch.active))
        result.decode_steps += 1
        kept = []
        for r, (feed, known) in zip(batch.active, feeds, strict=True):
            v = verify(r, feed, known, preds[r.slot - batch.lo], self.config.eos_id)
            if v.drafted:
                self.drafts.record(r, v.drafted, v.accepted)
            kept.append((r.slot, r.prefix_len + r.fed, v.kept))
            r.fed += v.kept
            r.steps += v.kept
            r.frame_steps += 1
            for tok in v.emitted:
                r.emit(tok, self.config.eos_id)
            result.tokens_generated += len(v.emitted)
            result.drafted += v.drafted
            result.draft_accepted += v.accepted
            if r.done:
                self.evict(r, result)
        return kept
