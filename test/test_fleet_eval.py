"""Scoring the embedded model against recorded bags of the tabletop world, and fleet evaluation: a policy scored
against its own output scores 0; the trained model beats random weights; a fleet on a local Ray cluster equals the
sequential run bag for bag; a corrupt bag gives a failed row; a rerun skips finished bags."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rosbags", reason="rosbags is not installed")
pytest.importorskip("sensor_msgs.msg", reason="the ROS 2 message wheels are not installed")

from rosbags.highlevel import AnyReader  # noqa: E402
from rosbags.rosbag2 import Writer  # noqa: E402

from oxygen_ros.engine.checkpoint import init_random_weights, read_config, save_checkpoint  # noqa: E402
from oxygen_ros.engine.model import Pi05Model  # noqa: E402
from oxygen_ros.evaluation import cli  # noqa: E402
from oxygen_ros.evaluation.fleet import evaluate_fleet, find_bags  # noqa: E402
from oxygen_ros.evaluation.fleet_report import FLEET_PLOTS  # noqa: E402
from oxygen_ros.evaluation.outputs import ACTION_TOPIC  # noqa: E402
from oxygen_ros.evaluation.reference import ScoringOptions  # noqa: E402
from oxygen_ros.evaluation.run import evaluate_bag  # noqa: E402
from oxygen_ros.evaluation.timing import ReplayTiming  # noqa: E402
from oxygen_ros.evaluation.typestore import ACTION_TYPE, LANGUAGE_TYPE, oxygen_typestore  # noqa: E402
from oxygen_ros.policy.shipped_model import TOY_MODEL_DIR, toy_model_available  # noqa: E402
from oxygen_ros.tools import make_demo_bag  # noqa: E402
from oxygen_ros.toy.demo_fleet import COMMAND_TOPIC, NARRATION_TOPIC, SUBTASK_TOPIC  # noqa: E402

HORIZON = read_config(TOY_MODEL_DIR).action_horizon if toy_model_available() else 0  # the toy's chunk (16)
pytestmark = [pytest.mark.skipif(not toy_model_available(), reason="the embedded toy model's files are missing"),
              pytest.mark.usefixtures("one_torch_thread")]

ROOT = Path(__file__).resolve().parents[1]
# the tabletop demo's parameters as shipped (rtc.delay auto, k_auto): offline evaluation runs them on the bag's
# clock, so Ray and sequential rows agree on a loaded host too (docs/evaluation-determinism.md); 2 of 8 actions execute
PARAMS = {**cli.read_params_file(ROOT / "config" / "tabletop.yaml"), "actions_per_chunk": 2}
SCORING = ScoringOptions(COMMAND_TOPIC, (), {"subtask": SUBTASK_TOPIC, "narration": NARRATION_TOPIC}, 0.05)


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four tabletop bags from the command line (expert commands, subtask and narration annotations)."""
    out = tmp_path_factory.mktemp("fleet") / "bags"
    assert make_demo_bag.main([str(out), "--scene", "tabletop", "--count", "4", "--no-progress"]) == 0
    return out


def copy_bag(src: Path, dst: Path, extra: dict[str, tuple[str, list[tuple[int, bytes]]]]) -> Path:
    """``src``'s messages plus ``extra`` topics {topic: (msgtype, [(log_ns, cdr bytes)])} in a new bag ``dst``."""
    ts, _ = oxygen_typestore()
    with AnyReader([src], default_typestore=ts) as reader, Writer(dst, version=9) as writer:
        conns = {c.id: writer.add_connection(c.topic, c.msgtype, typestore=ts) for c in reader.connections}
        for conn, log_ns, raw in reader.messages():
            writer.write(conns[conn.id], log_ns, raw)
        for topic, (msgtype, messages) in extra.items():
            conn = writer.add_connection(topic, msgtype, typestore=ts)
            for log_ns, raw in messages:
                writer.write(conn, log_ns, raw)
    return dst


