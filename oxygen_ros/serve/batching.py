"""The inference thread: requests that arrive within a short window run as one batched engine frame.

A batch starts when ``max_batch`` requests wait, when every connected client has one waiting (no one else can
join), or ``window_s`` after its first request arrived: the window bounds what batching may add to a request's
round trip (the per-frame deadline). Inference never runs in the event loop, so health checks, metadata and new
connections are answered while it runs.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future

from .sessions import Request, SessionPool

__all__ = ["Batcher"]

log = logging.getLogger(__name__)


class Batcher:
    """Collects requests from the connection handlers and runs them on :meth:`SessionPool.infer` in its thread."""

    def __init__(self, pool: SessionPool, window_s: float = 0.005, max_batch: int = 16) -> None:
        if window_s < 0 or max_batch < 1:
            raise ValueError("window_s must be >= 0 and max_batch >= 1")
        self.pool, self.window_s, self.max_batch = pool, window_s, max_batch
        self._queue: list[tuple[Request, Future]] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="oxygen-serve-inference", daemon=True)
        self._thread.start()

    def submit(self, request: Request) -> Future:
        """Queue a request; the future resolves to its response map (or the frame's exception). Thread-safe."""
        fut: Future = Future()
        with self._cond:
            if self._stopped:
                raise RuntimeError("the inference thread has stopped")
            self._queue.append((request, fut))
            self._cond.notify()
        return fut

    def stop(self) -> None:
        """Stop after the current batch; requests still queued fail."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=30)
        for _, fut in self._queue:
            fut.set_exception(RuntimeError("the server is shutting down"))
        self._queue.clear()

    def _take(self) -> list[tuple[Request, Future]] | None:
        """The next batch (one request per client, oldest first); None when stopped."""
        with self._cond:
            while not self._queue and not self._stopped:
                self._cond.wait()
            if self._stopped:
                return None
            deadline = self._queue[0][0].received + self.window_s
            while len(self._queue) < min(self.max_batch, max(self.pool.num_open, 1)):
                left = deadline - time.monotonic()
                if left <= 0 or self._stopped:
                    break
                self._cond.wait(left)
            batch, rest, seen = [], [], set()
            for item in self._queue:
                sid = item[0].session.id
                (rest if sid in seen or len(batch) >= self.max_batch else batch).append(item)
                seen.add(sid)
            self._queue = rest
            return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            try:
                responses = self.pool.infer([r for r, _ in batch])
            except Exception as e:  # every client of the frame gets the error; the server goes on
                log.exception("inference failed")
                for _, fut in batch:
                    fut.set_exception(e)
                continue
            for (_, fut), response in zip(batch, responses, strict=True):
                fut.set_result(response)
