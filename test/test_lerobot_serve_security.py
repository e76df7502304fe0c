"""``oxygen-serve --protocol lerobot``'s defences over real gRPC channels on 127.0.0.1: the allow-list unpickler and
its fuzzing (a payload whose ``__reduce__`` would write a file, malformed transfers, mutated payloads, LeRobot's
payload forms), the API key in the call metadata and TLS with a certificate. Shared helpers: lerobot_serve_support.py.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import threading
from pathlib import Path

import grpc
import lerobot_serve_support
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lerobot_serve_support import (
    MOTORS,
    actions_of,
    chunks,
    make_server,
    observation,
    setup,
    stub_for,
)

from oxygen_ros.serve.lerobot_async import numpy_state, torch_state
from oxygen_ros.serve.lerobot_async.payloads import PayloadError, TimedAction, TimedObservation
from oxygen_ros.serve.lerobot_async.pickler import dumps
from oxygen_ros.serve.lerobot_async.proto import services_pb2
from oxygen_ros.serve.lerobot_async.server import LeRobotServer
from oxygen_ros.serve.lerobot_async.service import AsyncInferenceStub
from oxygen_ros.serve.lerobot_async.unpickler import MAX_DEPTH, loads

one_thread, served = lerobot_serve_support.one_thread, lerobot_serve_support.served  # the shared fixtures


# ---------------------------------------------------------------------------------------------- the unpickler
class WritesAFile:
    """A payload whose ``__reduce__`` writes a file when unpickled (the CVE's shape)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (exec, (f"open({str(self.path)!r}, 'w').write('owned')",))


class Nested:
    def __init__(self, inner: object) -> None:
        self.inner = inner

    def __reduce__(self):
        return (os.system, (f"touch {self.inner}",))


def test_a_payload_that_would_write_a_file_is_refused_and_nothing_is_written(served: LeRobotServer,
                                                                              tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(WritesAFile(probe)))  # plain pickle runs it: the payload is real
    assert probe.read_text() == "owned"
    target, target2 = tmp_path / "owned", tmp_path / "owned2"
    obs = observation(0, 0)
    obs.observation["cam_high"] = WritesAFile(target)
    evil_obs = dumps(obs)
    evil_setup = pickle.dumps(Nested(target2))
    with pytest.raises(PayloadError, match="refused global builtins.exec"):
        loads(evil_obs)
    channel, stub = stub_for(served.port)
    try:
        setup(stub)
        with pytest.raises(grpc.RpcError) as e:
            stub.SendObservations(iter(chunks(evil_obs)))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "refused global builtins.exec" in \
            e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.SendPolicyInstructions(services_pb2.PolicySetup(data=evil_setup))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "refused global posix.system" in \
            e.value.details()
        assert not target.exists() and not target2.exists()
        stub.SendObservations(iter(chunks(dumps(observation(3, 1)))))  # the server keeps serving
        assert len(actions_of(stub.GetActions(services_pb2.Empty(), timeout=120))) == 10
    finally:
        channel.close()


def deep(depth: int) -> bytes:
    obj: object = 1.0
    for _ in range(depth):
        obj = [obj]
    return dumps(TimedObservation(0.0, 0, {"x": obj}))


def test_fuzz_cases_get_clear_grpc_errors_and_the_server_keeps_serving(served: LeRobotServer) -> None:
    good = dumps(observation(2, 3))
    big = dumps(observation(2, 3, cam_high=(1080, 1920)))
    n = len(chunks(big))  # 4 chunks
    cases = {
        "truncated chunk": ([services_pb2.Observation(transfer_state=services_pb2.TRANSFER_END, data=good[:-40])],
                            grpc.StatusCode.INVALID_ARGUMENT, "not a valid payload"),
        "stream without END": (chunks(big)[:2], grpc.StatusCode.INVALID_ARGUMENT, "ended before TRANSFER_END"),
        "unknown state": ([services_pb2.Observation(transfer_state=services_pb2.TRANSFER_UNKNOWN, data=good)],
                          grpc.StatusCode.INVALID_ARGUMENT, "unknown transfer state 0"),
        "state 7": ([services_pb2.Observation(transfer_state=7, data=good)], grpc.StatusCode.INVALID_ARGUMENT,
                    "unknown transfer state 7"),
        "MIDDLE first": (chunks(big, [services_pb2.TRANSFER_MIDDLE] * (n - 1) + [services_pb2.TRANSFER_END]),
                         grpc.StatusCode.INVALID_ARGUMENT, "MIDDLE before TRANSFER_BEGIN"),
        "too many chunks": ([services_pb2.Observation(transfer_state=services_pb2.TRANSFER_BEGIN, data=b"x")] +
                            [services_pb2.Observation(transfer_state=services_pb2.TRANSFER_MIDDLE, data=b"x")] * 9,
                            grpc.StatusCode.RESOURCE_EXHAUSTED, "more than 6 chunks"),
        "oversized": (chunks(b"\0" * (9 << 20)), grpc.StatusCode.RESOURCE_EXHAUSTED, "payload larger than"),
        "foreign class": (chunks(dumps(TimedObservation(0.0, 0, {"x": threading.Lock}))),
                          grpc.StatusCode.INVALID_ARGUMENT, "refused global _thread"),
        "deep nesting": (chunks(deep(MAX_DEPTH + 5)), grpc.StatusCode.INVALID_ARGUMENT, "nesting deeper than"),
        "not a TimedObservation": (chunks(pickle.dumps({"x": 1})), grpc.StatusCode.INVALID_ARGUMENT,
                                   "expected a TimedObservation"),
        "object array": (chunks(dumps(TimedObservation(0.0, 0, {"x": np.array([1, "a"], dtype=object)}))),
                         grpc.StatusCode.INVALID_ARGUMENT, "dtype"),
        "wrong state size": (chunks(dumps(TimedObservation(0.0, 0, {**observation(0, 0).observation,
                                                                    MOTORS[0]: "x"}))),
                             grpc.StatusCode.INVALID_ARGUMENT, "expected a number"),
    }
    channel, stub = stub_for(served.port, [("grpc.max_send_message_length", 64 << 20)])
    refused = served.stats["refused_payloads"]
    try:
        setup(stub)
        for name, (msgs, code, text) in cases.items():
            with pytest.raises(grpc.RpcError) as e:
                stub.SendObservations(iter(msgs), timeout=60)
            assert e.value.code() == code and text in e.value.details(), (name, e.value.details())
        assert served.stats["refused_payloads"] == refused + len(cases)
        stub.SendObservations(iter(chunks(good)))
        assert [a.timestep for a in actions_of(stub.GetActions(services_pb2.Empty(), timeout=120))] == \
            list(range(2, 12))
    finally:
        channel.close()


@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")  # pickletools on mutated STRINGs
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_the_unpickler_with_mutated_payloads(data: st.DataObject) -> None:
    """Random cuts, flips and splices of real payloads: a payload or PayloadError, never another exception."""
    base = data.draw(st.sampled_from(SAMPLES))
    buf = bytearray(base)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(("flip", "cut", "insert")))
        i = data.draw(st.integers(0, max(len(buf) - 1, 0)))
        if op == "flip" and buf:
            buf[i] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del buf[i:i + data.draw(st.integers(1, 64))]
        else:
            buf[i:i] = data.draw(st.binary(min_size=1, max_size=16))
    with contextlib.suppress(PayloadError):
        loads(bytes(buf))