def test_own_output_as_reference_scores_zero(fleet_dir: Path, tmp_path: Path) -> None:
    # one chunk per control period (2.5 Hz x 16 actions at 40 Hz): the chunks tile the time line, so the recorded
    # chunks are a reference every step of every chunk is compared with
    params = {**PARAMS, "control_rate_hz": 2.5, "action_rate_hz": 2.5 * HORIZON, "actions_per_chunk": HORIZON}
    dt_ns = round(1e9 / params["action_rate_hz"])
    # each chunk ready at its tick on the bag clock: no action committed before it is ready, all 16 are published
    # (the default model, half a period, would commit 4 of them; before, this followed the host's speed)
    timing = ReplayTiming("bag", latency_s=0.0)
    bag = fleet_dir / "tabletop_1000000"
    first = evaluate_bag(bag, tmp_path / "first", params, plots=False, progress=False, timing=timing)
    ts, _ = oxygen_typestore()
    chunks, texts, trajectories = [], [], []
    T = ts.types
    with AnyReader([tmp_path / "first" / "out_bag"], default_typestore=ts) as reader:
        for conn, log_ns, raw in reader.messages():
            (chunks if conn.topic == ACTION_TOPIC else texts).append((log_ns, raw))
            if conn.topic == ACTION_TOPIC:  # the same chunk as a JointTrajectory on the action timing rule
                m = reader.deserialize(raw, conn.msgtype)
                acts = np.asarray(m.actions, np.float64).reshape(m.horizon, m.action_dim)
                points = [T["trajectory_msgs/msg/JointTrajectoryPoint"](
                    positions=a, velocities=np.zeros(0), accelerations=np.zeros(0), effort=np.zeros(0),
                    time_from_start=T["builtin_interfaces/msg/Duration"](sec=0, nanosec=(i + 1) * dt_ns))
                    for i, a in enumerate(acts)]
                msg = T["trajectory_msgs/msg/JointTrajectory"](header=m.header, joint_names=m.joint_names,
                                                               points=points)
                trajectories.append((log_ns, ts.serialize_cdr(msg, msg.__msgtype__)))
    assert len(chunks) == first["frames"] > 3 and texts
    own = copy_bag(bag, tmp_path / "own", {"/policy/chunks": (ACTION_TYPE, chunks),
                                           "/policy/trajectory": ("trajectory_msgs/msg/JointTrajectory", trajectories),
                                           "/policy/language": (LANGUAGE_TYPE, texts)})
    for topic in ("/policy/trajectory", "/policy/chunks"):
        scoring = ScoringOptions(topic, (), {"subtask": "/policy/language", "narration": "/policy/language"}, 0.0)
        r = evaluate_bag(own, tmp_path / topic.rsplit("/", 1)[1], params, plots=False, progress=False,
                         scoring=scoring, timing=timing)
        assert r["digest"] == first["digest"]
        a = r["scores"]["actions"]
        assert a["chunks"] == r["frames"] and a["uncovered_chunks"] == 0
        assert a["actions_scored"] == HORIZON * r["frames"]  # every step of every chunk
        assert a["mae"] == a["mse"] == a["first_action"]["mae"] == 0.0
        assert a["within_tolerance"] == {"executed": 1.0, "chunk": 1.0}
        for stream in ("subtask", "narration"):
            lang = r["scores"]["language"][stream]
            assert lang["scored"] > 0 and lang["exact_match"] == 1.0 and lang["edit_distance"] == 0.0


