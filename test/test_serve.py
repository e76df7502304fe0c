"""``oxygen-serve`` against the real ``openpi_client.WebsocketClientPolicy`` (openpi-client from PyPI) on
127.0.0.1: openpi's protocol, openpi's actions on openpi's own fixtures, batching, language, errors, API keys."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from oxygen_ros.policy import RawObservation
from oxygen_ros.policy.runner import seeded_noise
from oxygen_ros.serve import KEY_MAPS, ObservationError, PolicyServer, ServerThread, pack, unpack
from oxygen_ros.serve.options import build_server, parse

websocket_client_policy = pytest.importorskip("openpi_client.websocket_client_policy",
                                              reason="openpi-client is not installed (make setup installs it)")
msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy")
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")  # the client's
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "openpi"
ROBOTS = ("pi05_libero", "pi05_droid", "pi05_aloha")


def server_for(name: str, *flags: str, dtype: str = "float32") -> PolicyServer:
    """A server on fixture ``name``, in ``dtype`` (float32: against openpi's float32 references, at 1e-4)."""
    root = FIXTURES / name
    return build_server(parse(["--checkpoint", str(root / "checkpoint"), "--tokenizer-path",
                               str(root / "tokenizer"), "--host", "127.0.0.1", "--port", "0", "--dtype", dtype,
                               *flags]))


def samples(name: str) -> list[tuple[dict, np.ndarray, np.ndarray]]:
    """(what openpi's client sends, the fixture's noise, openpi's actions) per sample."""
    root = FIXTURES / name
    inputs, expected = load_file(str(root / "inputs.safetensors")), load_file(str(root / "expected.safetensors"))
    meta = json.loads((root / "inputs.json").read_text())
    out = []
    for s in range(meta["samples"]):
        obs: dict = {}
        for key in meta["sample_keys"][s]:
            if name == "pi05_aloha" and key.startswith("images/"):
                obs.setdefault("images", {})[key.split("/", 1)[1]] = inputs[f"s{s}/{key}"]
            else:
                obs[key] = inputs[f"s{s}/{key}"]
        obs["prompt"] = meta["prompts"][s]
        out.append((obs, inputs[f"s{s}/noise"], expected[f"s{s}/actions"]))
    return out


def client(port: int, **kw) -> websocket_client_policy.WebsocketClientPolicy:
    return websocket_client_policy.WebsocketClientPolicy("127.0.0.1", port, **kw)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def libero() -> tuple[PolicyServer, int]:
    server = server_for("pi05_libero", "--request-every-n-frames", "0", "--batch-window-ms", "2000")
    thread = ServerThread(server)
    port = thread.start()
    yield server, port
    thread.stop()


# ---------------------------------------------------------------------------------------------- protocol
def test_the_encoding_is_openpi_clients_both_ways() -> None:
    obs = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.uint8(7), "c": [1, "x"], "d": {"e": b"z"}}
    mine = unpack(msgpack_numpy.packb(obs))
    theirs = msgpack_numpy.unpackb(pack(obs))
    for got in (mine, theirs):
        np.testing.assert_array_equal(got["a"], obs["a"])
        assert got["a"].dtype == np.float32 and got["b"] == 7 and got["b"].dtype == np.uint8
        assert got["c"] == [1, "x"] and got["d"] == {"e": b"z"}
    bad = msgpack_numpy.packb({"x": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "|O", b"shape": [1]}})
    with pytest.raises(ValueError, match="unsupported dtype"):
        unpack(bad)


def test_metadata_on_connect() -> None:
    server = server_for("pi05_aloha", "--request-every-n-frames", "0")
    with ServerThread(server) as port:
        assert client(port).get_server_metadata() == {"reset_pose": [0, -1.5, 1.5, 0, 0, 0]}  # openpi's pi05_aloha
    assert server.pool.key_map is KEY_MAPS["aloha"]


# ---------------------------------------------------------------------------------------------- openpi's actions
@pytest.mark.parametrize("name", ROBOTS)
def test_actions_equal_openpi_policy_infer(name: str) -> None:
    server = server_for(name, "--request-every-n-frames", "0", "--seed", "5")
    with ServerThread(server) as port:
        policy = client(port)
        assert policy.get_server_metadata() == server.metadata
        for obs, noise, want in samples(name):
            got = policy.infer({**obs, "noise": noise})  # openpi's own noise: openpi's own actions
            assert got["actions"].shape == want.shape and got["actions"].dtype == np.float64
            np.testing.assert_allclose(got["actions"], want, rtol=0, atol=1e-4)
            # the frame (observation in -> chunk ready) lies within the server's request -> response
            assert 0 < got["policy_timing"]["infer_ms"] <= got["server_timing"]["infer_ms"], got
        # the client's seeded noise (seed 5, its 4th request): Policy.infer with that noise
        obs = samples(name)[0][0]
        got = policy.infer(obs)
        assert "prev_total_ms" in got["server_timing"] and got["oxygen"]["request"] == 3
        raw = server.pool.key_map.read(obs, server.pool.policy.spec)
        noise = seeded_noise(5)(3, server.pool.policy.spec.chunk_size, 32)
        np.testing.assert_allclose(got["actions"], server.pool.policy.infer(raw, noise), rtol=0, atol=1e-5)


