"""Offline evaluation does not depend on the host's speed or load (docs/evaluation-determinism.md): the same bag
evaluated with the presets as shipped (``rtc.delay: auto``, ``k_auto``, ``kernels: auto``) on a quiet host and on
a slowed one (two CPU hogs beside it and every frame 0.25 s slower through the node's fault injection) gives the
same actions, texts and scores bit for bit. On the wall clock the same slowdown reaches the RTC delay (the test's
slowdown is real); the measured latency is reported beside the deterministic outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("rosbags", reason="rosbags is not installed")
pytest.importorskip("sensor_msgs.msg", reason="the ROS 2 message wheels are not installed")

from conftest import NODE_PRESETS  # noqa: E402

from oxygen_ros.evaluation import cli  # noqa: E402
from oxygen_ros.evaluation.reference import ScoringOptions  # noqa: E402
from oxygen_ros.evaluation.run import evaluate_bag  # noqa: E402
from oxygen_ros.evaluation.timing import ReplayTiming  # noqa: E402
from oxygen_ros.policy.shipped_model import toy_model_available  # noqa: E402
from oxygen_ros.runtime.params import validate  # noqa: E402
from oxygen_ros.testing.fault_injection import fault_env  # noqa: E402
from oxygen_ros.testing.load import cpu_hogs  # noqa: E402
from oxygen_ros.toy.demo_fleet import (  # noqa: E402
    COMMAND_TOPIC,
    NARRATION_TOPIC,
    SUBTASK_TOPIC,
    make_tabletop_bag,
)

ROOT = Path(__file__).resolve().parents[1]
SCORING = ScoringOptions(COMMAND_TOPIC, (), {"subtask": SUBTASK_TOPIC, "narration": NARRATION_TOPIC}, 0.05)
HANG_S = 0.25  # every frame blocks this long inside the action expert's forward (fault injection ``hang``)
FRAMES = 12

needs_toy = pytest.mark.skipif(not toy_model_available(), reason="the embedded toy model's files are missing")


def shipped(name: str, tmp: Path) -> dict:
    """A preset's parameters as shipped (only the compiled-step / kernel cache moved into the test's folder)."""
    return {**cli.read_params_file(ROOT / "config" / f"{name}.yaml"), "compile_cache_dir": str(tmp / "cache")}


def evaluate(bag: Path, out: Path, params: dict, **kwargs: object) -> dict:
    return evaluate_bag(bag, out, params, max_frames=FRAMES, scoring=SCORING, plots=False, progress=False, **kwargs)


def outputs(report: dict) -> dict:
    """Everything a bag's evaluation decides: digests, the scores, the texts, per frame the RTC delay and first
    step, the skipped ticks."""
    return {"digest": report["digest"], "scores": report["scores"],
            "texts": [(r["stream"], r["stamp_ns"], r["finished_frame"], r["text"])
                      for r in report["requests"]["items"]],
            "frames": [(f["frame"], f["tick"], f["rtc_delay"], f["first_step"], f["tokens"], f["decode_steps"])
                       for f in report["per_frame"]],
            "skipped": report["skipped_frames"]}


@pytest.fixture(scope="module")
def bag(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tabletop episode (expert commands, subtask and narration annotations), as the fleet demo writes it."""
    return make_tabletop_bag(tmp_path_factory.mktemp("determinism") / "bag")


@pytest.mark.parametrize("preset", NODE_PRESETS, ids=lambda p: p.stem)
def test_every_preset_evaluates_on_a_deterministic_clock(preset: Path) -> None:
    """No preset's offline run reads the host's clock: RTC's ``auto`` delay gets modeled ages on the bag clock,
    ``k_auto`` the fixed ``k``, ``kernels: auto`` the plain kernels; the live node's parameters stay as shipped."""
    values = cli.read_params_file(preset)
    if not values.get("model"):  # the robot presets name their checkpoint at launch; any path validates
        values["checkpoint_path"] = "/robot/checkpoint"
    p = validate(values)
    timing = ReplayTiming()
    used, replaced = timing.adopt(p)
    assert not used.k_auto and used.kernels != "auto"
    assert used.rtc_delay == p.rtc_delay and used.rtc_enabled == p.rtc_enabled  # the delay setting is not touched
    assert set(replaced) <= {"k_auto", "kernels"} and all(given != now for given, now in replaced.values())
    dt_s = 1.0 / (p.action_rate_hz or 10 * p.control_rate_hz)
    delay = None if p.rtc_delay == "auto" else int(p.rtc_delay)
    clock = timing.chunk_clock(used, delay, tick_ns=10**9, stamp_ns=10**9 - 10**7, dt_s=dt_s)
    assert clock is not None and clock() == clock(), "a chunk's ready time must come from the bag, not the host"
    if delay is None:
        assert clock() == 10**9 + round(0.5 * p.period_s * 1e9)  # half a control period after the tick
    desc = timing.describe(used, replaced)
    assert desc["deterministic"] and desc["latency_s"] == pytest.approx(0.5 * p.period_s)
    assert (desc["rtc_delay_model"] == "off") == (not p.rtc_enabled)
    # the wall clock is the robot's behaviour: nothing replaced, auto delays measured
    wall = ReplayTiming("wall")
    assert wall.adopt(p) == (p, {})
    assert (wall.chunk_clock(p, delay, 10**9, 10**9, dt_s) is None) == (delay is None)