SAMPLES = [dumps(TimedObservation(1.0, 2, {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": 1.5,
                                           "t": torch.arange(4.0), "task": "x"}, True), protocol=p)
           for p in (2, 4, 5)] + [dumps([TimedAction(0.0, 1, torch.ones(3))])]


def test_the_unpickler_reads_lerobot_payload_forms() -> None:
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    views = dumps([TimedAction(0.1 * i, i, row) for i, row in enumerate(list(t))])  # views of one storage
    got = loads(views)
    assert all(torch.equal(a.action, t[i]) for i, a in enumerate(got))
    for p in (2, 3, 4, 5):
        obs = loads(dumps(TimedObservation(1.0, 2, {"img": np.zeros((2, 3, 3), np.uint8), "f": np.float32(2),
                                                    "b": torch.tensor([True, False])}), protocol=p))
        assert obs.observation["img"].shape == (2, 3, 3) and obs.observation["f"] == 2
        assert obs.observation["b"].dtype == torch.bool
    shared = [1.0]
    for _ in range(60):  # 2^60 leaves if walked as a tree: each object is visited once
        shared = [shared, shared]
    with pytest.raises(PayloadError, match="nesting deeper"):
        loads(pickle.dumps(shared))
    with pytest.raises(PayloadError, match="not on the allow-list"):
        loads(pickle.dumps(Path("/etc")))
    # BUILD on an allow-listed global (its class or function object) would set attributes for every later request
    for module, name in (("numpy", "ndarray"), ("torch._utils", "_rebuild_tensor_v2"), ("numpy", "dtype"),
                         ("lerobot.async_inference.helpers", "TimedObservation"), ("lerobot.configs.types",
                                                                                    "FeatureType")):
        head = b"\x80\x04" + bytes([0x8c, len(module)]) + module.encode() + bytes([0x8c, len(name)]) + name.encode()
        for state in (b"N}\x8c\x01xK\x01s\x86", b"N}\x8c\x0c__defaults__\x88\x85s\x86"):  # (None, slotstate)
            with pytest.raises(PayloadError):
                loads(head + b"\x93" + state + b"b.")
    assert torch_state.rebuild_tensor_v2.__defaults__ == (False, None, None)
    assert not hasattr(numpy_state.NDArrayClass, "x")
    # 12 bytes that make CPython's unpickler size its memo for 2^31 entries (16 GB, zeroed): refused before it runs
    with pytest.raises(PayloadError, match="memo index"):
        loads(b"\x80\x04N" + b"r" + (1 << 31).to_bytes(4, "little") + b".")


