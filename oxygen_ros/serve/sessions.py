"""The server's clients: one :class:`Session` per connection, each a :class:`~oxygen_ros.policy.runner.FrameRunner`
of its own (language streams, frame count, subtask) on the one engine they all share.

:meth:`SessionPool.infer` runs a batch of requests (one per client) as one engine frame: one client alone is exactly
``FrameRunner.step``; several are prefilled and denoised together (``policy.runner.step_batch``). Every client's
language requests (its streams' and its questions) stay in flight across frames and decode in the engine's batched
loop, whichever clients' observations a frame holds; each finished one is delivered to its client's next response.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.requests import FinishedRequest, FrameResult, LanguageRequest
from oxygen_ros.policy import Policy, RawObservation
from oxygen_ros.policy.language import LanguageSchedule, StreamTag
from oxygen_ros.policy.options import RunnerParams
from oxygen_ros.policy.rtc import RTCSchedule
from oxygen_ros.policy.runner import FrameOutput, FrameRunner, seeded_noise, step_batch

from .keys import KeyMap, ObservationError

__all__ = ["AskTag", "QuestionConfig", "Request", "Session", "SessionPool"]

ASK_STREAM = "ask"


@dataclass(frozen=True)
class AskTag:
    """The tag of a client's question request."""

    owner: int
    id: int


@dataclass(frozen=True)
class QuestionConfig:
    """How questions (``"ask"`` in a request) become language requests: the node's ``ask.*`` options, declared
    once in :class:`~oxygen_ros.policy.options.RunnerParams` (read with :meth:`from_options`)."""

    max_new_tokens: int
    max_prompt_tokens: int
    max_chars: int
    priority: int

    @staticmethod
    def from_options(p: RunnerParams) -> QuestionConfig:
        """The ``ask.*`` options of ``p`` (``ask.max_new_tokens`` 0: ``max_new_tokens``)."""
        return QuestionConfig(p.ask_max_new_tokens or p.max_new_tokens, p.ask_max_prompt_tokens,
                              p.ask_max_question_chars, p.ask_priority)


@dataclass
class Request:
    """One client request: its observation, the noise it fixes (None: the client's seeded noise), a question, and
    whether its response holds the whole chunk (``chunk``: LeRobot's protocol returns it, openpi's the executed
    part only)."""

    session: Session
    raw: RawObservation
    noise: np.ndarray | None = None
    question: str = ""
    received: float = field(default_factory=time.monotonic)
    full_chunk: bool = False
    stamp_ns: int = 0  # the observation's time on the client's action time line (0: unstamped)
    clock_ns: Callable[[], int] | None = None  # that time line's clock, read when the chunk is ready


@dataclass
class Session:
    """One connected client."""

    id: int
    runner: FrameRunner
    seed: int
    language: list[dict] = field(default_factory=list)  # finished stream outputs not delivered yet
    answers: list[dict] = field(default_factory=list)  # finished (or refused) questions not delivered yet
    questions: dict[AskTag, tuple[str, int]] = field(default_factory=dict)  # in flight: (question, request index)
    next_question: int = 0
    closed: bool = False

    @property
    def requests(self) -> int:
        """Requests served so far (the index of the next one)."""
        return self.runner.processed

    def noise(self, horizon: int, dim: int) -> torch.Tensor:
        """The seeded noise of its next request: fixed by (seed, request index), whatever else the server runs."""
        return seeded_noise(self.seed)(self.requests, horizon, dim)

    def deliver(self, f: FinishedRequest, decode: Callable[[list[int]], str]) -> None:
        """File a finished request of this client for its next response."""
        text = f.text if f.text is not None else decode(f.tokens)
        entry = {"text": text, "eos": bool(f.eos), "tokens": len(f.tokens), "frames": int(f.frames),
                 "latency_s": float(f.latency_s)}
        if f.dropped:
            entry["error"] = "dropped: the KV pool was full (overflow drop_oldest)"
        if isinstance(f.tag, AskTag):
            question, index = self.questions.pop(f.tag, ("", -1))
            self.answers.append({"id": f.tag.id, "question": question, "request": index, **entry})
        elif isinstance(f.tag, StreamTag):
            self.language.append({"stream": f.stream, "request": f.tag.frame, **entry})

    def refused(self, tag: object, reason: str) -> None:
        """A question the engine refused at admission."""
        if isinstance(tag, AskTag):
            question, index = self.questions.pop(tag, ("", -1))
            self.answers.append({"id": tag.id, "question": question, "request": index, "error": reason})


