"""``oxygen-serve --protocol lerobot`` over real gRPC channels on 127.0.0.1: LeRobot 0.6.1's own client bytes and
``PolicyServer`` actions (test/fixtures/lerobot_async), several clients batched, RTC on the async path, the checkpoint
rule, language logs. The allow-list unpickler, its fuzzing, API key and TLS: test_lerobot_serve_security.py; shared
helpers: lerobot_serve_support.py."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import grpc
import lerobot_serve_support
import numpy as np
import pytest
import torch
from google.protobuf import descriptor_pb2
from lerobot_serve_support import (
    ASYNC,
    CHECKPOINT,
    CHUNK,
    FEATURES,
    FIXTURES,
    MOTORS,
    actions_of,
    chunks,
    make_server,
    observation,
    setup,
    stub_for,
)
from safetensors.numpy import load_file

from oxygen_ros.policy.runner import seeded_noise
from oxygen_ros.serve.lerobot_async.payloads import RemotePolicyConfig
from oxygen_ros.serve.lerobot_async.pickler import dumps
from oxygen_ros.serve.lerobot_async.proto import services_pb2
from oxygen_ros.serve.lerobot_async.server import LeRobotServer
from oxygen_ros.serve.lerobot_async.unpickler import loads

# LeRobot 0.6.1's lerobot/transport/services_pb2.py: its serialized FileDescriptorProto (AddSerializedFile)
LEROBOT_DESCRIPTOR = (
    b'\n lerobot/transport/services.proto\x12\ttransport"L\n\nTransition\x120\n\x0etransfer_state\x18\x01 \x01'
    b'(\x0e2\x18.transport.TransferState\x12\x0c\n\x04data\x18\x02 \x01(\x0c"L\n\nParameters\x120\n\x0etransfer_'
    b'state\x18\x01 \x01(\x0e2\x18.transport.TransferState\x12\x0c\n\x04data\x18\x02 \x01(\x0c"T\n\x12Interaction'
    b'Message\x120\n\x0etransfer_state\x18\x01 \x01(\x0e2\x18.transport.TransferState\x12\x0c\n\x04data\x18\x02 '
    b'\x01(\x0c"M\n\x0bObservation\x120\n\x0etransfer_state\x18\x01 \x01(\x0e2\x18.transport.TransferState\x12'
    b'\x0c\n\x04data\x18\x02 \x01(\x0c"\x17\n\x07Actions\x12\x0c\n\x04data\x18\x01 \x01(\x0c"\x1b\n\x0bPolicySetup'
    b'\x12\x0c\n\x04data\x18\x01 \x01(\x0c"\x07\n\x05Empty*`\n\rTransferState\x12\x14\n\x10TRANSFER_UNKNOWN\x10'
    b'\x00\x12\x12\n\x0eTRANSFER_BEGIN\x10\x01\x12\x13\n\x0fTRANSFER_MIDDLE\x10\x02\x12\x10\n\x0cTRANSFER_END\x10'
    b'\x032\x81\x02\n\x0eLearnerService\x12=\n\x10StreamParameters\x12\x10.transport.Empty\x1a\x15.transport.'
    b'Parameters0\x01\x12<\n\x0fSendTransitions\x12\x15.transport.Transition\x1a\x10.transport.Empty(\x01\x12E\n'
    b'\x10SendInteractions\x12\x1d.transport.InteractionMessage\x1a\x10.transport.Empty(\x01\x12+\n\x05Ready\x12'
    b'\x10.transport.Empty\x1a\x10.transport.Empty2\xf5\x01\n\x0eAsyncInference\x12>\n\x10SendObservations\x12\x16'
    b'.transport.Observation\x1a\x10.transport.Empty(\x01\x122\n\nGetActions\x12\x10.transport.Empty\x1a\x12.'
    b'transport.Actions\x12B\n\x16SendPolicyInstructions\x12\x16.transport.PolicySetup\x1a\x10.transport.Empty'
    b'\x12+\n\x05Ready\x12\x10.transport.Empty\x1a\x10.transport.Emptyb\x06proto3')

one_thread, served = lerobot_serve_support.one_thread, lerobot_serve_support.served  # the shared fixtures



# ---------------------------------------------------------------------------------------------- the proto
def test_the_compiled_proto_is_lerobots() -> None:
    fd = descriptor_pb2.FileDescriptorProto()
    services_pb2.DESCRIPTOR.CopyToProto(fd)
    fd.name = "lerobot/transport/services.proto"  # only the file name differs
    assert fd.SerializeToString() == LEROBOT_DESCRIPTOR


# ---------------------------------------------------------------------------------------------- LeRobot's bytes
def test_lerobots_client_bytes_get_lerobots_policy_server_actions(served: LeRobotServer) -> None:
    blobs = load_file(str(ASYNC / "messages.safetensors"))
    expected = load_file(str(ASYNC / "expected.safetensors"))
    meta = json.loads((ASYNC / "meta.json").read_text())
    channel, stub = stub_for(served.port)
    key = {}
    served.noise_for = lambda client, step: expected["noise"][[o["timestep"] for o in meta["observations"]].index(step)]
    try:
        stub.Ready(services_pb2.Empty())
        stub.SendPolicyInstructions(services_pb2.PolicySetup.FromString(blobs["setup"].tobytes()))
        for i, o in enumerate(meta["observations"]):
            msgs = [services_pb2.Observation.FromString(blobs[f"obs{i}.msg{j}"].tobytes())
                    for j in range(o["messages"])]
            stub.SendObservations(iter(msgs))
            got = actions_of(stub.GetActions(services_pb2.Empty(), timeout=120))
            theirs = loads(blobs[f"actions{i}"].tobytes())  # LeRobot's own reply, read by our unpickler
            assert [a.timestep for a in got] == meta["action_timesteps"][i] == [a.timestep for a in theirs]
            np.testing.assert_allclose([a.timestamp for a in got], meta["action_timestamps"][i], rtol=0, atol=1e-9)
            mine = np.stack([a.action.numpy() for a in got])
            assert mine.dtype == np.float32 and mine.shape == (meta["actions_per_chunk"], 7)
            np.testing.assert_allclose(np.stack([a.action.numpy() for a in theirs]), expected["actions"][i], 0, 0)
            key[i] = float(np.abs(mine - expected["actions"][i]).max())
            np.testing.assert_allclose(mine, expected["actions"][i], rtol=0, atol=1e-4)
    finally:
        served.noise_for = None
        channel.close()
    assert len(key) == 3


LEROBOT_PYTHON = Path(os.environ.get("OXYGEN_LEROBOT_PYTHON", "/work/sidenv/lerobot_venv/bin/python"))


@pytest.mark.skipif(not LEROBOT_PYTHON.is_file(), reason="no LeRobot 0.6.1 side environment (OXYGEN_LEROBOT_PYTHON; "
                                                         "test/fixtures/lerobot_async/make_lerobot_async_fixture.py)")
def test_lerobots_own_robot_client_runs_against_it_unchanged(tmp_path: Path) -> None:
    """LeRobot 0.6.1's ``RobotClient`` class itself (its start, action receiver thread and control loop; a plugin
    robot without hardware) in its own environment and process, against this server with real-time chunking."""
    server = make_server(rtc="auto")
    with server as port:
        out = subprocess.run([str(LEROBOT_PYTHON), str(ASYNC / "stock_client" / "run_stock_client.py"), "--server",
                              f"127.0.0.1:{port}", "--seconds", "5"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["started"] and report["finite"] and report["executed"] >= 20, report
    assert report["keys"] == sorted(MOTORS)
    assert server.stats["served"] >= 2 and server.stats["refused_payloads"] == 0
    runner = next(iter(server._clients.values())).session.runner
    assert runner.remainder_counts["timing_rule"] >= 1  # chunks after the first continued the one sent before


# ---------------------------------------------------------------------------------------------- several clients
def test_several_clients_are_batched_and_each_gets_its_own_actions(served: LeRobotServer) -> None:
    pool = served.pool
    stubs = [stub_for(served.port) for _ in range(3)]
    try:
        for _, stub in stubs:
            setup(stub, str(CHECKPOINT), apc=12)
        sessions = sorted(served._clients.values(), key=lambda c: c.session.id)[-3:]
        observations = [observation(5, seed=i, cam_high=(1080, 1920) if i == 0 else (96, 128)) for i in range(3)]
        assert len(dumps(observations[0])) > 2 * CHUNK  # client 0's payload takes several chunks
        barrier, out = threading.Barrier(3), [None] * 3

        def run(i: int) -> None:
            stub = stubs[i][1]
            stub.SendObservations(iter(chunks(dumps(observations[i]))))
            barrier.wait()
            out[i] = actions_of(stub.GetActions(services_pb2.Empty(), timeout=120))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert pool.stats["max_batch"] == 3
        for i, client in enumerate(sessions):
            pending = served._pending(observations[i], client.config)
            noise = seeded_noise(client.session.seed)(0, 12, 32)
            alone = pool.policy.infer(pending.raw, noise)
            np.testing.assert_allclose(np.stack([a.action.numpy() for a in out[i]]), alone, rtol=0, atol=1e-5)
            assert [a.timestep for a in out[i]] == list(range(5, 17))
        assert not np.allclose(out[1][0].action, out[2][0].action)
        # LeRobot's filter: the same timestep again (not must_go) is skipped, GetActions answers empty in time
        skipped = served.stats["skipped_observations"]
        stubs[1][1].SendObservations(iter(chunks(dumps(observation(5, seed=7, must_go=False)))))
        assert served.stats["skipped_observations"] == skipped + 1
        assert stubs[1][1].GetActions(services_pb2.Empty(), timeout=30).data == b""
    finally:
        for channel, _ in stubs:
            channel.close()


def test_clients_sharing_one_connection_are_told_apart_by_their_metadata(served: LeRobotServer) -> None:
    channel, stub = stub_for(served.port)
    try:
        a, b = (("x-oxygen-client", "arm-a"),), (("x-oxygen-client", "arm-b"),)
        setup(stub, metadata=a)
        setup(stub, metadata=b)
        assert {"id:arm-a", "id:arm-b"} <= set(served._clients)
        stub.SendObservations(iter(chunks(dumps(observation(4, 4)))), metadata=a)
        assert stub.GetActions(services_pb2.Empty(), metadata=b, timeout=30).data == b""  # b sent nothing
        assert [x.timestep for x in actions_of(stub.GetActions(services_pb2.Empty(), metadata=a, timeout=120))] == \
            list(range(4, 14))
    finally:
        channel.close()


# ---------------------------------------------------------------------------------------------- RTC
def test_rtc_on_the_async_path_continues_the_chunk_sent_from_the_observations_timestep() -> None:
    """Chunk 1 from timestep 10, chunk 2 from timestep 14: chunk 2 is guided toward chunk 1's actions for timesteps
    14.. (its normalised remainder from index 4), with the delay fixed at 2, exactly as the policy layer's RTC
    (LeRobot 0.6.1's ``predict_action_chunk(..., inference_delay, prev_chunk_left_over)``, test_lerobot_rtc.py)
    computes it on the same inputs."""
    from oxygen_ros.engine.rtc import RTCPrefix

    server = make_server("--rtc-delay", "2", rtc="auto")
    policy = server.pool.policy
    assert server.pool.rtc is not None and server.pool.rtc.config == policy.spec.rtc  # EXP, beta 5, E 8
    noises = {step: torch.randn(1, 12, 32, generator=torch.Generator().manual_seed(step)).numpy()
              for step in (10, 14, 20)}
    server.noise_for = lambda client, step: noises[step]
    with server as port:
        channel, stub = stub_for(port)
        try:
            setup(stub, apc=12)
            a, b = observation(10, 1), observation(14, 2, must_go=False)
            c = observation(20, 3, must_go=False)
            c.observation["task"] = "a new instruction"
            got = []
            for obs in (a, b, c):
                stub.SendObservations(iter(chunks(dumps(obs))))
                got.append(np.stack([x.action.numpy() for x in actions_of(stub.GetActions(services_pb2.Empty(),
                                                                                           timeout=120))]))
        finally:
            channel.close()
    client = next(iter(server._clients.values()))
    raw = [server._pending(o, client.config).raw for o in (a, b, c)]
    np.testing.assert_allclose(got[0], policy.infer(raw[0], noises[10]), rtol=0, atol=1e-5)  # nothing to continue
    prev = policy.infer_normalized(raw[0], noises[10])
    want = policy.infer(raw[1], noises[14], rtc=RTCPrefix(prev[4:], 2))
    plain = policy.infer(raw[1], noises[14])
    np.testing.assert_allclose(got[1], want, rtol=0, atol=1e-4)
    assert np.abs(want - plain).max() > 1e-2  # the guidance moved it
    np.testing.assert_allclose(got[2], policy.infer(raw[2], noises[20]), rtol=0, atol=1e-5)  # a new task: free
    assert client.session.runner.remainder_counts["timing_rule"] == 1


# ---------------------------------------------------------------------------------------------- the checkpoint
def test_a_client_named_checkpoint_elsewhere_is_refused(served: LeRobotServer, tmp_path: Path) -> None:
    channel, stub = stub_for(served.port)
    try:
        stub.Ready(services_pb2.Empty())
        for name in ("/etc", "lerobot/pi05_base", str(tmp_path)):
            config = RemotePolicyConfig("pi05", name, FEATURES, 10)
            with pytest.raises(grpc.RpcError) as e:
                stub.SendPolicyInstructions(services_pb2.PolicySetup(data=dumps(config)))
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED and "is not served here" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.SendPolicyInstructions(services_pb2.PolicySetup(data=dumps(
                RemotePolicyConfig("act", "checkpoint", FEATURES, 10))))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "policy_type 'act'" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:  # observations before instructions
            stub.SendObservations(iter(chunks(dumps(observation(0, 0)))))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        setup(stub, str(CHECKPOINT / ".." / "checkpoint"))  # the served one, by another spelling of its path
    finally:
        channel.close()


def test_a_checkpoint_under_the_allowed_root_is_loaded_on_first_use(tmp_path: Path) -> None:
    import shutil

    root, outside = tmp_path / "models", tmp_path / "outside"
    for name in ("checkpoint", "tokenizer"):  # the tokenizer's relative name: beside the checkpoint
        shutil.copytree(FIXTURES / "lerobot_rtc" / name, root / "copy" / name)
        shutil.copytree(FIXTURES / "lerobot_rtc" / name, outside / name)
    shutil.copytree(FIXTURES / "lerobot_rtc" / "checkpoint", root / "third" / "checkpoint")
    (root / "escape").symlink_to(outside)  # resolves outside the root
    server = make_server("--allowed-root", str(root), "--max-checkpoints", "2")
    workers = lambda: sum(t.name.startswith("lerobot-grpc") for t in threading.enumerate())  # noqa: E731
    before = workers()  # (the shared server's, idle here)
    with server as port:
        channel, stub = stub_for(port)
        try:
            for name in (str(root / "escape" / "checkpoint"), str(root / ".." / "outside" / "checkpoint"),
                         str(root), str(outside / "checkpoint")):
                with pytest.raises(grpc.RpcError) as e:
                    setup(stub, name)
                assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
            setup(stub, str(root / "copy" / "checkpoint"))
            stub.SendObservations(iter(chunks(dumps(observation(0, 0)))))
            got = actions_of(stub.GetActions(services_pb2.Empty(), timeout=120))
            other_channel, other = stub_for(port)
            with pytest.raises(grpc.RpcError) as e:  # a third checkpoint: over --max-checkpoints 2
                setup(other, str(root / "third" / "checkpoint"))
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "at most 2" in e.value.details()
            other_channel.close()
        finally:
            channel.close()
        client = next(c for c in server._clients.values() if c.config is not None)
        assert client.served.pool is not server.pool and client.served.pool.policy.spec.checkpoint == \
            (root / "copy" / "checkpoint")
        raw = server._pending(observation(0, 0), client.config, client.served).raw
        want = server.pool.policy.infer(raw, seeded_noise(client.session.seed)(0, 12, 32))  # the same weights
        np.testing.assert_allclose(np.stack([a.action.numpy() for a in got]), want[:10], rtol=0, atol=1e-5)
    assert workers() == before, "the stopped server's gRPC worker threads outlive it"


# ---------------------------------------------------------------------------------------------- language
def test_language_outputs_are_logged_as_json_lines_with_their_timestep(tmp_path: Path) -> None:
    path = tmp_path / "language.jsonl"
    server = make_server("--language-streams", "memory", "--stream", "memory.every_n_frames=1", "--stream",
                         "memory.max_new_tokens=3", "--max-new-tokens", "4", "--k", "8", "--language-log", str(path))
    with server as port:
        channel, stub = stub_for(port)
        try:
            setup(stub)
            for step in (0, 4, 9):
                stub.SendObservations(iter(chunks(dumps(observation(step, step)))))
                actions_of(stub.GetActions(services_pb2.Empty(), timeout=120))
        finally:
            channel.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines and all(r["kind"] == "language" and r["stream"] == "memory" for r in lines)
    assert [r["timestep"] for r in lines] == [(0, 4, 9)[r["request"]] for r in lines]
    assert all(isinstance(r["text"], str) and r["tokens"] <= 3 for r in lines)