def test_by_default_an_openpi_checkpoint_runs_openpis_bf16() -> None:
    """``--dtype auto`` (the default) follows the checkpoint: openpi's mixed bf16 (``bfloat16_islands``), whose
    actions are openpi's bf16 ones within our bf16 noise floor (bit-identical on the fixtures' host)."""
    name = "pi05_libero"
    server = server_for(name, "--request-every-n-frames", "0", dtype="auto")
    assert server.pool.policy.precision.precision == "bfloat16_islands"
    e16 = load_file(str(FIXTURES / name / "expected_bf16.safetensors"))
    floor = json.loads((FIXTURES / "noise_floor_bf16.json").read_text())["fixtures"][name]["noise_floor"]
    with ServerThread(server) as port:
        policy = client(port)
        for s, (obs, noise, want32) in enumerate(samples(name)):
            got = policy.infer({**obs, "noise": noise})["actions"]
            err16, err32 = np.abs(got - e16[f"s{s}/actions"]).max(), np.abs(got - want32).max()
            assert err16 <= 2 * floor and err16 < 0.5 * err32, (s, err16, err32)


# ---------------------------------------------------------------------------------------------- errors
def test_a_bad_key_gets_openpis_error_path_and_the_server_keeps_serving(libero) -> None:
    server, port = libero
    obs, noise, want = samples("pi05_libero")[0]
    policy = client(port)
    broken = {k: v for k, v in obs.items() if k != "observation/wrist_image"}
    with pytest.raises(RuntimeError, match="missing key 'observation/wrist_image'"):
        policy.infer(broken)
    with pytest.raises(ConnectionClosed) as closed:  # the traceback came as a text frame, then the close
        policy._ws.recv(timeout=10)
    assert closed.value.rcvd.code == 1011
    with pytest.raises(RuntimeError, match="'observation/state'"):
        client(port).infer({**obs, "observation/state": np.zeros(3)})  # a malformed key, named
    got = client(port).infer({**obs, "noise": noise})  # a new connection is served
    np.testing.assert_allclose(got["actions"], want, rtol=0, atol=1e-4)


def test_key_maps_name_what_is_wrong() -> None:
    spec = server_for("pi05_aloha", "--request-every-n-frames", "0").pool.policy.spec
    obs = samples("pi05_aloha")[0][0]
    aloha = KEY_MAPS["aloha"]
    raw = aloha.read(obs, spec)
    assert set(raw.images) == {"base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"}  # cam_low: accepted, unused
    for broken, message in [({**obs, "images": {**obs["images"], "cam_top": obs["images"]["cam_high"]}},
                             "'images/cam_top': unknown camera"),
                            ({**obs, "images": {k: v for k, v in obs["images"].items() if k != "cam_high"}},
                             "missing key 'images/cam_high'"),
                            ({k: v for k, v in obs.items() if k != "prompt"}, "missing key 'prompt'"),
                            ({**obs, "state": np.full(14, np.nan)}, "'state': the state contains NaN")]:
        with pytest.raises(ObservationError, match=message):
            aloha.read(broken, spec)
    assert isinstance(aloha.read({k: v for k, v in obs.items() if k != "prompt"}, spec, "fold"), RawObservation)


# ---------------------------------------------------------------------------------------------- concurrency
def test_healthz_and_metadata_answer_during_a_slow_inference(libero) -> None:
    server, port = libero
    pool, started, release = server.pool, threading.Event(), threading.Event()
    infer = pool.infer

    def slow(requests):  # the real inference, held until the test has checked the server is responsive
        started.set()
        release.wait(30)
        return infer(requests)

    pool.infer = slow
    try:
        obs, noise, want = samples("pi05_libero")[0]
        box: dict = {}
        worker = threading.Thread(target=lambda: box.update(client(port).infer({**obs, "noise": noise})))
        worker.start()
        assert started.wait(30)
        t0 = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            assert (r.status, r.read()) == (200, b"OK\n")
        assert client(port).get_server_metadata() == {}
        assert time.monotonic() - t0 < 5 and worker.is_alive()  # answered while the inference still runs
    finally:
        release.set()
        pool.infer = infer
    worker.join(30)
    np.testing.assert_allclose(box["actions"], want, rtol=0, atol=1e-4)


