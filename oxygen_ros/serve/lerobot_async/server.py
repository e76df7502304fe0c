"""LeRobot 0.6.1's async-inference gRPC service (``transport.AsyncInference``) on the same serving core as openpi's
protocol: a :class:`~.sessions.SessionPool` and its :class:`~.batching.Batcher`.

LeRobot's ``RobotClient`` calls ``Ready``, ``SendPolicyInstructions`` (a pickled ``RemotePolicyConfig``), then
streams ``SendObservations`` (a pickled ``TimedObservation`` in 2 MB chunks with transfer states) while a thread
polls ``GetActions`` (a pickled list of ``TimedAction``, or empty data when no observation came within the queue
timeout). This server differs from LeRobot's ``PolicyServer`` where that one is unsafe or single-client:

- payloads are read by the allow-list unpickler (:mod:`.unpickler`), bounded in size and chunk count
  (:class:`~.transfer.Limits`); a refused payload gets ``INVALID_ARGUMENT`` (or ``RESOURCE_EXHAUSTED``) naming why;
- the checkpoint is the one the server was started with (a client names it by its path, or by an alias given with
  ``--checkpoint-alias``), or a checkpoint folder under ``--allowed-root`` (loaded on first use, a bounded number);
  any other ``pretrained_name_or_path`` gets ``PERMISSION_DENIED``, nothing is loaded;
- several clients at once: each gRPC peer (or ``x-oxygen-client`` metadata) is a client with its own session,
  observation queue and timesteps; their ``GetActions`` calls are batched into one engine frame;
- an API key in the call metadata (``authorization: Api-Key <key>``, or ``x-api-key``) and TLS when a certificate
  is given;
- language outputs (memory, narration, subtask) and answers, which LeRobot's client cannot receive, are written as
  JSON lines with the timestep of the observation that started them;
- real-time chunking on the async path (when the pool runs it: the checkpoint's ``rtc_config``): the observation's
  ``timestep`` (the last action the robot executed) and the timesteps of the chunk last sent to that client say
  which of its actions are still ahead; the new chunk is guided toward them (see :meth:`GetActions`).

Per client it keeps LeRobot's semantics: a queue of one observation (a newer one replaces it), observations
skipped unless ``must_go``, or new (timestep not predicted yet) and not similar to the last one processed (state
distance < 1, LeRobot's ``observations_similar``); actions ``chunk[:actions_per_chunk]`` in robot units as float32
tensors, action i stamped ``timestamp + i / fps`` and ``timestep + i``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch

from ..batching import Batcher
from ..sessions import Request, Session, SessionPool
from . import service
from .api_key import ApiKey
from .observations import Pending, check_features, image_shapes, read_observation
from .payloads import PayloadError, RemotePolicyConfig, TimedAction, TimedObservation
from .pickler import dumps
from .proto import services_pb2
from .transfer import Limits, ReceiveError, receive_chunks
from .unpickler import loads

__all__ = ["LeRobotServer"]

log = logging.getLogger(__name__)

SUPPORTED_POLICY_TYPES = ("pi05",)
_STAMP_ORIGIN = 1 << 20  # keeps timestep stamps positive (0 means unstamped)


@dataclass
class _Served:
    """One checkpoint being served: its clients' pool, its batcher and its camera feature shapes."""

    pool: SessionPool
    batcher: Batcher | None = None
    image_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass
class _Client:
    """One LeRobot client (a gRPC peer)."""

    key: str
    session: Session
    served: _Served
    config: RemotePolicyConfig | None = None
    observations: queue.Queue = field(default_factory=lambda: queue.Queue(maxsize=1))
    last_processed: tuple[int, np.ndarray] | None = None  # (timestep, state) of the last observation run
    predicted: set[int] = field(default_factory=set)
    timesteps: dict[int, int] = field(default_factory=dict)  # request index -> its observation's timestep
    lock: threading.Lock = field(default_factory=threading.Lock)
    seen: float = field(default_factory=time.monotonic)




