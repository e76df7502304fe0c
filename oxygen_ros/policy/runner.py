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

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.requests import FinishedRequest, Frame, FrameResult, LanguageRequest
from oxygen_ros.engine.rtc import RTCPrefix

from .language import LanguageSchedule, StreamClock, StreamTag
from .policy import Policy, PreparedObservation, RawObservation
from .rtc import ChunkMemory, DelayEstimator, RTCSchedule

__all__ = ["ChunkOutput", "FrameOutput", "FrameRunner", "PendingFrame", "seeded_noise", "step_batch"]


@dataclass
class ChunkOutput:
    """A denoised chunk in robot units, handed out before any language work of its frame.

    Action i is the target for ``stamp_ns + (i + 1) * dt``. ``start`` counts the leading actions already committed
    when the chunk was ready (their time had passed: the robot executed the previous chunk's), so what a robot is
    sent is :attr:`published`, from action ``start`` to ``end``: the executed part ``actions``, or under real-time
    chunking the whole chunk (the robot executes it until the next chunk replaces it, as LeRobot's RTC queue does).
    """

    frame_index: int
    stamp_ns: int
    actions: np.ndarray  # [n_execute, D]: the part the robot executes
    chunk: np.ndarray  # [H, D]: everything the model denoised
    latency_s: float
    inference_s: float
    subtask: str = ""  # the subtask its action prompt was conditioned on ('' = none)
    start: int = 0  # actions already committed when it was ready (< H)
    guided: bool = False  # real-time chunking guided it toward the previous chunk's remainder
    delay: int = 0  # the inference delay (actions) its guidance assumed
    end: int = 0  # the published part ends before this action (0: len(actions), the executed part)

    @property
    def published(self) -> np.ndarray:
        """The actions still ahead when the chunk was ready: from ``start`` to ``end`` (at least one row)."""
        return self.chunk[self.start:max(self.start + 1, self.end or len(self.actions))]


@dataclass
class FrameOutput:
    """What one frame produced."""

    chunk: ChunkOutput
    result: FrameResult
    prepared: PreparedObservation
    preprocess_s: float
    new_requests: int
    requests: list[LanguageRequest] = field(default_factory=list)  # the ones this frame started (admitted or not)