def test_against_the_expert_and_the_default_reference(fleet_dir: Path, tmp_path: Path) -> None:
    r = evaluate_bag(fleet_dir / "tabletop_1000001", tmp_path / "out", PARAMS, progress=False, scoring=SCORING)
    a = r["scores"]["actions"]
    assert r["scores"]["reference_topic"] == COMMAND_TOPIC and a["joints"] == ["ee_x", "ee_y", "ee_z", "gripper"]
    assert a["chunks"] == r["frames"] and a["n_execute"] == 2 and a["horizon"] == HORIZON
    assert 0 < a["mae"] < 0.05 and a["count_per_step"][0] == a["chunks"]
    assert (tmp_path / "out" / "action_error.png").read_bytes()[:4] == b"\x89PNG"
    assert r["scores"]["language"]["subtask"]["exact_match"] > 0.5
    # no reference topic: the future joint states (the measured path lags the commanded targets)
    d = evaluate_bag(fleet_dir / "tabletop_1000001", tmp_path / "default", PARAMS, progress=False, plots=False)
    assert d["scores"]["reference_topic"] == "/joint_states" and d["scores"]["actions"]["mae"] > a["mae"]
    with pytest.raises(ValueError, match="not in the bag"):
        evaluate_bag(fleet_dir / "tabletop_1000001", tmp_path / "bad", PARAMS, progress=False, plots=False,
                     scoring=ScoringOptions("/nope"))
    with pytest.raises(ValueError, match="reference_joints"):
        evaluate_bag(fleet_dir / "tabletop_1000001", tmp_path / "bad2", PARAMS, progress=False, plots=False,
                     scoring=ScoringOptions(COMMAND_TOPIC, ("elbow",)))


def random_toy(out: Path) -> Path:
    """The toy model's architecture, tokenizer and statistics with random weights."""
    save_checkpoint(init_random_weights(Pi05Model(read_config(TOY_MODEL_DIR)), seed=1), out)
    for name in ("tokenizer.model", "norm_stats.json"):
        shutil.copy(TOY_MODEL_DIR / name, out / name)
    return out


def test_trained_model_beats_random_weights(fleet_dir: Path, tmp_path: Path) -> None:
    bags = [fleet_dir / "tabletop_1000002", fleet_dir / "tabletop_1000003"]
    ckpt = random_toy(tmp_path / "random")
    random = {**PARAMS, "model": "", "checkpoint_path": str(ckpt), "tokenizer_path": str(ckpt / "tokenizer.model")}
    toy = evaluate_fleet(bags, tmp_path / "toy", PARAMS, scoring=SCORING, use_ray=False, plots=False)
    rnd = evaluate_fleet(bags, tmp_path / "rnd", random, scoring=SCORING, use_ray=False, plots=False)
    t, r = toy["aggregate"], rnd["aggregate"]
    assert toy["bags"]["evaluated"] == rnd["bags"]["evaluated"] == 2 and t["frames"] == r["frames"]
    assert t["mae"] < 0.25 * r["mae"] and t["first_mae"] < 0.25 * r["first_mae"]
    assert t["within_tolerance_executed"] > r["within_tolerance_executed"] + 0.5
    for stream in ("subtask", "narration"):
        assert t["language"][stream]["exact_match"] > r["language"][stream]["exact_match"] + 0.5


@pytest.fixture(scope="module")
def ray_local() -> Iterator[object]:
    """One small local Ray cluster for the module (2 CPUs, no dashboard, a small object store)."""
    ray = pytest.importorskip("ray", reason="ray is not installed (the `ray` extra)")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 2**20, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        yield ray
    finally:
        ray.shutdown()


def comparable(row: dict) -> tuple:
    return row["name"], row["status"], row.get("outputs_sha256"), row.get("frames"), row.get("actions"), \
        row.get("language")