class LeRobotServer:
    """The gRPC server (see the module docstring).

    Args:
        pool: the checkpoint's clients and shared engine (the openpi protocol's serving core).
        checkpoint_names: what a client may name as ``pretrained_name_or_path`` (the served checkpoint's path,
            resolved, and its aliases).
        host, port: where to listen (port 0: any free port; :attr:`port` tells which).
        api_key: required in every call's metadata when set.
        tls: (certificate chain PEM, private key PEM): serve TLS only.
        fps: the robot's control rate (LeRobot's ``--fps``): action i is stamped ``timestamp + i / fps``.
        obs_queue_timeout_s: how long ``GetActions`` waits for an observation before answering empty.
        window_s, max_batch: batching (:class:`~.batching.Batcher`).
        limits: payload bounds.
        language_log: JSON-lines file for language outputs and answers (None: only the log).
        max_workers: gRPC handler threads (each waiting ``GetActions`` holds one).
        allowed_root: a folder whose checkpoints a client may name too (None: only the served one); each is loaded
            on first use by ``pool_factory`` (its own pool and batcher), at most ``max_checkpoints`` in all.
        client_idle_s: a client not heard from for this long is gone (gRPC tells a server nothing when a
            connection closes; a RobotClient polls ``GetActions`` at least every ``obs_queue_timeout``): its session
            closes, so batches stop waiting for it.
    """

    def __init__(self, pool: SessionPool, *, checkpoint_names: Iterable[str], host: str = "0.0.0.0",
                 port: int = 8080, api_key: str | None = None, tls: tuple[bytes, bytes] | None = None,
                 fps: float = 30.0, obs_queue_timeout_s: float = 2.0, window_s: float = 0.005, max_batch: int = 16,
                 limits: Limits | None = None, language_log: Path | None = None, max_workers: int = 0,
                 client_idle_s: float = 30.0, allowed_root: Path | None = None,
                 pool_factory: Callable[[Path], SessionPool] | None = None, max_checkpoints: int = 2) -> None:
        if not fps > 0 or obs_queue_timeout_s < 0:
            raise ValueError("fps must be > 0 and obs_queue_timeout_s >= 0")
        self.pool, self.host, self.port = pool, host, port
        self.checkpoint_names = {str(n) for n in checkpoint_names if str(n)}
        self.fps, self.obs_queue_timeout_s = fps, obs_queue_timeout_s
        self.window_s, self.max_batch = window_s, max_batch
        self.limits = limits or Limits()
        self.tls = tls
        self.auth = ApiKey(api_key) if api_key else None
        self.language_log = language_log
        self.max_workers = max_workers or max(8, 4 * max_batch)
        self.client_idle_s = client_idle_s
        self.allowed_root = Path(allowed_root).resolve() if allowed_root is not None else None
        self.pool_factory, self.max_checkpoints = pool_factory, max_checkpoints
        self._default = _Served(pool, None, image_shapes(pool.policy.spec.checkpoint))
        self._served: dict[str, _Served] = {}  # other checkpoints under allowed_root, by resolved path
        self._load_lock = threading.Lock()
        self.stats = {"refused_payloads": 0, "refused_checkpoints": 0, "skipped_observations": 0, "served": 0}
        # replay hook for tests and fixtures (not reachable from the network): (client key, timestep) -> x_1
        self.noise_for: Callable[[str, int], np.ndarray | None] | None = None
        self._clients: dict[str, _Client] = {}
        self._lock = threading.Lock()
        self._log_lock = threading.Lock()
        self._server: grpc.Server | None = None
        self._workers: futures.ThreadPoolExecutor | None = None

    @property
    def batcher(self) -> Batcher | None:
        """The served checkpoint's batcher (None before :meth:`start`)."""
        return self._default.batcher

    @property
    def image_shapes(self) -> dict[str, tuple[int, ...]]:
        return self._default.image_shapes

    # ------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> int:
        """Listen and serve in gRPC's threads; the port."""
        self._default.batcher = Batcher(self.pool, self.window_s, self.max_batch)
        options = [("grpc.max_receive_message_length", self.limits.max_message_bytes),
                   ("grpc.max_send_message_length", 64 << 20)]
        self._workers = futures.ThreadPoolExecutor(self.max_workers, thread_name_prefix="lerobot-grpc")
        self._server = grpc.server(self._workers, interceptors=[self.auth] if self.auth else [], options=options)
        service.add_to_server(self, self._server)
        address = f"{self.host}:{self.port}"
        if self.tls is not None:
            creds = grpc.ssl_server_credentials([(self.tls[1], self.tls[0])])
            self.port = self._server.add_secure_port(address, creds)
        else:
            self.port = self._server.add_insecure_port(address)
        if not self.port:
            raise OSError(f"cannot listen on {address}")
        self._server.start()
        log.info(f"LeRobot async inference on {self.host}:{self.port} ({'TLS' if self.tls else 'plaintext'}, "
                 f"{'API key' if self.auth else 'no API key'})")
        return self.port

    def stop(self, grace: float = 1.0) -> None:
        if self._server is not None:
            self._server.stop(grace).wait(30)
        if self._workers is not None:  # gRPC does not shut down the pool it was given: its threads would outlive it
            self._workers.shutdown(wait=True, cancel_futures=True)
            self._workers = None
        for served in (self._default, *self._served.values()):
            if served.batcher is not None:
                served.batcher.stop()

    def wait(self) -> None:
        """Block until the server stops."""
        if self._server is not None:
            self._server.wait_for_termination()

    def __enter__(self) -> int:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def refused_keys(self) -> int:
        """Calls refused for a missing or wrong API key."""
        return self.auth.refused if self.auth else 0

    # ------------------------------------------------------------------------------------------ clients
    @staticmethod
    def client_key(context: grpc.ServicerContext) -> str:
        """A client: its ``x-oxygen-client`` metadata, else its gRPC peer (a RobotClient's one channel)."""
        md = {k.lower(): v for k, v in (context.invocation_metadata() or ())}
        given = md.get("x-oxygen-client")
        return f"id:{given}" if isinstance(given, str) and given else context.peer()

    def _client(self, context: grpc.ServicerContext, fresh: bool = False) -> _Client:
        key = self.client_key(context)
        now = time.monotonic()
        with self._lock:
            for gone in [c for c in self._clients.values() if c.key != key and now - c.seen > self.client_idle_s]:
                log.info(f"client {gone.key}: idle for {now - gone.seen:.0f} s, closed")
                gone.served.pool.close(gone.session)
                del self._clients[gone.key]
            client = self._clients.get(key)
            if client is None or fresh:
                if client is not None:
                    client.served.pool.close(client.session)
                client = self._clients[key] = _Client(key, self.pool.open(), self._default)
            client.seen = now
            return client

    @property
    def clients(self) -> int:
        with self._lock:
            return len(self._clients)

    # ------------------------------------------------------------------------------------------ the service
    def Ready(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        """A client (re)starts: its state is flushed (LeRobot's ``_reset_server``, for this client only)."""
        client = self._client(context, fresh=True)
        log.info(f"client {client.key} ready")
        return services_pb2.Empty()

    def SendPolicyInstructions(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        client = self._client(context)
        config = self._decode(request.data, RemotePolicyConfig, context)
        if not isinstance(config.policy_type, str) or config.policy_type not in SUPPORTED_POLICY_TYPES:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"policy_type {config.policy_type!r}: this server runs "
                                                            f"{', '.join(SUPPORTED_POLICY_TYPES)}")
        served = self._checkpoint(config.pretrained_name_or_path, context)
        apc = config.actions_per_chunk
        if isinstance(apc, bool) or not isinstance(apc, int) or apc < 1:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"actions_per_chunk must be a positive int, got {apc!r}")
        problem = check_features(config.lerobot_features, config.rename_map)
        if problem:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        with client.lock:
            if served is not client.served:  # another checkpoint under the allowed root: a session of its pool
                client.served.pool.close(client.session)
                client.session, client.served = served.pool.open(), served
                client.predicted.clear()
                client.last_processed = None
            client.config = config
        log.info(f"client {client.key}: {config.policy_type} {config.pretrained_name_or_path!r}, "
                 f"{apc} actions per chunk (device {config.device!r} ignored: the server's own)")
        return services_pb2.Empty()

    def SendObservations(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:  # noqa: N802
        client = self._client(context)
        try:
            data = receive_chunks(request_iterator, self.limits)
        except ReceiveError as e:
            self.stats["refused_payloads"] += 1
            context.abort(e.code, f"observation refused: {e}")
        obs = self._decode(data, TimedObservation, context)
        if client.config is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "SendPolicyInstructions first")
        try:
            pending = self._pending(obs, client.config, client.served)
        except ValueError as e:
            self.stats["refused_payloads"] += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"observation #{obs.timestep}: {e}")
        with client.lock:
            if not (obs.must_go or client.last_processed is None or self._is_new(pending, client)):
                self.stats["skipped_observations"] += 1
                return services_pb2.Empty()
            with contextlib.suppress(queue.Empty):
                client.observations.get_nowait()  # a newer one replaces it
            client.observations.put_nowait(pending)
        return services_pb2.Empty()

    def GetActions(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        client = self._client(context)
        try:
            pending: Pending = client.observations.get(timeout=self.obs_queue_timeout_s)
        except queue.Empty:
            return services_pb2.Actions()  # LeRobot answers Empty: the client reads no data and asks again
        obs, config = pending.observation, client.config
        with client.lock:
            client.predicted.add(obs.timestep)
            client.last_processed = (obs.timestep, pending.state)
            client.timesteps[client.session.requests] = obs.timestep
        noise = self.noise_for(client.key, obs.timestep) if self.noise_for is not None else None
        # the client's action time line: timestep k is due at k * dt, so an observation of timestep T (the last
        # action executed) is stamped (T - 1) * dt and the chunk's action i (timestep T + i) is due at
        # stamp + (i + 1) * dt, the frame runner's rule; real-time chunking then continues the chunk last sent to
        # this client from the observation's timestep on. The chunk's age: one step (action 0 is past) plus the
        # time since the observation arrived.
        dt_ns = round(1e9 / self.fps)
        stamp = (obs.timestep - 1 + _STAMP_ORIGIN) * dt_ns
        arrived = pending.arrived_ns
        request = Request(client.session, pending.raw, noise, full_chunk=True, stamp_ns=stamp,
                          clock_ns=lambda: stamp + dt_ns + time.monotonic_ns() - arrived)
        try:
            response = client.served.batcher.submit(request).result()
        except Exception as e:  # the frame failed: this client gets the error, the server goes on
            log.warning(f"client {client.key}: inference failed", exc_info=True)
            context.abort(grpc.StatusCode.INTERNAL, f"inference failed: {type(e).__name__}: {e}")
        chunk = np.asarray(response["chunk"], dtype=np.float32)[: config.actions_per_chunk]
        dt = 1.0 / self.fps
        actions = [TimedAction(obs.timestamp + i * dt, obs.timestep + i, torch.from_numpy(chunk[i].copy()))
                   for i in range(len(chunk))]
        self._log_language(client, response)
        self.stats["served"] += 1
        return services_pb2.Actions(data=dumps(actions))

    # ------------------------------------------------------------------------------------------ helpers
    def _pending(self, obs: TimedObservation, config: RemotePolicyConfig, served: _Served | None = None) -> Pending:
        """The observation as the client's checkpoint reads it (:func:`~.observations.read_observation`)."""
        served = served or self._default
        return read_observation(obs, config, served.pool.policy, served.image_shapes)

    def _decode(self, data: bytes, kind: type, context: grpc.ServicerContext) -> Any:
        if len(data) > self.limits.max_payload_bytes:
            self.stats["refused_payloads"] += 1
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"payload larger than {self.limits.max_payload_bytes}")
        try:
            obj = loads(data)
        except PayloadError as e:
            self.stats["refused_payloads"] += 1
            log.warning(f"payload refused: {e}")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"payload refused: {e}")
        if not isinstance(obj, kind):
            self.stats["refused_payloads"] += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"payload refused: expected a {kind.__name__}, got {type(obj).__name__}")
        return obj

    def _checkpoint(self, name: object, context: grpc.ServicerContext) -> _Served:
        """The checkpoint a client names: the served one (its path in any spelling, an alias), else one under the
        allowed root (loaded on first use); anything else is refused (``PERMISSION_DENIED``), nothing loaded."""
        if isinstance(name, str) and name in self.checkpoint_names:
            return self._default
        try:
            path = Path(name).expanduser().resolve() if isinstance(name, str) and name else None
        except (OSError, RuntimeError, ValueError):
            path = None
        if path is not None and str(path) in self.checkpoint_names:
            return self._default
        root = self.allowed_root
        if path is None or root is None or self.pool_factory is None or not path.is_relative_to(root) or \
                not (path / "config.json").is_file():
            self.stats["refused_checkpoints"] += 1
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"pretrained_name_or_path {name!r} is not served here: this server runs its own checkpoint, "
                          f"named {sorted(self.checkpoint_names)}"
                          + (f", or a checkpoint folder under {root}" if root is not None else ""))
        with self._load_lock:
            served = self._served.get(str(path))
            if served is None:
                if len(self._served) + 1 >= self.max_checkpoints:
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  f"{path}: this server holds at most {self.max_checkpoints} checkpoints")
                try:
                    pool = self.pool_factory(path)
                except Exception as e:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{path}: cannot load: {e}")
                served = _Served(pool, Batcher(pool, self.window_s, self.max_batch), image_shapes(path))
                self._served[str(path)] = served
                log.info(f"loaded {path} (under the allowed root {root})")
        return served


    @staticmethod
    def _is_new(pending: Pending, client: _Client) -> bool:
        """LeRobot's ``_obs_sanity_checks``: not a timestep predicted already, and not too similar (joint distance
        >= 1) to the last observation processed."""
        if pending.observation.timestep in client.predicted:
            return False
        last = client.last_processed[1]
        return last.shape != pending.state.shape or bool(np.linalg.norm(pending.state - last) >= 1)

    def _log_language(self, client: _Client, response: dict) -> None:
        entries = [("language", e) for e in response.get("language", [])] + \
            [("answer", e) for e in response.get("answers", [])]
        if not entries:
            return
        lines = []
        for kind, e in entries:
            rec = {"time": time.time(), "client": client.key, "kind": kind,
                   "timestep": client.timesteps.get(e.get("request", -1)), **e}
            lines.append(json.dumps(rec, default=str))
            log.info(f"client {client.key} {kind} (timestep {rec['timestep']}): {e.get('text', e.get('error'))!r}")
        if self.language_log is not None:
            with self._log_lock, open(self.language_log, "a") as f:
                f.write("".join(line + "\n" for line in lines))