@dataclass
class PendingFrame:
    """A frame between :meth:`FrameRunner.begin` and :meth:`FrameRunner.finish`: its engine frame and bookkeeping."""

    frame: Frame
    prepared: PreparedObservation
    requests: list[LanguageRequest]
    instruction: str
    t0: float
    t_prep: float
    stamp_ns: int
    arrived: float | None
    on_chunk: Callable[[ChunkOutput], None] | None = None
    chunks: list[ChunkOutput] = field(default_factory=list)
    clock_ns: Callable[[], int] | None = None  # the stamps' clock, read when the chunk is ready


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
        language: the language stream, or several (names unique), each at its own cadence.
        noise: ``noise(frame_index, H, A)`` -> [1, H, A]; default :func:`seeded_noise` (seed 0).
        n_execute: actions of each chunk to execute (default: the checkpoint's ``n_action_steps``).
        condition_on: subtask conditioning (off: ''): the name of a stream (normally the ``subtask`` task) whose
            latest finished output enters the action prompt of the frames after it finished, in pi0.5's two-stage
            form (``PromptTokenizer.tokenize_action_prompt(subtask=...)``); cleared when the instruction changes.
        owner: set it when several runners share one engine (``engine_factory`` returning it; see
            :func:`step_batch`): the runner's stream requests are then tagged ``StreamTag(owner, ...)`` and only
            those count as its own (continuous triggers, subtask conditioning). The caller hands every runner the
            results of frames it was not part of (:meth:`observe`).
        rtc: real-time chunking (:mod:`.rtc`): each frame's chunk continues the last one handed out (its remainder
            from the new observation's stamp on, delta dims re-referenced), with the delay fixed or estimated from
            the measured chunk ages; the engine must run ``EngineConfig.rtc`` = ``rtc.config``. Its chunks are
            published whole (:attr:`n_publish`): the next chunk replaces the rest, so ``n_execute`` only sets how
            many actions a control period spans where the action rate is derived from it.
    """

    def __init__(self, policy: Policy, engine_factory: Callable[[], Engine],
                 language: LanguageSchedule | Sequence[LanguageSchedule] | None = None,
                 noise: Callable[[int, int, int], torch.Tensor] | None = None, n_execute: int | None = None,
                 condition_on: str = "", owner: object = None, rtc: RTCSchedule | None = None) -> None:
        self.policy = policy
        self.owner = owner
        self._factory = engine_factory
        self.engine = engine_factory()
        self.rtc = rtc
        if rtc is not None and rtc.config.enabled and getattr(self.engine.config, "rtc", None) != rtc.config:
            raise ValueError("real-time chunking: build the engine with EngineConfig(rtc=...) equal to rtc.config")
        self.delays = DelayEstimator(rtc.dt_s, rtc.window, rtc.quantile) if rtc is not None else None
        self._memory = ChunkMemory(rtc.dt_s) if rtc is not None else None
        self._chunk_instruction: str | None = None  # the instruction the remembered chunk was made for
        # rtc.remainder_source executor: robot-unit actions due at stamp + (k + 1) dt from what the chunk executor
        # executed / will execute (None: no fresh plan -> the timing rule); set by the node
        self.executed_remainder: Callable[[int], np.ndarray | None] | None = None
        self.remainder_counts = {"executor": 0, "timing_rule": 0, "executor_fallback": 0}
        self.last_remainder: tuple[str, int, np.ndarray | None] | None = None  # (source, stamp, robot rows)
        streams = (language,) if isinstance(language, LanguageSchedule) else tuple(language or ())
        names = [s.stream for s in streams]
        if len(set(names)) != len(names):
            raise ValueError(f"language stream names must be unique, got {names}")
        self.streams = streams
        # admission order on a frame: priority, then configured order (stable sort)
        self._clocks = sorted((StreamClock(s) for s in streams), key=lambda c: -c.schedule.priority)
        self._continuous = any(s.trigger == "continuous" for s in streams)  # they wait for their last request
        self.noise = noise or seeded_noise(0)
        self.n_execute = int(n_execute or policy.spec.n_action_steps)
        if not 0 < self.n_execute <= policy.spec.chunk_size:
            raise ValueError(f"n_execute {self.n_execute} must be in 1..{policy.spec.chunk_size} (the chunk size)")
        guided = rtc is not None and rtc.config.enabled
        self.n_publish = policy.spec.chunk_size if guided else self.n_execute  # actions a chunk publishes
        if condition_on and condition_on not in names:
            raise ValueError(f"subtask conditioning on stream {condition_on!r}, which is not configured ({names})")
        self.condition_on = condition_on
        self._subtask: tuple[str, str, int] = ("", "", -1)  # (instruction it was made for, text, origin frame)
        self._subtask_requests: dict[int, str] = {}  # frame index -> instruction of its subtask request
        self.processed = 0
        self._prompt_cache: dict[str, tuple[str, list[int]]] = {}
        self._submitted: list[LanguageRequest] = []  # ad-hoc requests for the next frame (submit)
        self._cancels: list[object] = []  # tags the engine cancels before the next frame (cancel)
        self._queue_lock = threading.Lock()  # submit and cancel may come from other threads than step

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
        self._subtask_requests.clear()  # their requests are lost with the engine (frame indices restart)
        self._subtask = (*self._subtask[:2], -1)
        self.forget_chunk()

    def forget_subtask(self) -> None:
        """A new task starts unconditioned (a ``~/run`` goal, even with the same instruction as before: a ``done``
        of the last task must not condition the next); subtask requests still in flight no longer count."""
        self._subtask_requests.clear()
        self._subtask = ("", "", self._subtask[2])

    def forget_chunk(self) -> None:
        """The next chunk starts free (real-time chunking has nothing to continue): after a reset, when the robot
        stopped executing chunks (disabled, halted) or a new instruction arrived."""
        if self._memory is not None:
            self._memory.clear()

    @property
    def delay(self) -> int:
        """The inference delay (actions) the next guided chunk assumes: fixed, or the online estimate."""
        if self.rtc is None:
            return 0
        return self.rtc.delay if self.rtc.delay is not None else self.delays.delay

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    @property
    def language(self) -> LanguageSchedule:
        """The first stream (the one-stream setup's schedule); an inactive one when there is none."""
        return self.streams[0] if self.streams else LanguageSchedule()

    def subtask(self, instruction: str) -> str:
        """The subtask the next frame's action prompt holds for ``instruction`` ('' without conditioning, before
        the stream's first output, or after the instruction changed)."""
        made_for, text, _ = self._subtask
        return text if self.condition_on and made_for == instruction else ""

    def owns(self, tag: object) -> bool:
        """Whether a request tagged ``tag`` is this runner's (without an owner: every request of its engine)."""
        return self.owner is None or (isinstance(tag, StreamTag) and tag.owner == self.owner)

    def observe(self, finished: Iterable[FinishedRequest]) -> None:
        """Learn from finished requests (the subtask a conditioned stream produced); others' are ignored, and a
        request seen twice counts once."""
        if self.condition_on:
            self._observe_subtask(finished)

    def _observe_subtask(self, finished: Iterable[FinishedRequest]) -> None:
        for f in finished:
            if f.stream != self.condition_on or not self.owns(f.tag):
                continue
            made_for = self._subtask_requests.pop(f.frame_index, None)
            # the newest observation's subtask wins, even if an older request finishes after it
            if made_for is not None and not f.dropped and not f.cancelled and f.frame_index > self._subtask[2]:
                text = f.text if f.text is not None else self.policy.tokenizer.decode(f.tokens)
                self._subtask = (made_for, text.strip(), f.frame_index)

    def request_tokens(self, instruction: str, stream: LanguageSchedule | None = None) -> list[int]:
        """Prompt tokens of ``stream``'s request for this instruction (cached per stream for a repeated one)."""
        lang = stream or self.language
        cached = self._prompt_cache.get(lang.stream)
        if cached is not None and cached[0] == instruction:
            return cached[1]
        tok = self.policy.tokenizer
        if lang.prompt:
            tokens = tok.encode(lang.prompt.format(instruction=instruction))[: lang.max_prompt_tokens]
        else:
            tokens = tok.tokenize_request(lang.task, None, max_len=lang.max_prompt_tokens)
        self._prompt_cache[lang.stream] = (instruction, tokens)
        return tokens

    def submit(self, request: LanguageRequest) -> None:
        """Queue an ad-hoc request (a question, say; its ``tag`` finds it again in the results): admitted with the
        next frame that runs, among that frame's due stream requests by ``request.priority`` (ties: the streams
        first). Thread-safe."""
        with self._queue_lock:
            self._submitted.append(request)

    def cancel(self, tag: object) -> bool:
        """Cancel the request tagged ``tag``. True: it was still queued (:meth:`submit`) and is dropped, it never
        runs. False: the engine evicts it before the next frame, if it is still in flight then (``Engine.cancel``:
        that frame's ``FrameResult.finished`` reports it, ``cancelled``). Thread-safe."""
        with self._queue_lock:
            for i, r in enumerate(self._submitted):
                if r.tag == tag:
                    del self._submitted[i]
                    return True
            self._cancels.append(tag)
            return False

    def _with_submitted(self, due: list[LanguageRequest]) -> list[LanguageRequest]:
        """Apply the pending cancellations, then the frame's requests: the due ones and the submitted ones, by
        priority (stable: the due ones' order holds, ties put the streams first)."""
        with self._queue_lock:
            submitted, self._submitted = self._submitted, []
            cancels, self._cancels = self._cancels, []
        for tag in cancels:
            self.engine.cancel(tag)
        return sorted(due + submitted, key=lambda r: -r.priority) if submitted else due

    def _due_requests(self, stamp_ns: int, instruction: str) -> list[LanguageRequest]:
        """The requests this frame starts: every due stream's, in admission order."""
        stamp = stamp_ns or time.monotonic_ns()  # unstamped (offline) frames: the wall clock times period_s
        requests = []
        busy = {r.request.stream for r in self.engine.inflight if self.owns(r.tag)} if self._continuous else set()
        for clock in self._clocks:
            if clock.due(self.processed, stamp, instruction, clock.schedule.stream in busy):
                s = clock.schedule
                tag = StreamTag(self.owner, s.stream, self.processed) if self.owner is not None else None
                requests.append(LanguageRequest(s.task, s.max_new_tokens, list(self.request_tokens(instruction, s)),
                                                stream=s.stream, priority=s.priority, adapter=s.adapter, tag=tag))
                clock.started(stamp, instruction)
        return requests

    def _remainder(self, stamp_ns: int, instruction: str, prepared: PreparedObservation) -> RTCPrefix | None:
        """What this frame's chunk continues under real-time chunking (None: off, nothing published yet, a new
        instruction, or the last chunk ended before ``stamp_ns``)."""
        if self.rtc is None or not self.rtc.config.enabled:
            return None
        if instruction != self._chunk_instruction:
            self.forget_chunk()
            return None  # a new instruction starts free
        if self.executed_remainder is not None:
            rows = self.executed_remainder(stamp_ns)
            if rows is not None and len(rows):
                self.remainder_counts["executor"] += 1
                self.last_remainder = ("executor", stamp_ns, rows)
                return RTCPrefix(self.policy.model_actions(rows, prepared), self.delay)
            self.remainder_counts["executor_fallback"] += 1
        prefix = self._memory.remainder(stamp_ns, self.delay,
                                        lambda a, ref: self.policy.rereference(a, ref, prepared))
        if prefix is not None:
            self.remainder_counts["timing_rule"] += 1
            self.last_remainder = ("timing_rule", stamp_ns, None)
        return prefix

    def _committed(self, stamp_ns: int, age_s: float, horizon: int) -> int:
        """Leading actions whose time passed when the chunk was ready, ``age_s`` after its observation (0 without
        real-time chunking); the age also feeds the delay estimate."""
        if self.rtc is None or not stamp_ns:
            return 0
        self.delays.observe(age_s)
        return min(horizon - 1, max(0, int(age_s / self.rtc.dt_s + 1e-9)))

    def step(self, observation: RawObservation | PreparedObservation, *, stamp_ns: int = 0,
             arrived: float | None = None, instruction: str | None = None, start_language: bool = True,
             on_chunk: Callable[[ChunkOutput], None] | None = None, noise: torch.Tensor | None = None,
             clock_ns: Callable[[], int] | None = None, deadline: float | None = None) -> FrameOutput:
        """Run one frame. ``on_chunk`` gets the robot-unit chunk before any decoding of the frame.

        ``arrived`` is the ``time.monotonic()`` instant the newest input arrived; ``instruction`` the request
        prompt's instruction (default: the observation's task); ``noise`` fixes x_1 [1, H, A] (default:
        ``self.noise(frame index, H, A)``). ``clock_ns``: the clock of the stamps (the node's, a simulator's), read
        when the chunk is ready: the chunk's age since its observation, which real-time chunking counts committed
        actions and estimates the delay from (default: ``latency_s``). ``deadline``: the ``time.perf_counter``
        instant the frame should end by (``Frame.deadline``: what ``k = auto`` fits).
        """
        pending = self.begin(observation, stamp_ns=stamp_ns, arrived=arrived, instruction=instruction,
                             start_language=start_language, on_chunk=on_chunk, noise=noise, clock_ns=clock_ns,
                             deadline=deadline)
        result = self.engine.step(pending.frame, on_actions=lambda _, chunks: self.chunk_ready(pending, chunks))
        return self.finish(pending, result)

    def begin(self, observation: RawObservation | PreparedObservation, *, stamp_ns: int = 0,
              arrived: float | None = None, instruction: str | None = None, start_language: bool = True,
              on_chunk: Callable[[ChunkOutput], None] | None = None, noise: torch.Tensor | None = None,
              clock_ns: Callable[[], int] | None = None, deadline: float | None = None) -> PendingFrame:
        """The first part of :meth:`step` (same arguments): prepare the observation and pick the frame's language
        requests and noise; the engine frame to run is ``pending.frame``."""
        t0 = time.monotonic()
        if isinstance(observation, RawObservation):
            instruction = observation.task if instruction is None else instruction
            if self.condition_on and not observation.subtask:
                observation = dataclasses.replace(observation, subtask=self.subtask(instruction))
            prepared = self.policy.prepare(observation)
        else:
            prepared = observation
        t_prep = time.monotonic()
        requests = self._with_submitted(self._due_requests(stamp_ns, instruction or "") if start_language else [])
        if noise is None:
            spec, model = self.policy.spec, self.policy.model
            noise = self.noise(self.engine.frame_index, spec.chunk_size, model.config.action_dim)
        rtc = self._remainder(stamp_ns, instruction or "", prepared)
        frame = Frame(prepared.observation, requests, noise, stamp=stamp_ns, rtc=rtc, deadline=deadline)
        return PendingFrame(frame, prepared, requests, instruction or "", t0, t_prep, stamp_ns, arrived, on_chunk,
                            clock_ns=clock_ns)

    def chunk_ready(self, pending: PendingFrame, chunks: list[torch.Tensor]) -> ChunkOutput:
        """The engine denoised ``pending``'s chunk(s): robot units, timed, handed to its ``on_chunk``."""
        robot = self.policy.postprocess(chunks[0], pending.prepared)
        now = time.monotonic()
        since = pending.t0 if pending.arrived is None else pending.arrived
        stamp, rtc = pending.stamp_ns, pending.frame.rtc
        age = (pending.clock_ns() - stamp) / 1e9 if pending.clock_ns is not None and stamp else now - since
        chunk = ChunkOutput(self.engine.frame_index, stamp, robot[: self.n_execute], robot, now - since,
                            now - pending.t0, pending.prepared.subtask, self._committed(stamp, age, len(robot)),
                            rtc is not None, rtc.delay if rtc is not None else 0, self.n_publish)
        if self._memory is not None:
            self._memory.record(stamp, chunks[0][:, : self.policy.spec.action_dims].float().cpu().numpy(),
                                pending.prepared.reference_state)
            self._chunk_instruction = pending.instruction
        pending.chunks.append(chunk)
        if pending.on_chunk is not None:
            pending.on_chunk(chunk)
        return chunk

    def finish(self, pending: PendingFrame, result: FrameResult, index: int | None = None) -> FrameOutput:
        """The last part of :meth:`step`: count the frame, learn from its results. ``index``: the pending frame's
        position in a batched engine frame (its chunks are ``result.batch_actions[index]``)."""
        self.processed += 1
        if self.condition_on and any(r.stream == self.condition_on for r in pending.requests):
            self._subtask_requests[result.frame_index] = pending.instruction
        self.observe(result.finished)
        if not pending.chunks:  # engines always call back; keep the contract even if one did not
            self.chunk_ready(pending, result.actions if index is None else result.batch_actions[index])
        chunk = pending.chunks[0]
        chunk.frame_index = result.frame_index
        return FrameOutput(chunk, result, pending.prepared, pending.t_prep - pending.t0, len(pending.requests),
                           pending.requests)


def step_batch(runners: Sequence[FrameRunner], observations: Sequence[RawObservation | PreparedObservation], *,
               noises: Sequence[torch.Tensor | None] | None = None, stamps_ns: Sequence[int] | None = None,
               arrived: Sequence[float | None] | None = None) -> list[FrameOutput]:
    """One batched engine frame for several runners that share one engine (each with its own ``owner``): runner i
    runs ``observations[i]`` as its next frame (:meth:`FrameRunner.step`'s semantics, with ``noises[i]``), all
    prefilled and denoised together (``Engine.step_batch``), their language requests decoded with everything in
    flight. A runner appears at most once. Runners sharing the engine that are not in the batch should get
    ``outputs[0].result.finished`` through :meth:`FrameRunner.observe`."""
    if not runners or len(runners) != len(observations):
        raise ValueError(f"{len(runners)} runners for {len(observations)} observations")
    engine = runners[0].engine
    if any(r.engine is not engine for r in runners) or len({id(r) for r in runners}) != len(runners):
        raise ValueError("step_batch runs distinct runners that share one engine")
    n = len(runners)
    noises = noises or [None] * n
    stamps_ns = stamps_ns or [0] * n
    arrived = arrived or [None] * n
    pendings = [r.begin(o, stamp_ns=s, arrived=a, noise=z)
                for r, o, s, a, z in zip(runners, observations, stamps_ns, arrived, noises, strict=True)]
    result = engine.step_batch([p.frame for p in pendings],
                               on_actions=lambda i, chunks: runners[i].chunk_ready(pendings[i], chunks))
    return [r.finish(p, result, i) for i, (r, p) in enumerate(zip(runners, pendings, strict=True))]