def test_fleet_on_ray_equals_sequential_with_a_corrupt_bag_and_reruns(fleet_dir: Path, tmp_path: Path,
                                                                      ray_local: object) -> None:
    corrupt = shutil.copytree(fleet_dir / "tabletop_1000001", tmp_path / "bags2" / "corrupt")
    db = next(corrupt.glob("*.db3"))
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    bags = [str(fleet_dir / "tabletop_*"), corrupt]
    seq = evaluate_fleet(bags, tmp_path / "seq", PARAMS, scoring=SCORING, use_ray=False)
    ray = evaluate_fleet(bags, tmp_path / "ray", PARAMS, scoring=SCORING, use_ray=True, workers=2)
    assert seq["timing"]["engine"] == "sequential" and ray["timing"]["engine"] == "ray"
    assert ray["timing"]["workers"] == 2
    for result in (seq, ray):
        assert result["bags"] == {"total": 5, "evaluated": 4, "cached": 0, "failed": 1}
        failed = result["rows"][-1]
        assert failed["status"] == "failed" and "malformed" in failed["reason"]
    assert [comparable(r) for r in ray["rows"]] == [comparable(r) for r in seq["rows"]]
    assert len({r["worker"] for r in ray["rows"][:4]}) == 2  # both actors took bags
    assert ray["aggregate"] == seq["aggregate"]
    agg = seq["aggregate"]
    assert agg["frames"] == sum(r["frames"] for r in seq["rows"][:4]) and agg["mae"] < 0.05
    weights = [r["actions"]["chunks"] for r in seq["rows"][:4]]
    assert agg["mae"] == pytest.approx(np.average([r["actions"]["mae"] for r in seq["rows"][:4]], weights=weights))
    on_disk = json.loads((tmp_path / "seq" / "fleet.json").read_text())
    assert on_disk["rows"] == seq["rows"] and on_disk["outputs"]["plots"] == list(FLEET_PLOTS)
    assert "| **all (frame-weighted)** |" in (tmp_path / "seq" / "fleet.md").read_text()
    for name in FLEET_PLOTS:
        assert (tmp_path / "seq" / name).read_bytes()[:4] == b"\x89PNG"

    # a rerun skips the finished bags (same parameters, same bag digest) and retries the failed one
    (fleet_dir / "tabletop_1000003" / "notes.txt").write_text("changed")  # a new digest: evaluated again
    try:
        again = evaluate_fleet(bags, tmp_path / "seq", PARAMS, scoring=SCORING, use_ray=False)
    finally:
        (fleet_dir / "tabletop_1000003" / "notes.txt").unlink()
    assert [r["status"] for r in again["rows"]] == ["cached", "cached", "cached", "ok", "failed"]
    assert [comparable(r)[2:] for r in again["rows"]] == [comparable(r)[2:] for r in seq["rows"]]
    other = evaluate_fleet(bags[:1], tmp_path / "seq", {**PARAMS, "num_steps": 5}, scoring=SCORING, use_ray=False,
                           plots=False)
    assert other["bags"]["evaluated"] == 4  # other parameters: a different cache key


def test_fleet_command_line(fleet_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert find_bags([fleet_dir]) == sorted(fleet_dir.iterdir())
    assert find_bags([str(fleet_dir / "*_100000[01]"), fleet_dir / "tabletop_1000000"]) == \
        [fleet_dir / "tabletop_1000000", fleet_dir / "tabletop_1000001"]
    with pytest.raises(FileNotFoundError):
        find_bags([tmp_path / "nothing"])
    args = ["--params-file", str(ROOT / "config" / "tabletop.yaml"), "--max-frames", "4",
            "--reference-topic", COMMAND_TOPIC, "--reference-language", f"subtask={SUBTASK_TOPIC}", "--no-ray",
            "--no-progress", "--no-plots"]
    assert cli.main([str(fleet_dir / "tabletop_100000[01]"), "--out", str(tmp_path / "out"), *args]) == 0
    fleet = json.loads((tmp_path / "out" / "fleet.json").read_text())
    assert fleet["bags"]["evaluated"] == 2 and fleet["aggregate"]["frames"] == 8
    assert fleet["config"]["scoring"]["reference_language_topics"] == {"subtask": SUBTASK_TOPIC}
    assert "tabletop_1000001 | ok | 4 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main([str(fleet_dir), "--out", str(tmp_path / "x"), "--reference-language", "subtask", *args])