def test_four_clients_are_batched_and_each_gets_its_own_actions(libero) -> None:
    server, port = libero
    policy = server.pool.policy
    observations = [s[0] for s in samples("pi05_libero")] + [samples("pi05_libero")[1][0]]
    clients = [client(port) for _ in range(4)]
    seeds = [11, 12, 13, 14]
    alone = []
    for c, obs, seed in zip(clients, observations, seeds, strict=True):  # one at a time: each alone in its frame
        alone.append(c.infer({**obs, "seed": seed}))
    assert all(a["oxygen"]["batch_size"] == 1 for a in alone)
    barrier, out = threading.Barrier(4), [None] * 4

    def run(i: int) -> None:
        barrier.wait()
        out[i] = clients[i].infer({**observations[i], "seed": seeds[i]})

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [o["oxygen"]["batch_size"] for o in out] == [4, 4, 4, 4]
    for i, (o, obs, seed) in enumerate(zip(out, observations, seeds, strict=True)):
        raw = server.pool.key_map.read(obs, policy.spec)
        noise = seeded_noise(seed)(1, policy.spec.chunk_size, 32)  # the client's 2nd request
        np.testing.assert_allclose(o["actions"], policy.infer(raw, noise), rtol=0, atol=1e-5)
        assert o["oxygen"]["request"] == 1 and not np.allclose(o["actions"], alone[i]["actions"])
    # served alone again with the same seed and request index: the same actions as in the batch
    fresh = client(port)
    fresh.infer({**observations[2], "seed": seeds[2]})
    again = fresh.infer({**observations[2], "seed": seeds[2]})
    np.testing.assert_allclose(again["actions"], out[2]["actions"], rtol=0, atol=1e-5)
    # a client that disconnects mid-request costs the others nothing
    clients[0]._ws.send(pack({**observations[0], "seed": 1}))
    clients[0]._ws.close()
    got = clients[1].infer({**observations[1], "seed": seeds[1]})
    assert got["actions"].shape == (10, 7)


# ---------------------------------------------------------------------------------------------- language
def test_language_outputs_and_a_question_are_answered_in_later_responses() -> None:
    server = server_for("pi05_libero", "--language-streams", "memory", "--stream", "memory.every_n_frames=1",
                        "--stream", "memory.max_new_tokens=4", "--max-new-tokens", "6", "--k", "8",
                        "--ask-max-new-tokens", "5")
    with ServerThread(server) as port:
        policy = client(port)
        obs = samples("pi05_libero")[0][0]
        first = policy.infer({**obs, "ask": "where is the red block?"})
        assert first["ask_id"] == 0 and "answers" not in first
        language, answers = [], []
        for _ in range(4):
            r = policy.infer(obs)
            language += r.get("language", [])
            answers += r.get("answers", [])
    assert answers and answers[0]["id"] == 0 and answers[0]["question"] == "where is the red block?"
    assert answers[0]["request"] == 0 and answers[0]["tokens"] == 5 and isinstance(answers[0]["text"], str)
    assert [e["request"] for e in language][:2] == [0, 1] and all(e["stream"] == "memory" for e in language)
    assert all(e["tokens"] <= 4 and isinstance(e["text"], str) for e in language)


# ---------------------------------------------------------------------------------------------- API key
def test_api_key_is_required_when_set() -> None:
    server = server_for("pi05_libero", "--request-every-n-frames", "0", "--api-key", "s3cret")
    with ServerThread(server) as port:
        assert client(port, api_key="s3cret").get_server_metadata() == {}
        for key in ("wrong", None):
            with pytest.raises(InvalidStatus) as e:
                client(port, api_key=key)
            assert e.value.response.status_code == 401
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            assert r.status == 200
    assert server.refused == 2


# ---------------------------------------------------------------------------------------------- options
def test_the_node_options_and_presets_drive_the_server(tmp_path: Path) -> None:
    preset = tmp_path / "robot.yaml"
    preset.write_text("/**:\n  ros__parameters:\n    k: 3\n    max_new_tokens: 12\n    joint_names: [a]\n"
                      "    language_streams: [notes]\n    notes: {task: narration, every_n_frames: 2}\n"
                      "    ask: {priority: 4}\n")
    args = parse(["--config", str(preset), "--checkpoint", "ckpt", "--k", "7"])
    assert (args.k, args.max_new_tokens, args.ask_priority, args.checkpoint_path) == (7, 12, 4, "ckpt")
    from oxygen_ros.serve.options import runner_params
    _, streams = runner_params(args)
    assert [(s.name, s.task, s.every_n_frames) for s in streams] == [("notes", "narration", 2)]
    with pytest.raises(SystemExit):
        parse(["--checkpoint", "x", "--k", "0"])  # the node's own check: k >= 1
    with pytest.raises(ValueError, match="not one of --language-streams"):
        runner_params(parse(["--language-streams", "a", "--stream", "b.every_n_frames=1"]))
