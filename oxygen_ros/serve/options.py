"""``oxygen-serve``'s options: the node's checkpoint, engine, language-stream and question options (from their one
definition, :class:`~oxygen_ros.policy.options.RunnerParams`) as flags, plus the server's own; and the server they
describe.

A shared option ``checkpoint_path`` is the flag ``--checkpoint-path`` (``--checkpoint`` too), ``ask_priority`` is
``--ask-priority``; a stream's fields are ``--stream NAME.FIELD=VALUE`` (``--stream memory.every_n_frames=2``).
``--config FILE`` reads a node parameter file (``config/*.yaml``: its ``ros__parameters``): the shared options in it
are the defaults the flags override; the node's other parameters (cameras, joints, rates) are ignored.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from oxygen_ros.engine.engine import build_engine
from oxygen_ros.engine.modes import NODE_MODES
from oxygen_ros.engine.threads import run_in_scratch_thread
from oxygen_ros.engine.tokenizer import CUSTOM_TASK
from oxygen_ros.params import add_arguments, arg_type, specs_of
from oxygen_ros.policy import SpecOptions, load_policy
from oxygen_ros.policy.configure import engine_config as shared_engine_config
from oxygen_ros.policy.configure import language_schedules
from oxygen_ros.policy.device import resolve_device
from oxygen_ros.policy.options import REQUEST_TASKS, RunnerParams, StreamParams
from oxygen_ros.policy.rtc import PAPER_RTC, RTCSchedule

from .keys import KEY_MAPS, key_map_for
from .lerobot_async.server import LeRobotServer
from .lerobot_async.transfer import Limits
from .server import PolicyServer
from .sessions import QuestionConfig, SessionPool

__all__ = ["build_parser", "build_server", "runner_params"]

log = logging.getLogger(__name__)
_FIELDS = {f.name: f for f in dataclasses.fields(RunnerParams)}
_STREAM_SPECS = {s.name: s for s in specs_of(StreamParams, skip=("name",))}


def build_parser() -> argparse.ArgumentParser:
    """The command line (the shared options first, then the server's)."""
    ap = argparse.ArgumentParser(prog="oxygen-serve", description=(
        "Serve a pi0.5 checkpoint over openpi's websocket policy protocol (openpi_client.WebsocketClientPolicy "
        "clients run unchanged) or, with --protocol lerobot, LeRobot's async-inference gRPC service (its "
        "RobotClient); several clients are batched, and language outputs come in responses (openpi) or a JSON-lines "
        "log (lerobot)."), formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--config", type=Path, help="node parameter file (config/*.yaml): its shared options become "
                                                "the defaults")
    shared = ap.add_argument_group("checkpoint, engine and language (the node's parameters of the same names)")
    add_arguments(shared, specs_of(RunnerParams), aliases={"checkpoint_path": ["--checkpoint"]},
                  choices={"mode": NODE_MODES})
    shared.add_argument("--stream", action="append", default=[], metavar="NAME.FIELD=VALUE",
                        help="a language stream's field (" + ", ".join(_STREAM_SPECS) + ")")
    srv = ap.add_argument_group("server")
    srv.add_argument("--protocol", default="openpi", choices=("openpi", "lerobot"),
                     help="openpi: openpi's websocket policy protocol; lerobot: LeRobot 0.6.1's async-inference gRPC "
                          "service (its RobotClient)")
    srv.add_argument("--host", default="0.0.0.0")
    srv.add_argument("--port", type=int, default=None, help="0: any free port (default: 8000 openpi, 8080 lerobot)")
    srv.add_argument("--api-key", default="", help="require this API key ('' = open): openpi-client's header, or "
                                                   "the gRPC metadata 'authorization: Api-Key <key>'")
    srv.add_argument("--keys", default="auto", choices=("auto", *KEY_MAPS),
                     help="observation key map; auto: the checkpoint's openpi robot (libero, droid, aloha), else "
                          "generic")
    srv.add_argument("--default-prompt", default="", help="prompt of requests without one ('' = required)")
    srv.add_argument("--metadata", default=None, help="JSON map sent on connect (default: the key map's)")
    srv.add_argument("--serial", action="store_true",
                     help="openpi-style: each request alone, inside the event loop (a baseline)")
    srv.add_argument("--batch-window-ms", type=float, default=5.0,
                     help="a batch starts at most this long after its first request arrived")
    srv.add_argument("--max-batch", type=int, default=16, help="observations per batched frame at most")
    srv.add_argument("--max-message-mb", type=float, default=0.0, help="largest request (0: no limit, as openpi)")
    lr = ap.add_argument_group("lerobot protocol")
    lr.add_argument("--fps", type=float, default=30.0, help="the robot's control rate (LeRobot's --fps): action i "
                                                           "of a chunk is stamped timestamp + i / fps")
    lr.add_argument("--obs-queue-timeout", type=float, default=2.0,
                    help="seconds GetActions waits for an observation before answering empty")
    lr.add_argument("--checkpoint-alias", action="append", default=[],
                    help="a pretrained_name_or_path clients may send for the served checkpoint (e.g. its Hub repo "
                         "id); its resolved path is always accepted, any other name is refused")
    lr.add_argument("--allowed-root", type=Path, default=None,
                    help="a folder whose checkpoints clients may name too (loaded on first use; symlinks and '..' "
                         "resolved before the check); unset: only the served checkpoint")
    lr.add_argument("--max-checkpoints", type=int, default=2,
                    help="checkpoints held at most, the served one included (with --allowed-root)")
    lr.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate chain: serve TLS only")
    lr.add_argument("--tls-key", type=Path, default=None, help="PEM private key of --tls-cert")
    lr.add_argument("--max-payload-mb", type=float, default=64.0, help="largest pickled payload")
    lr.add_argument("--max-chunks", type=int, default=64, help="most messages in one SendObservations stream")
    lr.add_argument("--lerobot-rtc", default="auto", choices=("auto", "on", "off"),
                    help="real-time chunking on the async path (each chunk continues the one last sent to that "
                         "client, from the observation's timestep): auto = when the checkpoint's rtc_config enables "
                         "it; on = always (the checkpoint's settings, else the paper's)")
    lr.add_argument("--rtc-delay", type=int, default=-1,
                    help="real-time chunking's inference delay in actions (-1: estimated per client from its chunk "
                         "ages)")
    lr.add_argument("--client-idle-s", type=float, default=30.0,
                    help="a client silent this long is gone: its session closes (batches stop waiting for it)")
    lr.add_argument("--language-log", type=Path, default=None,
                    help="JSON-lines file of language outputs and answers, with their observation timestep")
    srv.add_argument("--log-level", default="INFO")
    return ap


def _config_defaults(path: Path) -> dict[str, Any]:
    """The shared options (and stream fields) of a node parameter file."""
    data = yaml.safe_load(path.read_text()) or {}
    values = next((v.get("ros__parameters", {}) for v in data.values() if isinstance(v, Mapping)), {})
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in _FIELDS:
            out[name] = list(value) if isinstance(value, list | tuple) else value
        elif name == "ask" and isinstance(value, Mapping):
            out.update({f"ask_{k}": v for k, v in value.items() if f"ask_{k}" in _FIELDS})
    streams = [f"{n}.{k}={v}" for n in out.get("language_streams", []) if isinstance(values.get(n), Mapping)
               for k, v in values[n].items()]
    return out | ({"stream": streams} if streams else {})


def runner_params(args: argparse.Namespace) -> tuple[RunnerParams, tuple[StreamParams, ...]]:
    """The shared options and the language streams the flags describe.

    Raises:
        ValueError: a malformed ``--stream``, an unknown stream or field, a stream whose task needs a prompt.
    """
    p = RunnerParams(**{n: tuple(getattr(args, n)) if isinstance(getattr(args, n), list) else getattr(args, n)
                        for n in _FIELDS})
    if not p.language_streams:
        if p.request_every_n_frames == 0:
            return p, ()
        return p, (StreamParams(p.request_task, p.request_task, p.request_prompt, p.request_every_n_frames),)
    fields: dict[str, dict[str, Any]] = {n: {} for n in p.language_streams}
    for item in args.stream:
        key, sep, value = item.partition("=")
        name, dot, field_name = key.partition(".")
        if not sep or not dot:
            raise ValueError(f"--stream {item!r}: expected NAME.FIELD=VALUE")
        if name not in fields:
            raise ValueError(f"--stream {item!r}: {name!r} is not one of --language-streams {list(fields)}")
        if field_name not in _STREAM_SPECS:
            raise ValueError(f"--stream {item!r}: unknown field {field_name!r} (known: {', '.join(_STREAM_SPECS)})")
        try:
            fields[name][field_name] = arg_type(_STREAM_SPECS[field_name])(str(value))
        except (ValueError, argparse.ArgumentTypeError) as e:
            raise ValueError(f"--stream {item!r}: {e}") from e
    streams = []
    for name, got in fields.items():
        s = StreamParams(name=name, **got)
        s = dataclasses.replace(s, task=s.task or (name if name in REQUEST_TASKS else CUSTOM_TASK))
        if s.adapter:
            raise ValueError(f"--stream {name}.adapter: LoRA streams are not served yet (the node runs them)")
        streams.append(s)
    return p, tuple(streams)


def build_server(args: argparse.Namespace) -> PolicyServer | LeRobotServer:
    """Load the checkpoint and build the server the parsed flags describe (on a thread that ends, so the thread
    that serves inference is the process's only OpenMP team: ``engine/threads.py``).

    Raises:
        ValueError, FileNotFoundError, PolicyConfigError: naming the flag or file.
    """
    return run_in_scratch_thread(_build_server, args, name="oxygen-serve-setup")


def _build_server(args: argparse.Namespace) -> PolicyServer | LeRobotServer:
    p, stream_params = runner_params(args)
    if not p.checkpoint_path:
        raise ValueError("--checkpoint: required")
    if p.torch_threads:
        torch.set_num_threads(p.torch_threads)
    pool = _pool(args, p, stream_params, p.checkpoint_path)
    if args.protocol == "lerobot":
        return _lerobot_server(args, pool, lambda path: run_in_scratch_thread(
            _pool, args, p, stream_params, str(path), name="oxygen-serve-load"))
    metadata = json.loads(args.metadata) if args.metadata else None
    return PolicyServer(pool, host=args.host, port=8000 if args.port is None else args.port,
                        api_key=args.api_key or None, metadata=metadata,
                        serial=args.serial, window_s=args.batch_window_ms / 1e3, max_batch=args.max_batch,
                        max_message_bytes=int(args.max_message_mb * 2**20) or None)


def _pool(args: argparse.Namespace, p: RunnerParams, stream_params: Sequence[StreamParams],
          checkpoint: str) -> SessionPool:
    """The session pool (policy, engine, streams) of one checkpoint."""
    device, dtype = resolve_device(p.device, p.dtype)
    options = SpecOptions(p.tokenizer_path, p.asset_id, p.openpi_config, p.normalization, p.norm_stats_path)
    policy = load_policy(checkpoint, options, dtype=dtype, device=device, precision=p.dtype)
    log.info(policy.spec.summary())
    log.info(f"precision {policy.precision.describe()}")
    tok = policy.tokenizer
    rtc = None
    if args.protocol == "lerobot" and args.lerobot_rtc == "on":
        rtc = dataclasses.replace(policy.spec.rtc, enabled=True) if policy.spec.rtc is not None else PAPER_RTC
    elif args.protocol == "lerobot" and args.lerobot_rtc == "auto" and policy.spec.rtc is not None \
            and policy.spec.rtc.enabled:
        rtc = policy.spec.rtc
    engine_config = shared_engine_config(p, tok.eos_id, num_steps=policy.model.config.num_steps, rtc=rtc)
    engine_config.validate()
    streams = language_schedules(p, stream_params)
    questions = QuestionConfig.from_options(p)
    pool = SessionPool(policy, lambda: build_engine(policy.model, engine_config, detokenize=tok.decode), streams,
                       seed=p.seed, n_execute=p.actions_per_chunk or None, condition_on=p.subtask_conditioning,
                       questions=questions,
                       key_map=key_map_for(args.keys, policy.spec), default_prompt=args.default_prompt,
                       rtc=None if rtc is None else RTCSchedule(rtc, 1.0 / args.fps,
                                                                None if args.rtc_delay < 0 else args.rtc_delay))
    if rtc is not None:
        log.info(f"real-time chunking on the async path: {rtc}")
    return pool


def _lerobot_server(args: argparse.Namespace, pool: SessionPool,
                    pool_factory: Callable[[Path], SessionPool]) -> LeRobotServer:
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    tls = (args.tls_cert.read_bytes(), args.tls_key.read_bytes()) if args.tls_cert is not None else None
    checkpoint = str(args.checkpoint_path)
    names = {checkpoint, str(Path(checkpoint).expanduser().resolve()), *args.checkpoint_alias}
    limits = Limits(max_payload_bytes=int(args.max_payload_mb * 2**20), max_chunks=args.max_chunks)
    return LeRobotServer(pool, checkpoint_names=names, host=args.host, port=8080 if args.port is None else args.port,
                         api_key=args.api_key or None, tls=tls, fps=args.fps,
                         obs_queue_timeout_s=args.obs_queue_timeout, window_s=args.batch_window_ms / 1e3,
                         max_batch=args.max_batch, limits=limits, language_log=args.language_log,
                         client_idle_s=args.client_idle_s, allowed_root=args.allowed_root,
                         pool_factory=pool_factory, max_checkpoints=args.max_checkpoints)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line, a ``--config`` file's shared options as the defaults."""
    ap = build_parser()
    first, _ = ap.parse_known_args(argv)
    if first.config is not None:
        ap.set_defaults(**_config_defaults(first.config))
    return ap.parse_args(argv)
