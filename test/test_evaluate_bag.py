"""Offline bag evaluation: deterministic outputs, report contents, plots, output bag, skipped frames, and the
node parameters it takes (params files, ``-p`` overrides, validation)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rosbags", reason="rosbags is not installed")
pytest.importorskip("sensor_msgs.msg", reason="the ROS 2 message wheels are not installed")

from rosbags.highlevel import AnyReader  # noqa: E402

from oxygen_ros.evaluation import cli, typestore  # noqa: E402
from oxygen_ros.evaluation.demo_bag import make_demo_bag  # noqa: E402
from oxygen_ros.evaluation.outputs import ACTION_TOPIC, LANGUAGE_TOPIC  # noqa: E402
from oxygen_ros.evaluation.plots import PLOT_FILES  # noqa: E402
from oxygen_ros.evaluation.report import REPORT_KEYS, exact_match  # noqa: E402
from oxygen_ros.evaluation.run import evaluate_bag  # noqa: E402
from oxygen_ros.evaluation.typestore import ACTION_TYPE, LANGUAGE_TYPE  # noqa: E402
from oxygen_ros.policy.synthetic import make_random_checkpoint  # noqa: E402
from oxygen_ros.runtime.params import NodeParams, ParamError  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# node parameters: a few ms per frame on the tiny model; its generated checkpoint has no statistics, so
# unnormalised on purpose
FAST = {"num_steps": 2, "max_new_tokens": 5, "k": 2, "normalization": "none"}


def params(data: dict[str, Path], **overrides: object) -> dict[str, object]:
    """The node parameters of the fast runs on the test checkpoint, with ``overrides``."""
    return {"checkpoint_path": str(data["ckpt"]), **FAST, **overrides}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random checkpoint + tokenizer and a 2 s, 10 Hz demo bag with both of the model's cameras."""
    root = tmp_path_factory.mktemp("evaluate_bag")
    ckpt = make_random_checkpoint(root / "ckpt", "tiny", "libero", tokenizer=True)
    bag = make_demo_bag(root / "bag", duration_s=2.0, rate_hz=10.0, cameras=("base_0_rgb", "left_wrist_0_rgb"),
                        size=40, progress=False)
    return {"root": root, "ckpt": ckpt, "bag": bag}


def read_outputs(out_bag: Path) -> tuple[list[tuple], list[tuple]]:
    """(stamp_ns, frame_index, actions) per chunk and (stamp_ns, request_id, frame_index, text) per language
    output, read back from an output bag."""
    ts, _ = typestore.oxygen_typestore()
    chunks, texts = [], []
    with AnyReader([out_bag], default_typestore=ts) as reader:
        assert {c.topic: c.msgtype for c in reader.connections} == {ACTION_TOPIC: ACTION_TYPE,
                                                                    LANGUAGE_TOPIC: LANGUAGE_TYPE}
        for conn, timestamp, raw in reader.messages():
            msg = reader.deserialize(raw, conn.msgtype)
            stamp = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
            if conn.topic == ACTION_TOPIC:
                assert timestamp == stamp  # logged at the tick; demo bags stamp cameras at the tick times
                actions = np.asarray(msg.actions, dtype=np.float32).reshape(msg.horizon, msg.action_dim)
                chunks.append((stamp, msg.frame_index, actions))
            else:
                assert timestamp >= stamp  # logged when finished, stamped with the originating frame
                texts.append((stamp, msg.request_id, msg.frame_index, msg.text))
    return chunks, texts


