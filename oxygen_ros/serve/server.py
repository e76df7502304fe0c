"""openpi's websocket policy server protocol, served by a :class:`~.sessions.SessionPool`.

Per connection: the metadata map first, then strict request / response (one observation map in, one map out:
``actions``, ``policy_timing``, ``server_timing`` and this server's extra keys). An error sends the traceback as a
text frame and closes with 1011; the server keeps serving. ``GET /healthz`` answers 200 ``OK``. With an API key a
connection must send openpi-client's header (``Authorization: Api-Key <key>``; a bare ``Api-Key: <key>`` header is
accepted too), else it is refused with 401.

``serial=True`` is openpi's own server: each request runs inside the event loop, alone (the benchmark's baseline).
"""

from __future__ import annotations

import asyncio
import hmac
import http
import logging
import threading
import time
import traceback
from collections.abc import Callable

import websockets
from websockets.asyncio.server import Request as HttpRequest
from websockets.asyncio.server import Response, ServerConnection, serve
from websockets.frames import CloseCode

from .batching import Batcher
from .protocol import ProtocolError, pack, unpack
from .sessions import SessionPool

__all__ = ["PolicyServer", "ServerThread"]

log = logging.getLogger(__name__)


class PolicyServer:
    """The websocket server (see the module docstring).

    Args:
        pool: the clients and their shared engine.
        host, port: where to listen (port 0: any free port; :attr:`port` tells which).
        api_key: required of every connection when set.
        metadata: sent on connect (default: the key map's, e.g. ALOHA's ``reset_pose``).
        serial: openpi-style: inference in the event loop, one request at a time.
        window_s, max_batch: batching (:class:`~.batching.Batcher`).
        max_message_bytes: largest request accepted (None: no limit, as openpi).
    """

    def __init__(self, pool: SessionPool, *, host: str = "0.0.0.0", port: int = 8000, api_key: str | None = None,
                 metadata: dict | None = None, serial: bool = False, window_s: float = 0.005, max_batch: int = 16,
                 max_message_bytes: int | None = None) -> None:
        self.pool, self.host, self.port = pool, host, port
        self.api_key = api_key or None
        self.metadata = dict(pool.key_map.metadata if metadata is None else metadata)
        self.serial = serial
        self.window_s, self.max_batch, self.max_message_bytes = window_s, max_batch, max_message_bytes
        self.batcher: Batcher | None = None
        self.refused = 0  # connections refused for a wrong or missing API key

    async def serve_forever(self, started: Callable[[int], None] | None = None,
                            stop: asyncio.Event | None = None) -> None:
        """Serve until ``stop`` is set (or forever); ``started(port)`` once listening."""
        self.batcher = None if self.serial else Batcher(self.pool, self.window_s, self.max_batch)
        try:
            async with serve(self._handler, self.host, self.port, compression=None, max_size=self.max_message_bytes,
                             process_request=self._process_request) as server:
                self.port = server.sockets[0].getsockname()[1]
                log.info(f"serving on {self.host}:{self.port} ({'serial' if self.serial else 'batched'})")
                if started is not None:
                    started(self.port)
                await (stop.wait() if stop is not None else asyncio.Future())
        finally:
            if self.batcher is not None:
                self.batcher.stop()

    def _process_request(self, connection: ServerConnection, request: HttpRequest) -> Response | None:
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if self.api_key is not None and not self._authorised(request):
            self.refused += 1
            return connection.respond(http.HTTPStatus.UNAUTHORIZED, "Unauthorized: a valid API key is required\n")
        return None

    def _authorised(self, request: HttpRequest) -> bool:
        key = self.api_key.encode()
        auth = request.headers.get("Authorization", "")
        given = auth[len("Api-Key "):] if auth.startswith("Api-Key ") else request.headers.get("Api-Key", "")
        return hmac.compare_digest(given.encode(), key)

    async def _handler(self, ws: ServerConnection) -> None:
        session = self.pool.open()
        log.info(f"client {session.id} connected from {ws.remote_address}")
        try:
            await ws.send(pack(self.metadata))
            prev_total_s: float | None = None
            while True:
                data = await ws.recv()
                start = time.monotonic()
                try:
                    if not isinstance(data, bytes):
                        raise ProtocolError("expected a binary msgpack frame, got text")
                    request = self.pool.request(session, unpack(data))
                    if self.batcher is None:
                        response = self.pool.infer([request])[0]  # openpi-style: the event loop waits
                    else:
                        response = await asyncio.wrap_future(self.batcher.submit(request))
                    timing = {"infer_ms": (time.monotonic() - start) * 1e3}
                    if prev_total_s is not None:
                        timing["prev_total_ms"] = prev_total_s * 1e3
                    response["server_timing"] = timing
                    await ws.send(pack(response))
                except websockets.ConnectionClosed:
                    raise
                except Exception:
                    log.warning(f"client {session.id}: request failed", exc_info=True)
                    await ws.send(traceback.format_exc())
                    await ws.close(CloseCode.INTERNAL_ERROR,
                                   "Internal server error. Traceback included in previous frame.")
                    return
                prev_total_s = time.monotonic() - start
        except websockets.ConnectionClosed:
            log.info(f"client {session.id} disconnected")
        finally:
            self.pool.close(session)


class ServerThread:
    """A :class:`PolicyServer` in a background thread with its own event loop (tests, benchmarks).

        with ServerThread(server) as port: ...
    """

    def __init__(self, server: PolicyServer) -> None:
        self.server = server
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="oxygen-serve-loop", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            await self.server.serve_forever(lambda _: self._ready.set(), self._stop)

        try:
            asyncio.run(main())
        except BaseException as e:
            self._error = e
        finally:
            self._ready.set()

    def start(self, timeout: float = 30.0) -> int:
        """Start serving; the port."""
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise RuntimeError(f"the server did not start: {self._error!r}")
        return self.server.port

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    def __enter__(self) -> int:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