@needs_toy
@pytest.mark.slow
def test_same_bag_same_outputs_on_a_quiet_and_a_loaded_host(bag: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The tabletop preset as shipped (rtc.delay auto, k_auto true, kernels auto), evaluated twice: once as the
    host is, once with two CPU hogs beside it and every frame HANG_S slower (the node's TEST-ONLY fault injection,
    a real sleep inside the action expert's forward). Actions, texts and scores agree bit for bit."""
    params = shipped("tabletop", tmp_path)
    assert params["k_auto"] is True and params["rtc.delay"] == "auto"  # what the test is about
    quiet = evaluate(bag, tmp_path / "quiet", params)
    for name, value in fault_env(f"hang:*:{HANG_S}").items():
        monkeypatch.setenv(name, value)
    with cpu_hogs(2, max_s=600):
        loaded = evaluate(bag, tmp_path / "loaded", params)
    for name in fault_env(""):
        monkeypatch.delenv(name)

    assert quiet["frames"] >= FRAMES - 3 and quiet["digest"]["num_texts"] > 0, "a run with actions and texts"
    # the loaded run was really slower: every frame's measured latency includes the injected sleep
    measured = [f["timings_ms"]["latency"] for f in loaded["per_frame"]]
    assert min(measured) >= 1e3 * HANG_S, measured  # (a quiet host's tabletop frame: tens of ms)
    # ... and decided nothing
    assert outputs(loaded) == outputs(quiet)
    assert loaded["digest"]["actions_sha256"] == quiet["digest"]["actions_sha256"]
    timing = quiet["config"]["timing"]
    assert timing["clock"] == "bag" and timing["deterministic"] and timing["latency_s"] == pytest.approx(0.05)
    assert timing["replaced"] == {"k_auto": [True, False], "kernels": ["auto", "plain"]}
    # the modeled delay: ready 50 ms after the tick, 20 Hz actions: ceil((tick - stamp + 0.05) / 0.05) actions
    assert {f["rtc_delay"] for f in quiet["per_frame"][1:]} <= {1, 2}


@needs_toy
@pytest.mark.slow
def test_on_the_wall_clock_the_same_slowdown_reaches_the_rtc_delay(bag: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The control of the test above: with ``timing=wall`` (the robot's behaviour) the injected slowdown enters
    the delay estimate and the committed actions, so an equal digest above is not an accident of a slowdown that
    does nothing."""
    params = shipped("tabletop", tmp_path)
    for name, value in fault_env(f"hang:*:{HANG_S}").items():
        monkeypatch.setenv(name, value)
    wall = evaluate(bag, tmp_path / "wall", params, timing=ReplayTiming("wall"))
    bag_clock = evaluate(bag, tmp_path / "bag", params)
    for name in fault_env(""):
        monkeypatch.delenv(name)
    dt_s = 1.0 / params["action_rate_hz"]
    floor = math.ceil(HANG_S / dt_s - 1e-6)  # the measured age includes the injected sleep
    assert all(f["rtc_delay"] >= floor for f in wall["per_frame"][1:]), [f["rtc_delay"] for f in wall["per_frame"]]
    assert all(f["first_step"] >= floor for f in wall["per_frame"]), [f["first_step"] for f in wall["per_frame"]]
    assert all(f["rtc_delay"] < floor for f in bag_clock["per_frame"]), "the bag clock's delay ignores the sleep"
    assert wall["config"]["timing"]["replaced"] == {} and not wall["config"]["timing"]["deterministic"]
    assert wall["digest"]["actions_sha256"] != bag_clock["digest"]["actions_sha256"]


def test_timing_options_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--timing bag|wall`` and ``--latency`` reach the run; contradicting or invalid values are usage errors."""
    for bad in (["--timing", "wall", "--latency", "0.1"], ["--latency", "-1"], ["--timing", "host"]):
        with pytest.raises(SystemExit) as e:
            cli.main([str(tmp_path / "no_bag"), "--out", str(tmp_path / "out"), *bad])
        assert e.value.code == 2, bad
    err = capsys.readouterr().err
    assert "does not apply to --timing wall" in err and "modeled latency must be" in err


@needs_toy
def test_latency_option_sets_the_modeled_delay(bag: Path, tmp_path: Path) -> None:
    """``--latency 0.2``: chunks ready 200 ms after their tick, so (20 Hz actions) 4 actions are committed before
    each one is ready and the auto delay settles at 4 or more; the report says so."""
    args = ["--params-file", str(ROOT / "config" / "tabletop.yaml"), "-p", f"compile_cache_dir:={tmp_path / 'cc'}",
            "--max-frames", "6", "--no-plots", "--no-progress", "--latency", "0.2"]
    assert cli.main([str(bag), "--out", str(tmp_path / "out"), *args]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["config"]["timing"]["latency_s"] == 0.2 and report["config"]["timing"]["clock"] == "bag"
    assert all(f["first_step"] >= 4 for f in report["per_frame"])
    assert all(f["rtc_delay"] >= 4 for f in report["per_frame"][1:])