def test_deterministic_report_plots_and_bag(data: dict[str, Path]) -> None:
    out1, out2 = data["root"] / "run1", data["root"] / "run2"
    t0 = time.perf_counter()
    r1 = evaluate_bag(data["bag"], out1, params(data), progress=False)
    run_s = time.perf_counter() - t0
    # the second run goes through the CLI: a ROS 2 params file (the node's section overrides /**) and -p
    params_file = data["root"] / "eval_params.yaml"
    params_file.write_text(f"/**:\n  ros__parameters:\n    checkpoint_path: {data['ckpt']}\n    num_steps: 9\n"
                           "    normalization: none\noxygen:\n  ros__parameters:\n    num_steps: 2\n"
                           "other_node:\n  ros__parameters:\n    k: 7\n")
    assert cli.main([str(data["bag"]), "--params-file", str(params_file), "-p", "max_new_tokens:=5", "-p", "k:=2",
                     "--out", str(out2), "--no-progress", "--no-plots"]) == 0
    r2 = json.loads((out2 / "report.json").read_text())

    assert json.loads((out1 / "report.json").read_text())["digest"] == r1["digest"]
    assert tuple(r1) == REPORT_KEYS
    assert r1["ticks"] == r1["frames"] == len(r1["per_frame"]) == 20 and r1["skipped"] == 0
    assert r1["digest"]["num_chunks"] == 20 and r1["digest"]["num_texts"] > 0
    assert r1["digest"] == r2["digest"]
    s = r1["summary"]
    frame_s = sum(f["timings_ms"]["frame"] for f in r1["per_frame"]) / 1e3
    assert s["action_hz"] == pytest.approx(r1["model"]["action_horizon"] * 20 / frame_s)
    assert s["tokens_per_s"] > 0 and s["tokens_total"] == sum(f["tokens"] for f in r1["per_frame"])
    req = r1["requests"]
    assert req["issued"] == 20 and req["finished"] == r1["digest"]["num_texts"]
    assert req["finished"] + req["unfinished"] + req["rejected"] == req["issued"]
    assert req["latency_frames"]["count"] == req["finished"]
    # seconds from the originating frame's start: the longest request outlives a frame and ends within the run
    shortest_frame_s = min(f["timings_ms"]["frame"] for f in r1["per_frame"]) / 1e3
    assert shortest_frame_s <= req["latency_s"]["max"] <= run_s, (req["latency_s"], shortest_frame_s, run_s)
    (stream, per), = req["per_stream"].items()  # the one-stream shorthand: the task's stream
    assert stream == r1["config"]["params"]["request_task"] and per["finished"] == req["finished"]
    assert per["latency_frames"] == req["latency_frames"]
    assert set(r1["per_frame"][0]["timings_ms"]) >= {"prefill", "denoise", "decode", "manager", "frame"}

    assert r2["config"]["params"] == r1["config"]["params"]
    assert (r1["config"]["rate_hz"], r1["config"]["num_steps"], r1["config"]["k"]) == (10.0, 2, 2)
    # dtype auto, our own (generated) model on the CPU: float32, and the report says why
    assert (r1["config"]["precision"], r1["config"]["precision_reason"]) == ("float32", "own checkpoint on cpu")
    for name in PLOT_FILES:
        assert (out1 / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert r1["outputs"]["plots"] == list(PLOT_FILES) and not r2["outputs"]["plots"]

    chunks1, texts1 = read_outputs(out1 / "out_bag")
    chunks2, texts2 = read_outputs(out2 / "out_bag")
    assert [c[:2] for c in chunks1] == [(f["stamp_ns"], f["frame"]) for f in r1["per_frame"]]
    assert chunks1[0][2].shape == (r1["model"]["action_horizon"], 8) and np.isfinite(chunks1[0][2]).all()
    assert [c[:2] for c in chunks1] == [c[:2] for c in chunks2]
    for a, b in zip(chunks1, chunks2, strict=True):
        np.testing.assert_array_equal(a[2], b[2])
    assert texts1 == texts2 and len(texts1) == r1["digest"]["num_texts"]
    frame_stamps = {c[1]: c[0] for c in chunks1}
    assert all(frame_stamps[frame] == stamp for stamp, _, frame, _ in texts1)

    with pytest.raises(FileExistsError):
        evaluate_bag(data["bag"], out1, params(data), progress=False)


def test_missing_camera_topic_skips_every_frame(data: dict[str, Path]) -> None:
    bag = make_demo_bag(data["root"] / "one_cam", duration_s=1.0, rate_hz=10.0, cameras=("base_0_rgb",), size=40,
                        progress=False)
    out = data["root"] / "one_cam_eval"
    r = evaluate_bag(bag, out, params(data), progress=False)
    assert r["ticks"] == r["skipped"] == 10 and r["frames"] == 0
    assert r["skip_reasons"] == {"missing_camera": 10}
    assert all("left_wrist_0_rgb" in s["detail"] and s["tick_ns"] for s in r["skipped_frames"])
    assert r["summary"]["action_hz"] is None and r["digest"]["num_chunks"] == 0
    assert all((out / name).is_file() for name in PLOT_FILES)  # placeholders, no crash
    assert read_outputs(out / "out_bag") == ([], [])

    # feeding only the camera that exists masks the other slot and runs every frame (validated NodeParams work too)
    p = NodeParams(checkpoint_path=str(data["ckpt"]), camera_names=("base_0_rgb",), **FAST)
    r = evaluate_bag(bag, data["root"] / "one_cam_masked", p, plots=False, progress=False)
    assert r["frames"] == 10 and r["skipped"] == 0


def test_language_streams_are_reported_per_stream(data: dict[str, Path]) -> None:
    r = evaluate_bag(data["bag"], data["root"] / "streams_eval", params(
        data, language_streams=["memory", "narration"], **{"memory.every_n_frames": 2, "narration.period_s": 0.45}),
        plots=False, progress=False)
    per = r["requests"]["per_stream"]
    assert set(per) == {"memory", "narration"}
    starts = {s: sorted(x["frame_index"] for x in r["requests"]["items"] if x["stream"] == s) for s in per}
    assert starts["memory"][:5] == [0, 2, 4, 6, 8], "every 2nd frame"
    assert starts["narration"][:4] == [0, 5, 10, 15], "every 0.45 s of bag time (frames 0.1 s apart)"
    assert r["config"]["language_streams"][1]["period_s"] == 0.45
    assert sum(v["finished"] for v in per.values()) == r["requests"]["finished"]

    # the same streams through the isolated engine, compared per stream with the oxygen run: identical texts
    iso = evaluate_bag(data["bag"], data["root"] / "streams_eval_isolated", params(
        data, mode="isolated", language_streams=["memory", "narration"],
        **{"memory.every_n_frames": 2, "narration.period_s": 0.45}), plots=False, progress=False, reference=r)
    match = iso["requests"]["exact_match"]
    assert set(match) == {"memory", "narration"}
    for stream, m in match.items():
        assert m["matched"] == per[stream]["finished"] > 0 and m["exact_match"] == 1.0, (stream, m)
    tampered = {"requests": {"items": [{**x, "text": x["text"] + " x"} if x["stream"] == "memory" else x
                                       for x in r["requests"]["items"]]}}
    assert exact_match(iso["requests"]["items"], tampered["requests"]["items"])["memory"]["exact_match"] == 0.0


def test_subtask_conditioned_chunks_name_their_subtask_in_the_out_bag(data: dict[str, Path]) -> None:
    out = data["root"] / "subtask_eval"
    # a wider init than the fixture's checkpoint: its texts are not blank (a blank subtask conditions nothing)
    ckpt = make_random_checkpoint(data["root"] / "ckpt_wide", "tiny", "libero", tokenizer=True, std=0.3)
    evaluate_bag(data["bag"], out, {**params(data, language_streams=["subtask"], subtask_conditioning="subtask",
                                             **{"subtask.every_n_frames": 3}), "checkpoint_path": str(ckpt)},
                 max_frames=12, plots=False, progress=False)
    ts, _ = typestore.oxygen_typestore()
    with AnyReader([out / "out_bag"], default_typestore=ts) as reader:
        subtasks = [reader.deserialize(raw, c.msgtype).subtask for c, _, raw in reader.messages()
                    if c.topic == ACTION_TOPIC]
    texts = {t[3].strip() for t in read_outputs(out / "out_bag")[1]}
    assert subtasks[0] == "" and any(subtasks) and {s for s in subtasks if s} <= texts


def test_stale_camera_and_compressed_mcap(data: dict[str, Path]) -> None:
    # 20 Hz ticks over 10 Hz images: every other tick sees a 50 ms old image
    r = evaluate_bag(data["bag"], data["root"] / "stale", params(data, control_rate_hz=20.0, max_image_age_s=0.04),
                     max_frames=8, plots=False, progress=False)
    assert r["ticks"] == 8 and r["frames"] == 4
    assert r["skip_reasons"] == {"stale_camera": 4}
    assert [s["tick"] for s in r["skipped_frames"]] == [1, 3, 5, 7]

    bag = make_demo_bag(data["root"] / "jpeg_mcap", duration_s=0.5, rate_hz=10.0, size=40, storage="mcap",
                        compressed=True, progress=False)
    r = evaluate_bag(bag, data["root"] / "jpeg_eval", params(data, request_every_n_frames=2), plots=False,
                     progress=False)
    assert r["frames"] == 5 and r["inputs"]["storage"] == "mcap" and r["requests"]["issued"] == 3
    assert all(t.endswith("/compressed") for t in r["config"]["camera_topics"].values())
    assert any((data["root"] / "jpeg_eval" / "out_bag").glob("*.mcap"))
    assert len(read_outputs(data["root"] / "jpeg_eval" / "out_bag")[0]) == 5


def test_norm_stats_unnormalise_actions(data: dict[str, Path]) -> None:
    """Action-only stats leave the prompt unchanged, so the chunks are the raw ones mapped from [-1, 1]."""
    lo, hi = np.arange(8.0), np.arange(8.0) * 2 + 1
    stats = data["root"] / "norm_stats.json"
    stats.write_text(json.dumps({"norm_stats": {"actions": {"mean": [0] * 8, "std": [1] * 8, "q01": lo.tolist(),
                                                             "q99": hi.tolist()}}}))
    raw = evaluate_bag(data["bag"], data["root"] / "raw", params(data, action_names=[f"a{i}" for i in range(6)]),
                       max_frames=3, plots=False, progress=False)
    unnorm = evaluate_bag(data["bag"], data["root"] / "unnorm",
                          params(data, norm_stats_path=str(stats), normalization="auto"), max_frames=3, plots=False,
                          progress=False)
    assert unnorm["config"]["norm_stats"] == str(stats) and unnorm["config"]["normalization"] == "quantiles"
    assert raw["config"]["action_names"] == [f"a{i}" for i in range(6)]
    chunks_raw, _ = read_outputs(data["root"] / "raw" / "out_bag")
    chunks_unnorm, _ = read_outputs(data["root"] / "unnorm" / "out_bag")
    for (_, _, a), (_, _, b) in zip(chunks_raw, chunks_unnorm, strict=True):
        assert a.shape == (b.shape[0], 6) and b.shape[1] == 8
        np.testing.assert_allclose(b[:, :6], (a + 1) / 2 * (hi - lo + 1e-6)[:6] + lo[:6], rtol=1e-5, atol=1e-5)


def test_bad_messages_are_counted_and_ignored(data: dict[str, Path]) -> None:
    """A corrupt image keeps the previous one (not stale yet); a NaN state skips the frame; nothing crashes."""
    from rosbags.rosbag2 import Writer

    ts = typestore.get_ros2_typestore()
    T = ts.types
    Header, Time = T["std_msgs/msg/Header"], T["builtin_interfaces/msg/Time"]
    Image, JointState, String = T["sensor_msgs/msg/Image"], T["sensor_msgs/msg/JointState"], T["std_msgs/msg/String"]
    t0 = 1_700_000_000 * 1_000_000_000
    bag = data["root"] / "bad_inputs"
    with Writer(bag, version=9) as w:
        conns = {"/instruction": w.add_connection("/instruction", String.__msgtype__, typestore=ts),
                 "/joint_states": w.add_connection("/joint_states", JointState.__msgtype__, typestore=ts)}
        for cam in ("base_0_rgb", "left_wrist_0_rgb"):
            conns[cam] = w.add_connection(f"/cameras/{cam}/image_raw", Image.__msgtype__, typestore=ts)
        w.write(conns["/instruction"], t0, ts.serialize_cdr(String(data="pick it up"), String.__msgtype__))
        for i in range(4):
            stamp_ns = t0 + i * 100_000_000
            header = Header(stamp=Time(sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9), frame_id="")
            q = np.full(8, np.nan if i == 3 else 0.1 * i)
            w.write(conns["/joint_states"], stamp_ns, ts.serialize_cdr(JointState(
                header=header, name=[f"j{k}" for k in range(8)], position=q, velocity=np.zeros(0),
                effort=np.zeros(0)), JointState.__msgtype__))
            for cam in ("base_0_rgb", "left_wrist_0_rgb"):
                bad = cam == "left_wrist_0_rgb" and i in (1, 2)
                img = Image(header=header, height=30, width=30, encoding="rgb8", is_bigendian=0, step=90,
                            data=np.full(30 * 30 * 3 - (5 if bad else 0), 7 * i, dtype=np.uint8))
                w.write(conns[cam], stamp_ns, ts.serialize_cdr(img, Image.__msgtype__))
    r = evaluate_bag(bag, data["root"] / "bad_inputs_eval", params(data), plots=False, progress=False)
    assert r["rejected_inputs"] == {"image_bad_data": 2, "state_not_finite": 1}
    assert r["frames"] == 2 and r["skip_reasons"] == {"invalid_state": 1, "camera_skew": 1}
    assert r["config"]["joint_names"] == [f"j{k}" for k in range(8)]  # not given: the bag's first JointState
    # ticks 1 and 2 have only the wrist image of t0: the observation must be newer than the last one (t0), so tick 1
    # pairs it with the base image of t0 + 0.1 s (within max_camera_skew_s; stamp = the set's newest) and tick 2
    # finds no new set within the skew (t0 + 0.2 s with t0): never a second chunk from one observation
    assert [f["stamp_ns"] for f in r["per_frame"]] == [t0, t0 + 100_000_000]
    r = evaluate_bag(bag, data["root"] / "bad_inputs_eval_unsynced", params(data, max_camera_skew_s=-1.0),
                     plots=False, progress=False)
    # without synchronisation each camera's newest image: stamp = the newer base image's
    assert [f["stamp_ns"] for f in r["per_frame"]] == [t0, t0 + 100_000_000, t0 + 200_000_000]


def _fields(text: str) -> list[str]:
    return [" ".join(line.split("#")[0].split()) for line in text.splitlines() if line.split("#")[0].strip()]


def test_message_definitions(monkeypatch: pytest.MonkeyPatch) -> None:
    msg_dir = typestore.find_msg_dir()
    assert msg_dir is not None
    for name, embedded in typestore.EMBEDDED_MSGS.items():
        assert _fields((msg_dir / f"{name.rsplit('/', 1)[1]}.msg").read_text()) == _fields(embedded), name
    monkeypatch.setattr(typestore, "find_msg_dir", lambda: None)
    ts, source = typestore.oxygen_typestore()
    assert source == "embedded" and {ACTION_TYPE, LANGUAGE_TYPE} <= set(ts.types)


def test_output_topics_are_the_nodes() -> None:
    """The output bag uses the topics the node publishes on (``~/...`` under the node name)."""
    node = pytest.importorskip("oxygen_ros.ros.node", reason="rclpy is not installed")

    def resolved(private_topic: str) -> str:
        return f"/{node.NODE_NAME}/{private_topic.removeprefix('~/')}"

    assert resolved(node.ACTION_TOPIC) == ACTION_TOPIC
    assert resolved(node.LANGUAGE_TOPIC) == LANGUAGE_TOPIC
    assert node.NODE_NAME == cli.NODE_NAME  # whose sections of a params file the evaluation reads


def test_invalid_parameters_fail_before_anything_is_written(data: dict[str, Path]) -> None:
    out = data["root"] / "invalid"
    with pytest.raises(ParamError) as info:
        evaluate_bag(data["bag"], out, params(data, k=0, mode="fast", control_rate_hz=-1.0), progress=False)
    assert {p.split(":")[0] for p in info.value.problems} == {"mode", "k", "control_rate_hz"}
    assert not out.exists()
    # the CLI reports them (exit code 2, no traceback)
    assert cli.main([str(data["bag"]), "-p", f"checkpoint_path:={data['ckpt']}", "-p", "k:=0", "--out", str(out),
                     "--no-progress"]) == 2
    assert not out.exists()
    with pytest.raises(ValueError, match="storage"):
        evaluate_bag(data["bag"], out, params(data), storage="bag")


def test_params_files_and_overrides(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("/**:\n  ros__parameters:\n    k: 3\n    camera_names: [a, b]\n"
                 "/oxygen:\n  ros__parameters:\n    k: 4\n    engine: {threads: 2}\n"
                 "other:\n  ros__parameters:\n    k: 5\n")
    assert cli.read_params_file(f) == {"k": 4, "camera_names": ["a", "b"], "engine.threads": 2}
    assert cli.read_params_file(f, "other") == {"k": 5, "camera_names": ["a", "b"]}
    f.write_text("sim:\n  ros__parameters:\n    k: 3\n")
    with pytest.raises(ValueError, match="no `/\\*\\*:` or `oxygen:` section"):
        cli.read_params_file(f)
    assert cli.parse_overrides(["k:=3", "control_rate_hz:=2.5", "publish_trajectory:=true", "instruction:=",
                                "camera_names:=[a, b]", "request_prompt:=say {instruction}"]) == {
        "k": 3, "control_rate_hz": 2.5, "publish_trajectory": True, "instruction": "", "camera_names": ["a", "b"],
        "request_prompt": "say {instruction}"}
    with pytest.raises(ValueError, match="name:=value"):
        cli.parse_overrides(["k=3"])
