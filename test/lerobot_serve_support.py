"""What the ``oxygen-serve --protocol lerobot`` tests share (test_lerobot_serve.py, test_lerobot_serve_security.py):
their fixtures (one torch thread, the module's server: each module takes them over by name), the tiny LeRobot
checkpoint's server, a client channel of its own, LeRobot's chunked transfer, observations in its
robot client's form, the policy setup, and reading an Actions reply."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

from oxygen_ros.serve.lerobot_async.payloads import RemotePolicyConfig, TimedAction, TimedObservation
from oxygen_ros.serve.lerobot_async.pickler import dumps
from oxygen_ros.serve.lerobot_async.proto import services_pb2
from oxygen_ros.serve.lerobot_async.server import LeRobotServer
from oxygen_ros.serve.lerobot_async.service import AsyncInferenceStub
from oxygen_ros.serve.lerobot_async.unpickler import loads
from oxygen_ros.serve.options import build_server, parse

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CHECKPOINT = FIXTURES / "lerobot_rtc" / "checkpoint"
ASYNC = FIXTURES / "lerobot_async"
MOTORS = [f"{n}.pos" for n in ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate",
                               "gripper")]
FEATURES = {"observation.state": {"dtype": "float32", "shape": (7,), "names": MOTORS},
            "observation.images.cam_high": {"dtype": "image", "shape": (96, 128, 3),
                                            "names": ["height", "width", "channels"]},
            "observation.images.cam_left_wrist": {"dtype": "image", "shape": (224, 224, 3),
                                                  "names": ["height", "width", "channels"]}}
CHUNK = 2 * 1024 * 1024  # LeRobot's send_bytes_in_chunks


def make_server(*flags: str, rtc: str = "off") -> LeRobotServer:
    """A server on the tiny LeRobot checkpoint (whose ``rtc_config`` enables RTC: off unless asked, as LeRobot's own
    ``PolicyServer`` passes no previous chunk)."""
    server = build_server(parse(["--protocol", "lerobot", "--checkpoint", str(CHECKPOINT), "--host", "127.0.0.1",
                                 "--port", "0", "--dtype", "float32", "--kernels", "plain", "--lerobot-rtc", rtc,
                                 "--request-every-n-frames", "0", "--checkpoint-alias", "checkpoint", *flags]))
    assert isinstance(server, LeRobotServer)
    return server


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def served() -> Iterator[LeRobotServer]:
    """The server a test module shares (a 3 s batch window, small payload and chunk limits)."""
    server = make_server("--batch-window-ms", "3000", "--obs-queue-timeout", "0.5", "--max-payload-mb", "8",
                         "--max-chunks", "6")
    server.start()
    yield server
    server.stop()


def stub_for(port: int, channel_options: list | None = None) -> tuple[grpc.Channel,
                                                                     AsyncInferenceStub]:
    """A channel of its own connection (gRPC shares one between a process's channels to the same target unless told
    not to; separate robot processes have separate connections anyway): one LeRobot client per channel."""
    options = [("grpc.use_local_subchannel_pool", 1), *(channel_options or [])]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=options)
    return channel, AsyncInferenceStub(channel)


def chunks(data: bytes, states: list[int] | None = None) -> list:
    """LeRobot's ``send_bytes_in_chunks``: 2 MB pieces, BEGIN / MIDDLE / END (a one-piece payload: END)."""
    pieces = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]
    if states is None:
        states = [services_pb2.TRANSFER_END if i == len(pieces) - 1 else
                  services_pb2.TRANSFER_BEGIN if i == 0 else services_pb2.TRANSFER_MIDDLE for i in range(len(pieces))]
    return [services_pb2.Observation(transfer_state=s, data=p) for s, p in zip(states, pieces, strict=True)]


def observation(step: int, seed: int, must_go: bool = True, cam_high: tuple[int, int] = (96, 128)) -> TimedObservation:
    rng = np.random.RandomState(seed)
    raw: dict = {m: float(rng.uniform(-1, 1)) for m in MOTORS}
    raw["cam_high"] = rng.randint(0, 256, (*cam_high, 3), dtype=np.uint8)
    raw["cam_left_wrist"] = rng.randint(0, 256, (224, 224, 3), dtype=np.uint8)
    raw["task"] = "put the red block in the bowl"
    return TimedObservation(1000.0 + step / 30, step, raw, must_go)


def setup(stub: AsyncInferenceStub, name: str = "checkpoint", apc: int = 10, **kw) -> None:
    stub.Ready(services_pb2.Empty(), **kw)
    config = RemotePolicyConfig("pi05", name, FEATURES, apc, "cuda")
    stub.SendPolicyInstructions(services_pb2.PolicySetup(data=dumps(config)), **kw)


def actions_of(reply: services_pb2.Actions) -> list[TimedAction]:
    got = loads(reply.data)
    assert isinstance(got, list) and all(isinstance(a, TimedAction) for a in got)
    return got

