"""oxygen-export-lerobot: the export of the demo bag equals what LeRobot 0.6.1's own writer made from the same
decoded data (test/fixtures/lerobot_dataset: features, frames, timestamps, stats, tasks, episodes, language rows,
video bytes); bad bags fail alone with their reason and nothing is half-written; the same on local Ray; contracts
and presets."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rosbags", reason="rosbags is not installed")
pytest.importorskip("sensor_msgs.msg", reason="the ROS 2 message wheels are not installed")
pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed")
av = pytest.importorskip("av", reason="PyAV is not installed")
import pyarrow.parquet as pq  # noqa: E402
from rosbags.rosbag2 import Writer  # noqa: E402

from oxygen_ros.evaluation.demo_bag import make_demo_bag  # noqa: E402
from oxygen_ros.export.cli import main as cli_main  # noqa: E402
from oxygen_ros.export.contract import ContractError, contract_from_dict, contract_from_preset, load_contract  # noqa: E402
from oxygen_ros.export.demo import ASK_ANSWER, ASK_QUESTION, INSTRUCTIONS, make_export_demo_bag  # noqa: E402
from oxygen_ros.export.episode import read_episodes  # noqa: E402
from oxygen_ros.export.exporter import export_bags  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "test" / "fixtures" / "lerobot_dataset"
CONTRACT = load_contract(FIXTURE / "contract.yaml")
CAMS = list(CONTRACT.camera_keys)
# libsvtav1 crf 30 on the fixture's 64 px frames: mean |decoded - source| 5.3 and 4.4 of 255 (measured)
CODEC_MEAN_TOL = 8.0


@pytest.fixture(scope="module")
def demo_bag(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_export_demo_bag(tmp_path_factory.mktemp("bags") / "demo")


@pytest.fixture(scope="module")
def exported(demo_bag: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("out") / "dataset"
    report = export_bags([demo_bag], CONTRACT, out, use_ray=False)
    assert report["written"] and report["failed"] == []
    return out


def rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def decode(path: Path) -> np.ndarray:
    with av.open(str(path)) as f:
        return np.stack([fr.to_ndarray(format="rgb24") for fr in f.decode(video=0)])


def test_export_equals_lerobots_own_writer(exported: Path) -> None:
    ours, theirs = exported, FIXTURE / "dataset"
    info, ref = (json.loads((d / "meta" / "info.json").read_text()) for d in (ours, theirs))
    assert info == ref  # features (shapes, dtypes, names, video info), fps, totals, paths, robot_type, splits
    data, ref_data = (rows(d / "data" / "chunk-000" / "file-000.parquet") for d in (ours, theirs))
    assert len(data) == len(ref_data) == 19
    for a, b in zip(data, ref_data, strict=True):
        for key in ("observation.state", "action", "timestamp", "frame_index", "episode_index", "index",
                    "task_index", "language_persistent", "language_events"):
            assert a[key] == b[key], key
    assert [r["timestamp"] for r in data] == [float(np.float32(k / 10)) for k in range(19)]
    assert rows(ours / "meta" / "tasks.parquet") == rows(theirs / "meta" / "tasks.parquet")
    ep, ref_ep = (rows(d / "meta" / "episodes" / "chunk-000" / "file-000.parquet")[0] for d in (ours, theirs))
    assert list(ep) == list(ref_ep)
    for key, value in ref_ep.items():
        if key.startswith("stats/") or key.endswith("timestamp"):
            np.testing.assert_allclose(np.asarray(ep[key], float), np.asarray(value, float), rtol=1e-6, atol=1e-9)
        else:
            assert ep[key] == value, key
    stats, ref_stats = (json.loads((d / "meta" / "stats.json").read_text()) for d in (ours, theirs))
    assert stats.keys() == ref_stats.keys()
    for feat in ref_stats:
        assert stats[feat].keys() == ref_stats[feat].keys()
        for name in ref_stats[feat]:
            np.testing.assert_allclose(stats[feat][name], ref_stats[feat][name], rtol=1e-6, atol=1e-9)
    src = np.load(FIXTURE / "inputs.npz")
    for cam in CAMS:
        video = Path("videos") / cam / "chunk-000" / "file-000.mp4"
        got, want = decode(ours / video), decode(theirs / video)
        assert np.array_equal(got, want)  # the same encoder and settings: the same frames (here the same bytes)
        err = np.abs(got.astype(int) - src[f"image:{cam}"]).mean()
        assert err < CODEC_MEAN_TOL, (cam, err)


def test_language_rows_of_the_demo_bag(exported: Path) -> None:
    data = rows(exported / "data" / "chunk-000" / "file-000.parquet")
    persistent = data[0]["language_persistent"]
    assert all(r["language_persistent"] == persistent for r in data)  # the episode's slice on every frame
    styles = {r["style"] for r in persistent}
    assert styles == {"memory", "subtask", "narration", "task_aug"}
    aug = [r for r in persistent if r["style"] == "task_aug"]
    assert [(r["role"], r["content"]) for r in aug] == [("user", INSTRUCTIONS[1])]
    first_new = next(r["frame_index"] for r in data if r["task_index"] == 1)
    assert aug[0]["timestamp"] == data[first_new]["timestamp"]
    # each output on the frame of its observation: "(k)" is the tick k, frame k - 1 (tick 0 has no action yet)
    for r in persistent:
        if r["style"] in ("memory", "subtask", "narration"):
            tick = int(r["content"].rsplit("(", 1)[1].rstrip(")"))
            assert r["timestamp"] == float(np.float32((tick - 1) / 10)), r
    # the ~/ask call: its question (the goal) and answer (the result) on the frame of the answer's observation; the
    # same answer on ~/language_output (same request id) is not repeated
    events = [(r["frame_index"], e) for r in data for e in r["language_events"]]
    assert [(f, e["role"], e["style"], e["camera"]) for f, e in events] == [
        (5, "assistant", "vqa", CAMS[0]), (5, "user", "vqa", CAMS[0])]  # LeRobot's order: style, role, camera
    assert events[1][1]["content"] == ASK_QUESTION
    assert json.loads(events[0][1]["content"])["value"] == ASK_ANSWER
    report = json.loads((exported / "meta" / "export.json").read_text())
    (ep,) = report["bags"][0]["episodes"]
    assert ep["frames"] == 19 and ep["dropped"] == {"no_action": 1}  # tick 0: its chunk is not out yet
    assert ep["language_unmatched"] == 3  # the outputs of tick 0, whose frame was dropped


def test_frames_are_the_nodes_decoding_and_the_bag_clock(demo_bag: Path) -> None:
    (ep,) = list(read_episodes(demo_bag, CONTRACT))
    src = np.load(FIXTURE / "inputs.npz")
    for cam in CAMS:
        assert np.array_equal(ep.images[cam], src[f"image:{cam}"])
    np.testing.assert_array_equal(np.diff(ep.times_ns), 100_000_000)
    assert ep.tasks[:9] == [INSTRUCTIONS[0]] * 9 and ep.tasks[9:] == [INSTRUCTIONS[1]] * 10
    # the action in force at t: the step the robot is moving to of the newest chunk (chunk of tick k - 1, step 1)
    np.testing.assert_allclose(ep.action, ep.state, atol=1e-6)


def write_bag(path: Path, msgs: list[tuple[str, str, int, object]]) -> Path:
    from oxygen_ros.evaluation.typestore import oxygen_typestore
    from oxygen_ros.export.ask import event_msgdef, register_ask_types

    ts, _ = oxygen_typestore()
    register_ask_types(ts)
    with Writer(path, version=9) as w:
        conns = {}
        for topic, msgtype, stamp, msg in msgs:
            if topic not in conns:
                conns[topic] = (w.add_connection(topic, msgtype, msgdef=event_msgdef(msgtype),
                                                 rihs01=ts.hash_rihs01(msgtype)) if "/action/" in msgtype
                                else w.add_connection(topic, msgtype, typestore=ts))
            w.write(conns[topic], stamp, ts.serialize_cdr(msg, msgtype))
    return path


def size_change_bag(src: Path, dst: Path) -> Path:
    """``src`` with the first camera's images cropped to 48 px from half time on."""
    from rosbags.highlevel import AnyReader

    from oxygen_ros.evaluation.typestore import oxygen_typestore

    ts, _ = oxygen_typestore()
    msgs = []
    with AnyReader([src], default_typestore=ts) as r:
        conns = list(r.connections)
        stamps = sorted({s for _, s, _ in r.messages()})
        half = stamps[len(stamps) // 2]
        for c, stamp, raw in r.messages(connections=conns):
            m = r.deserialize(raw, c.msgtype)
            if c.topic == CONTRACT.cameras["base_0_rgb"] and stamp >= half:
                img = np.asarray(m.data).reshape(m.height, m.width, 3)[:48, :48]
                m.height, m.width, m.step = 48, 48, 48 * 3
                m.data = np.ascontiguousarray(img).reshape(-1)
            msgs.append((c.topic, c.msgtype, stamp, m))
    return write_bag(dst, msgs)


@pytest.fixture(scope="module")
def bad_folder(demo_bag: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import shutil

    folder = tmp_path_factory.mktemp("folder")
    shutil.copytree(demo_bag, folder / "a_good")
    corrupt = shutil.copytree(demo_bag, folder / "b_corrupt")
    db = next(corrupt.glob("*.db3"))
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    make_demo_bag(folder / "c_no_action", duration_s=1.0, size=32)  # cameras, joints, no chunk topic
    size_change_bag(demo_bag, folder / "d_size_change")
    make_export_demo_bag(folder / "e_good", duration_s=1.0, change_instruction=False)
    return folder


def check_bad_folder(report: dict, out: Path) -> None:
    by = {Path(b["bag"]).name: b for b in report["bags"]}
    assert [Path(b).name for b in report["failed"]] == ["b_corrupt", "c_no_action", "d_size_change"]
    assert by["a_good"]["status"] == by["e_good"]["status"] == "ok"
    assert "corrupt or truncated" in by["b_corrupt"]["reason"] or "cannot open" in by["b_corrupt"]["reason"]
    assert "/oxygen/action_chunk" in by["c_no_action"]["reason"] and "missing" in by["c_no_action"]["reason"]
    assert "image size change" in by["d_size_change"]["reason"]
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 2 and info["total_frames"] == 19 + 9
    data = rows(out / "data" / "chunk-000" / "file-000.parquet")
    assert [r["index"] for r in data] == list(range(28))
    assert {r["episode_index"] for r in data} == {0, 1}
    eps = rows(out / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    assert [(e["dataset_from_index"], e["dataset_to_index"]) for e in eps] == [(0, 19), (19, 28)]
    assert (out / "videos" / CAMS[1] / "chunk-000" / "file-001.mp4").is_file()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_a_folder_with_bad_bags_exports_the_rest(bad_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    code = cli_main([str(bad_folder), "--contract", str(FIXTURE / "contract.yaml"), "--out", str(out), "--no-ray"])
    assert code == 1
    check_bad_folder(json.loads((out / "meta" / "export.json").read_text()), out)


def test_nothing_is_written_when_no_bag_exports(bad_folder: Path, tmp_path: Path) -> None:
    report = export_bags([bad_folder / "b_corrupt", bad_folder / "c_no_action"], CONTRACT, tmp_path / "ds",
                         use_ray=False)
    assert not report["written"] and len(report["failed"]) == 2
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def ray_local() -> Iterator[object]:
    ray = pytest.importorskip("ray", reason="ray is not installed (the `ray` extra)")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 2**20, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def test_the_folder_on_local_ray(bad_folder: Path, tmp_path: Path, ray_local: object) -> None:
    out = tmp_path / "ds"
    report = export_bags([bad_folder], CONTRACT, out, use_ray=True, workers=2)
    assert report["engine"] == "ray"
    check_bad_folder(report, out)
    export_bags([bad_folder], CONTRACT, tmp_path / "seq", use_ray=False)
    for name in ("data/chunk-000/file-000.parquet", "meta/episodes/chunk-000/file-000.parquet"):
        assert rows(out / name) == rows(tmp_path / "seq" / name)
    assert (out / "meta" / "stats.json").read_text() == (tmp_path / "seq" / "meta" / "stats.json").read_text()


def test_the_worker_loads_neither_torch_nor_rclpy() -> None:
    code = ("import sys; import oxygen_ros.export.worker, oxygen_ros.export.contract, oxygen_ros.export.cli; "
            "print('rclpy' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "False"]


def test_answers_without_the_actions_records(tmp_path: Path, demo_bag: Path) -> None:
    """Without ``ask_action`` (a bag recorded without the action): the answer alone, from ~/language_output."""
    c = contract_from_dict({**CONTRACT.to_dict(), "ask_action": ""})
    (ep,) = list(read_episodes(demo_bag, c))
    assert [(k, [(r["role"], r["style"]) for r in v]) for k, v in ep.events.items()] == [(5, [("assistant", "vqa")])]
    assert json.loads(ep.events[5][0]["content"])["value"] == ASK_ANSWER


def test_the_embedded_ask_action_is_the_file() -> None:
    from oxygen_ros.export.ask import ASK_ACTION, ask_action_text

    assert ask_action_text() == ASK_ACTION


def test_contract_from_a_preset_and_bad_contracts(tmp_path: Path) -> None:
    c = contract_from_preset(ROOT / "config" / "libero.yaml")
    assert c.cameras == {"agentview": "/agentview/image_raw", "wrist": "/wrist/image_raw"}
    assert c.fps == 4 and c.action_topic == "/oxygen/action_chunk" and c.language_topic == "/oxygen/language_output"
    assert c.ask_action == "/oxygen/ask"
    assert c.state_names[0] == "eef_pos_x" and c.action_names[-1] == "gripper"
    assert load_contract_text(tmp_path, c.to_yaml()) == c  # the YAML form reads back
    good = CONTRACT.to_dict()
    for bad, words in (({"fps": 0}, "fps"), ({"fps": 7.5}, "fps"), ({"cameras": {}}, "camera"),
                       ({"action": {"source": "guess", "topic": "/a"}}, "action.source"),
                       ({"colour": 1}, "unknown keys"), ({"ask_camera": "nope"}, "ask_camera"),
                       ({"tolerance": {"image_s": -1}}, "tolerances")):
        with pytest.raises(ContractError, match=words):
            contract_from_dict({**good, **bad})


def load_contract_text(tmp_path: Path, text: str):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return load_contract(p)


def test_a_missing_state_topic_names_the_topic(tmp_path: Path, demo_bag: Path) -> None:
    c = contract_from_dict({**CONTRACT.to_dict(), "state": {"topic": "/robot/joint_states", "names": []}})
    report = export_bags([demo_bag], c, tmp_path / "ds", use_ray=False)
    assert report["failed"] and "/robot/joint_states" in report["bags"][0]["reason"]


def test_episodes_from_a_topic(tmp_path: Path, demo_bag: Path) -> None:
    c = contract_from_dict({**CONTRACT.to_dict(), "episode_topic": "/instruction"})
    eps = list(read_episodes(demo_bag, c))
    assert [e.length for e in eps] == [9, 10]  # the instruction's second message starts episode 2
    assert [set(e.tasks) for e in eps] == [{INSTRUCTIONS[0]}, {INSTRUCTIONS[1]}]


def test_the_policy_acts_on_an_exported_frame_as_on_the_bag(exported: Path, demo_bag: Path) -> None:
    """The way back: a frame read from the dataset (parquet + decoded video) goes through the node's own input
    store, observation builder and frame runner and gives the chunk the bag's frame gives, within the codec's
    error (far closer than another frame's chunk)."""
    import yaml
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String

    from oxygen_ros.ros.diagnostics import ReasonCounter
    from oxygen_ros.ros.image_conversion import array_to_image_msg
    from oxygen_ros.ros.input_store import InputStore
    from oxygen_ros.ros.observation_builder import ObservationBuilder
    from oxygen_ros.runtime.model_loader import build_runner, load_node_policy
    from oxygen_ros.runtime.params import validate

    values = yaml.safe_load((ROOT / "config" / "synthetic.yaml").read_text())["/**"]["ros__parameters"]
    loaded = load_node_policy(validate({**values, "torch_threads": 1}))
    p = loaded.params
    try:
        def act(images: list[np.ndarray], state: np.ndarray, task: str, stamp_ns: int) -> np.ndarray:
            store = InputStore(p.camera_names, p.joint_names, ReasonCounter(lambda *_: None, "rejected"),
                               p.max_image_pixels, 1000, "", clock=lambda: stamp_ns / 1e9)
            for i, img in enumerate(images):
                assert store.on_image(i, array_to_image_msg(img, stamp_ns))
            js = JointState(name=list(p.joint_names), position=[float(v) for v in state])
            js.header.stamp = array_to_image_msg(images[0], stamp_ns).header.stamp
            store.on_joint_state(js)
            store.on_instruction(String(data=task))
            built = ObservationBuilder(store, loaded.policy, p.max_image_age_s, p.max_joint_age_s).build(stamp_ns)
            runner = build_runner(loaded)
            return runner.step(built.prepared, stamp_ns=stamp_ns, instruction=built.instruction).chunk.chunk

        (ep,) = list(read_episodes(demo_bag, CONTRACT))
        data = rows(exported / "data" / "chunk-000" / "file-000.parquet")
        tasks = {r["task_index"]: r["task"] for r in rows(exported / "meta" / "tasks.parquet")}
        videos = {cam: decode(exported / "videos" / cam / "chunk-000" / "file-000.mp4") for cam in CAMS}
        k, other = 4, 14
        stamp = int(ep.times_ns[k])
        from_dataset = act([videos[c][k] for c in CAMS], np.asarray(data[k]["observation.state"]),
                           tasks[data[k]["task_index"]], stamp)
        from_bag = act([ep.images[c][k] for c in CAMS], ep.state[k], ep.tasks[k], stamp)
        again = act([ep.images[c][k] for c in CAMS], ep.state[k], ep.tasks[k], stamp)
        from_other = act([ep.images[c][other] for c in CAMS], ep.state[other], ep.tasks[other], stamp)
    finally:
        loaded.release()
    assert np.isfinite(from_dataset).all() and from_dataset.shape == from_bag.shape
    np.testing.assert_array_equal(again, from_bag)  # deterministic: any gap below is the data's
    codec_gap = np.abs(from_dataset - from_bag).max()
    frame_gap = np.abs(from_other - from_bag).max()
    # random_tiny weights amplify the video's pixel error (mean 5 of 255 here): measured 0.50 against 1.86
    assert 0 < codec_gap < 0.4 * frame_gap, (codec_gap, frame_gap)


def test_a_recording_and_its_outputs_bag_as_one(tmp_path: Path) -> None:
    """``A+B``: a recording without the node's outputs plus a bag of them (as oxygen-evaluate-bag writes its
    out_bag) export as one episode."""
    from oxygen_ros.evaluation.demo_bag import START_TIME_NS
    from oxygen_ros.evaluation.typestore import ACTION_TYPE, oxygen_typestore

    rec = make_demo_bag(tmp_path / "rec", duration_s=1.0, size=32)
    T = oxygen_typestore()[0].types
    names = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
    msgs = []
    for k in range(10):
        stamp = START_TIME_NS + k * 100_000_000
        header = T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=stamp // 10**9,
                                                                                 nanosec=stamp % 10**9), frame_id="")
        acts = np.full((4, 8), k, np.float32)
        msgs.append(("/oxygen/action_chunk", ACTION_TYPE, stamp, T[ACTION_TYPE](
            header=header, frame_index=k, joint_names=names, horizon=4, action_dim=8, actions=acts.reshape(-1),
            dt=T["builtin_interfaces/msg/Duration"](sec=0, nanosec=50_000_000),
            inference_latency=T["builtin_interfaces/msg/Duration"](sec=0, nanosec=0), first_step=0, subtask="")))
    outs = write_bag(tmp_path / "outs", msgs)
    c = contract_from_dict({**CONTRACT.to_dict(), "language_topic": ""})
    report = export_bags([f"{rec}+{outs}"], c, tmp_path / "ds", use_ray=False)
    assert report["failed"] == [] and report["frames"] == 10
    data = rows(tmp_path / "ds" / "data" / "chunk-000" / "file-000.parquet")
    assert [r["action"][0] for r in data] == [float(k) for k in range(10)]  # each tick's own chunk, step 0
    with pytest.raises(FileNotFoundError, match="A\\+B"):
        export_bags([f"{rec}+{tmp_path}"], c, tmp_path / "ds2", use_ray=False)


@pytest.mark.parametrize("kind", ["joint_state", "float64_array", "trajectory"])
def test_setpoint_and_command_sources(tmp_path: Path, kind: str) -> None:
    """``setpoints`` / ``command``: the newest command at most ``action_s`` old, by name where it has names."""
    from oxygen_ros.evaluation.demo_bag import START_TIME_NS
    from oxygen_ros.evaluation.typestore import oxygen_typestore

    rec = make_demo_bag(tmp_path / "rec", duration_s=1.0, size=32)
    T = oxygen_typestore()[0].types
    names = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
    msgs = []
    for k in range(0, 10, 2):  # 5 Hz commands: a frame's command is at most 0.1 s old; the last frames' older
        stamp = START_TIME_NS + k * 100_000_000 + 10_000_000
        values = np.arange(8, dtype=np.float64) + k
        if kind == "joint_state":
            msg = T["sensor_msgs/msg/JointState"](header=T["std_msgs/msg/Header"](
                stamp=T["builtin_interfaces/msg/Time"](sec=0, nanosec=0), frame_id=""),
                name=names[::-1], position=values[::-1].copy(), velocity=np.zeros(0), effort=np.zeros(0))
            msgtype = "sensor_msgs/msg/JointState"
        elif kind == "float64_array":
            msg = T["std_msgs/msg/Float64MultiArray"](layout=T["std_msgs/msg/MultiArrayLayout"](
                dim=[], data_offset=0), data=values)
            msgtype = "std_msgs/msg/Float64MultiArray"
        else:
            point = T["trajectory_msgs/msg/JointTrajectoryPoint"](
                positions=values, velocities=np.zeros(0), accelerations=np.zeros(0), effort=np.zeros(0),
                time_from_start=T["builtin_interfaces/msg/Duration"](sec=0, nanosec=0))
            msg = T["trajectory_msgs/msg/JointTrajectory"](header=T["std_msgs/msg/Header"](
                stamp=T["builtin_interfaces/msg/Time"](sec=0, nanosec=0), frame_id=""), joint_names=names,
                points=[point])
            msgtype = "trajectory_msgs/msg/JointTrajectory"
        msgs.append(("/command", msgtype, stamp, msg))
    cmd = write_bag(tmp_path / "cmd", msgs)
    c = contract_from_dict({**CONTRACT.to_dict(), "language_topic": "",
                            "action": {"source": "command", "topic": "/command",
                                       "names": [] if kind == "float64_array" else names},
                            "tolerance": {**CONTRACT.to_dict()["tolerance"], "action_s": 0.15}})
    (ep,) = list(read_episodes(f"{rec}+{cmd}", c))
    # commands 10 ms after the even ticks: an odd tick's is 90 ms old (kept), an even tick's newest 190 ms (> 150 ms:
    # dropped and counted, as is tick 0 before the first command)
    ticks = [(int(t) - START_TIME_NS) // 100_000_000 for t in ep.times_ns]
    assert ticks == [1, 3, 5, 7, 9] and ep.dropped == {"no_action": 5}
    np.testing.assert_array_equal(ep.action[:, 0], [t - 1 for t in ticks])
    assert ep.action_names == (names if kind != "float64_array" else [f"action_{i}" for i in range(8)])


def test_a_type_mismatch_names_the_topic(tmp_path: Path, demo_bag: Path) -> None:
    c = contract_from_dict({**CONTRACT.to_dict(), "cameras": {"base_0_rgb": "/joint_states"}})
    report = export_bags([demo_bag], c, tmp_path / "ds", use_ray=False)
    assert "type mismatch on /joint_states" in report["bags"][0]["reason"]