# ---------------------------------------------------------------------------------------------- API key and TLS
def test_api_key_in_call_metadata() -> None:
    server = make_server("--api-key", "s3cret")
    with server as port:
        channel, stub = stub_for(port)
        try:
            for metadata in ((), (("authorization", "Api-Key wrong"),), (("x-api-key", ""),)):
                with pytest.raises(grpc.RpcError) as e:
                    stub.Ready(services_pb2.Empty(), metadata=metadata)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as e:
                stub.SendObservations(iter(chunks(dumps(observation(0, 0)))))
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            ok = (("authorization", "Api-Key s3cret"),)
            setup(stub, metadata=ok)
            stub.Ready(services_pb2.Empty(), metadata=(("x-api-key", "s3cret"),))
        finally:
            channel.close()
        assert server.refused_keys == 4


def test_tls_with_a_certificate(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    server = make_server("--tls-cert", str(cert), "--tls-key", str(key), "--api-key", "k")
    with server as port:
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(f"localhost:{port}", creds) as channel:
            stub = AsyncInferenceStub(channel)
            setup(stub, metadata=(("authorization", "Api-Key k"),))
        with grpc.insecure_channel(f"localhost:{port}") as plain:  # plaintext to a TLS port: no connection
            with pytest.raises(grpc.RpcError) as e:
                AsyncInferenceStub(plain).Ready(services_pb2.Empty(), timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        other = grpc.ssl_channel_credentials()  # the system's roots do not trust the self-signed certificate
        with grpc.secure_channel(f"localhost:{port}", other) as channel:
            with pytest.raises(grpc.RpcError) as e:
                AsyncInferenceStub(channel).Ready(services_pb2.Empty(), timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