class SessionPool:
    """The clients of one server and the engine they share (see the module docstring).

    Args:
        policy: the checkpoint's policy.
        engine_factory: builds the shared engine (again after a failed frame).
        streams: the language streams every client runs (each client its own instances).
        seed: a client's noise seed unless its requests send ``"seed"``.
        n_execute: actions of each chunk returned (None: the checkpoint's ``n_action_steps``).
        condition_on: subtask conditioning on that stream ('' = off).
        questions: the question options (None: the ``ask.*`` options' declared defaults).
        key_map: how requests name cameras, state and prompt.
        default_prompt: the prompt of requests without one ('' = required).
        rtc: real-time chunking per client (each client's chunk continues its previous one from the request's
            ``stamp_ns``; the engine must be built with ``EngineConfig.rtc = rtc.config``). Guided frames run one
            client at a time (the engine's batched denoise does not guide).
    """

    def __init__(self, policy: Policy, engine_factory: Callable[[], Engine],
                 streams: Sequence[LanguageSchedule] = (), *, seed: int = 0, n_execute: int | None = None,
                 condition_on: str = "", questions: QuestionConfig | None = None, key_map: KeyMap,
                 default_prompt: str = "", rtc: RTCSchedule | None = None) -> None:
        self.policy, self._factory = policy, engine_factory
        self.engine = engine_factory()
        self.streams, self.seed, self.n_execute, self.condition_on = tuple(streams), seed, n_execute, condition_on
        self.questions = questions or QuestionConfig.from_options(RunnerParams())
        self.key_map, self.default_prompt = key_map, default_prompt
        self.rtc = rtc
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._sessions: dict[int, Session] = {}
        self.stats = {"frames": 0, "requests": 0, "errors": 0, "max_batch": 0, "engine_resets": 0}

    # ------------------------------------------------------------------------------------------ clients
    def open(self) -> Session:
        """A new client (thread-safe)."""
        sid = next(self._ids)
        runner = FrameRunner(self.policy, lambda: self.engine, self.streams, n_execute=self.n_execute,
                             condition_on=self.condition_on, owner=sid, rtc=self.rtc)
        session = Session(sid, runner, self.seed)
        with self._lock:
            self._sessions[sid] = session
        return session

    def close(self, session: Session) -> None:
        """The client left: its requests in flight are cancelled before the next frame (thread-safe)."""
        session.closed = True

    @property
    def num_open(self) -> int:
        """Connected clients."""
        with self._lock:
            return sum(not s.closed for s in self._sessions.values())

    def request(self, session: Session, obs: Mapping) -> Request:
        """Read one request (in the connection's thread): its observation through the key map, and the extra keys
        ``seed`` (int: the client's noise seed from now on), ``noise`` ([H, A] float: this request's x_1) and
        ``ask`` (a question).

        Raises:
            ObservationError: a missing or malformed key (named).
        """
        raw = self.key_map.read(obs, self.policy.spec, self.default_prompt)
        if "seed" in obs:
            seed = obs["seed"]
            if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
                raise ObservationError(f"'seed': expected a non-negative integer, got {seed!r}")
            session.seed = int(seed)
        noise = None
        if "noise" in obs:
            noise = np.asarray(obs["noise"])
            want = (self.policy.spec.chunk_size, self.policy.model.config.action_dim)
            if noise.dtype.kind != "f" or noise.reshape(-1).shape[0] != want[0] * want[1] or \
                    not np.all(np.isfinite(noise)):
                raise ObservationError(f"'noise': expected finite floats of shape {list(want)}, got {noise.dtype} "
                                       f"{list(noise.shape)}")
        question = obs.get("ask", "")
        if not isinstance(question, str):
            raise ObservationError(f"'ask': expected a string, got {type(question).__name__}")
        if len(question) > self.questions.max_chars:
            raise ObservationError(f"'ask': {len(question)} characters; at most {self.questions.max_chars}")
        return Request(session, raw, noise, question.strip())

    # ------------------------------------------------------------------------------------------ inference
    def infer(self, requests: Sequence[Request]) -> list[dict]:
        """Run one engine frame for ``requests`` (at most one per client; from one thread at a time) and return
        each one's response map. A failed frame replaces the engine (the language requests in flight are lost)
        and raises."""
        self._cancel_closed()
        spec, dim = self.policy.spec, self.policy.model.config.action_dim
        asked = [self._ask(r) for r in requests]
        noises = [torch.from_numpy(np.array(r.noise, dtype=np.float32)).reshape(1, spec.chunk_size, dim)
                  if r.noise is not None else r.session.noise(spec.chunk_size, dim) for r in requests]
        runners = [r.session.runner for r in requests]
        try:
            sequential = len(requests) == 1 or self.rtc is not None  # guided frames: one at a time
            if sequential:
                outputs = [runner.step(r.raw, noise=z, stamp_ns=r.stamp_ns, clock_ns=r.clock_ns)
                           for runner, r, z in zip(runners, requests, noises, strict=True)]
            else:
                outputs = step_batch(runners, [r.raw for r in requests], noises=noises,
                                     stamps_ns=[r.stamp_ns for r in requests])
        except Exception:
            self.stats["errors"] += 1
            self._reset()
            raise
        for out in outputs if sequential else outputs[:1]:  # a batched frame's results are shared
            self._route(out.result, {r.session.id for r in requests})
        batch = 1 if sequential else len(requests)
        self.stats["frames"] += len(requests) if sequential else 1
        self.stats["requests"] += len(requests)
        self.stats["max_batch"] = max(self.stats["max_batch"], batch)
        return [self._response(r, out, a, batch) for r, out, a in zip(requests, outputs, asked, strict=True)]

    def _ask(self, r: Request) -> int | None:
        """Submit the request's question to its client's runner (admitted with this frame); its id."""
        if not r.question:
            return None
        s, q, tok = r.session, self.questions, self.policy.tokenizer
        ask_id = s.next_question
        s.next_question += 1
        tag = AskTag(s.id, ask_id)
        question = getattr(tok, "tokenize_question", None)
        tokens = question(r.question, 1 << 20) if question is not None else \
            tok.encode(f"Question: {r.question}\nAnswer: ")
        s.questions[tag] = (r.question, s.requests)
        if len(tokens) > min(q.max_prompt_tokens, self.engine.config.max_prompt_tokens):
            s.refused(tag, f"prompt too long: {len(tokens)} tokens > max_prompt_tokens={q.max_prompt_tokens}")
            return ask_id
        s.runner.submit(LanguageRequest("answer", min(q.max_new_tokens, self.engine.config.max_new_tokens), tokens,
                                        stream=ASK_STREAM, priority=q.priority, tag=tag))
        return ask_id

    def _route(self, result: FrameResult, ran: set[int]) -> None:
        """Hand every client its finished and refused requests; the runners that were not in the frame learn from
        it too (their subtask)."""
        with self._lock:
            sessions = dict(self._sessions)
        decode = self.policy.tokenizer.decode
        for f in result.finished:
            owner = getattr(f.tag, "owner", None)
            if owner in sessions:
                sessions[owner].deliver(f, decode)
        for req, reason in result.rejected_requests:
            owner = getattr(req.tag, "owner", None)
            if owner in sessions:
                sessions[owner].refused(req.tag, reason)
        for sid, s in sessions.items():
            if sid not in ran:
                s.runner.observe(result.finished)

    def _response(self, r: Request, out: FrameOutput, ask_id: int | None, batch: int) -> dict[str, Any]:
        s = r.session
        response: dict[str, Any] = {"actions": out.chunk.actions,
                                    "policy_timing": {"infer_ms": out.chunk.inference_s * 1e3},
                                    "oxygen": {"request": s.requests - 1, "batch_size": batch,
                                               "seed": s.seed, "inflight": s.runner.engine.backlog}}
        if r.full_chunk:
            response["chunk"] = out.chunk.chunk
        if ask_id is not None:
            response["ask_id"] = ask_id
        if s.language:
            response["language"], s.language = s.language, []
        if s.answers:
            response["answers"], s.answers = s.answers, []
        return response

    def _cancel_closed(self) -> None:
        """Forget the clients that left: their requests in flight are evicted (their slots freed)."""
        with self._lock:
            gone = [s for s in self._sessions.values() if s.closed]
            for s in gone:
                del self._sessions[s.id]
        ids = {s.id for s in gone}
        if ids:
            for st in list(self.engine.inflight):
                if getattr(st.tag, "owner", None) in ids:
                    self.engine.cancel(st.tag)

    def _reset(self) -> None:
        self.engine = self._factory()
        self.stats["engine_resets"] += 1
        with self._lock:
            sessions = list(self._sessions.values())
        for s in sessions:
            s.runner.reset()  # its factory returns the new shared engine
            s.questions.clear()
