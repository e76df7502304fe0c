"""The policy layer: real checkpoint layouts give the frameworks' own actions; every bad file is one clear error.

The LeRobot reference is ``../shared/fixtures/lerobot_pi05_dev`` (computed by LeRobot 0.6.1 itself); tests that
need it skip where it is absent. The openpi references are in ``test/fixtures/openpi`` (computed by openpi's
``Policy.infer``; see ``test_openpi_fixtures.py``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpoints import feature_stats, write_lerobot, write_openpi
from conftest import make_model
from safetensors.torch import load_file

from oxygen_ros.engine import get_config
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.policy import FeatureNorm, PolicyConfigError, RawObservation, SpecOptions, load_policy
from oxygen_ros.policy.adapters import decode_state, encode_actions
from oxygen_ros.policy.formats.lerobot import _relative_mask
from oxygen_ros.policy.images import assemble_slots, image_to_model
from oxygen_ros.policy.language import LanguageSchedule
from oxygen_ros.policy.normalize import normalize, unnormalize
from oxygen_ros.policy.runner import FrameRunner

LEROBOT_DEV = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "lerobot_pi05_dev"
needs_lerobot_dev = pytest.mark.skipif(not LEROBOT_DEV.is_dir(), reason=f"LeRobot reference fixture not present at "
                                       f"{LEROBOT_DEV} (it lives in the project's shared/ folder, not in a clone)")


def rgb(h: int, w: int, seed: int) -> np.ndarray:
    """A structured test image: gratings, a black and a white rectangle, noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[:h, :w]
    img = np.stack([127 + 120 * np.sin(x / (3 + c) + y / (5 + 2 * c) + seed) for c in range(3)], -1)
    img[h // 4: h // 2, w // 5: w // 3] = 0
    img[h // 2: 3 * h // 4, w // 2: 2 * w // 3] = 255
    return np.clip(img + rng.normal(0, 8, img.shape), 0, 255).astype(np.uint8)


# ---------------------------------------------------------------------------------------------- LeRobot reference
@needs_lerobot_dev
def test_lerobot_dev_fixture_actions_match_lerobot() -> None:
    """Raw observations (native-size uint8 images, raw state, task text) -> the robot-unit chunks LeRobot 0.6.1
    returned, every sample (incl. a missing camera, task cleaning, MEAN_STD, bins below -1, untied embeddings)."""
    torch.set_num_threads(1)
    policy = load_policy(LEROBOT_DEV / "checkpoint")
    spec = policy.spec
    assert (spec.framework, spec.camera_slots, spec.chunk_size, spec.action_dims) == (
        "lerobot", ("base_0_rgb", "right_wrist_0_rgb"), 10, 14)
    assert spec.state_norm.mode == spec.action_norm.mode == "mean_std"
    assert not policy.model.config.tie_word_embeddings
    inputs = load_file(str(LEROBOT_DEV / "inputs.safetensors"))
    expected = load_file(str(LEROBOT_DEV / "expected.safetensors"))
    meta = json.loads((LEROBOT_DEV / "inputs.json").read_text())
    assert policy.model.denoise_times(10) == expected["denoise_times"].tolist()
    std = spec.action_norm.stats["std"]
    for s in range(meta["samples"]):
        images = {c: inputs[c][meta["cameras"][c]["rows_for_samples"].index(s)].numpy()
                  for c in meta["sample_cameras"][s]}
        raw = RawObservation(images, inputs["observation.state"][s].numpy(), meta["tasks"][s])
        prepared = policy.prepare(raw)
        n = prepared.prompt_tokens
        assert torch.equal(prepared.observation.tokens[0], expected["observation.language.tokens"][s][:n])
        assert not expected["observation.language.attention_mask"][s][n:].any()
        np.testing.assert_array_equal(prepared.normalized_state, expected["observation.state.normalized"][s].numpy())
        assert torch.equal(prepared.observation.images[0], expected["fed_images"][s])
        assert torch.equal(prepared.observation.image_masks[0], expected["fed_image_masks"][s])
        actions = policy.infer(raw, inputs["noise"][s])
        assert actions.dtype == np.float32 and actions.shape == (10, 14)
        err = np.abs(actions - expected["actions"][s].numpy()) / std
        assert err.max() <= 1e-4, (s, err.max())
        # the same observation as a LeRobot dataset gives it: CHW float images in [0, 1]
        as_float = {k: v.transpose(2, 0, 1).astype(np.float32) / 255 for k, v in images.items()}
        floated = policy.prepare(RawObservation(as_float, raw.state, raw.task))
        assert torch.equal(floated.observation.images, prepared.observation.images)


@needs_lerobot_dev
def test_lerobot_dev_fixture_through_the_engine_runner() -> None:
    """The frame runner (engine + post-processing, as the node runs it) gives the same chunks."""
    policy = load_policy(LEROBOT_DEV / "checkpoint")
    inputs = load_file(str(LEROBOT_DEV / "inputs.safetensors"))
    expected = load_file(str(LEROBOT_DEV / "expected.safetensors"))
    meta = json.loads((LEROBOT_DEV / "inputs.json").read_text())
    tok = policy.tokenizer
    runner = FrameRunner(policy, lambda: build_engine(policy.model, EngineConfig(eos_id=tok.eos_id, max_new_tokens=3),
                                                      detokenize=tok.decode),
                         LanguageSchedule(1, "memory"), noise=lambda i, h, a: inputs["noise"][i].reshape(1, h, a))
    for s in range(meta["samples"]):
        images = {c: inputs[c][meta["cameras"][c]["rows_for_samples"].index(s)].numpy()
                  for c in meta["sample_cameras"][s]}
        out = runner.step(RawObservation(images, inputs["observation.state"][s].numpy(), meta["tasks"][s]))
        err = np.abs(out.chunk.actions - expected["actions"][s].numpy()) / policy.spec.action_norm.stats["std"]
        assert err.max() <= 1e-4 and out.new_requests == 1


# ---------------------------------------------------------------------------------------------- semantics
def test_normalisation_formulas_per_framework() -> None:
    x = np.array([0.0, 1.0, -2.0], dtype=np.float32)
    st = {"mean": np.array([0.5, 0.5, 0.5]), "std": np.array([0.1, 2.0, 0.0]), "q01": np.array([-1.0, 0.0, -2.0]),
          "q99": np.array([1.0, 2.0, -2.0])}
    op = FeatureNorm("quantiles", {k: st[k] for k in ("q01", "q99")}, "openpi", 1e-6)
    np.testing.assert_array_equal(normalize(x, op), (x - st["q01"]) / (st["q99"] - st["q01"] + 1e-6) * 2.0 - 1.0)
    lr = FeatureNorm("quantiles", {k: st[k].astype(np.float32) for k in ("q01", "q99")}, "lerobot", 1e-8)
    y = normalize(x, lr)
    assert y.dtype == np.float32 and y[2] == np.float32(2 * (-2.0 + 2.0) / 1e-8 - 1)  # eps only where the range is 0
    np.testing.assert_allclose(unnormalize(y[:2], FeatureNorm("quantiles", {k: v[:2] for k, v in lr.stats.items()},
                                                              "lerobot", 1e-8)), x[:2], atol=1e-6)
    ms = FeatureNorm("mean_std", {k: st[k].astype(np.float32) for k in ("mean", "std")}, "lerobot", 1e-8)
    np.testing.assert_array_equal(unnormalize(x, ms), x * ms.stats["std"] + ms.stats["mean"])  # no eps back
    om = FeatureNorm("mean_std", {k: st[k] for k in ("mean", "std")}, "openpi", 1e-6)
    wide = unnormalize(np.ones((2, 5)), om)  # dims beyond the stats: mean 0, std 1 (+1e-6), as openpi pads
    np.testing.assert_allclose(wide[:, 3:], 1 + 1e-6)


def test_relative_mask_and_aloha_adapter() -> None:
    names = ["left_joint", "left_gripper", "right_joint", "right_gripper"]
    assert _relative_mask(4, ["gripper"], names) == [True, False, True, False]
    assert _relative_mask(3, ["gripper"], None) == [True, True, True]
    state = np.linspace(0.1, 1.4, 14)
    state[[6, 13]] = [0.03, 0.045]
    pi = decode_state(state.copy(), "aloha")
    assert pi[1] == -state[1] and pi[0] == state[0]
    actions = encode_actions(np.tile(pi, (2, 1)), "aloha")
    assert actions[0, 1] == state[1]  # the flips undo each other
    with pytest.raises(ValueError, match="14 dims"):
        decode_state(np.zeros(7), "aloha")


def test_image_conventions_and_missing_camera_rules() -> None:
    img = rgb(48, 64, 0)
    openpi = image_to_model(img, 32, "pil_bilinear")
    lerobot = image_to_model(img, 32, "torch_bilinear")
    assert openpi.shape == lerobot.shape == (3, 32, 32)
    assert (openpi[:, :4] == -1).all() and (lerobot[:, :4] == -1).all()  # 24 rows of image centred in 32
    assert np.abs(openpi - lerobot).max() > 0.05  # antialiased PIL vs plain bilinear differ at edges
    ref = torch.nn.functional.interpolate(torch.from_numpy(img).float().permute(2, 0, 1)[None] / 255, (24, 32),
                                          mode="bilinear", align_corners=False).clamp(0, 1)[0] * 2 - 1
    np.testing.assert_array_equal(lerobot[:, 4:28], ref.numpy())
    np.testing.assert_array_equal(image_to_model(rgb(32, 32, 1), 32, "pil_bilinear"),
                                  torch.from_numpy(rgb(32, 32, 1)).float().permute(2, 0, 1).numpy() / 255 * 2 - 1)
    a, b = np.zeros((3, 8, 8), np.float32), np.ones((3, 8, 8), np.float32)
    px, m = assemble_slots({"c": b, "a": a}, ("a", "b", "c"), 8, "append")
    assert m.tolist() == [True, True, False] and (px[1] == 1).all() and (px[2] == -1).all()
    px, m = assemble_slots({"c": b, "a": a}, ("a", "b", "c"), 8, "in_place")
    assert m.tolist() == [True, False, True] and (px[2] == 1).all() and (px[1] == -1).all()
    with pytest.raises(ValueError, match="unknown camera slot"):
        assemble_slots({"z": a}, ("a",), 8, "append")
    with pytest.raises(ValueError, match="no camera image"):
        assemble_slots({}, ("a",), 8, "append")


@pytest.mark.parametrize("resize", ["pil_bilinear", "torch_bilinear"])
@pytest.mark.parametrize(("h", "w", "size"), [(100, 200, 224), (480, 640, 224), (640, 480, 224), (30, 31, 28),
                                             (1, 1000, 64), (224, 224, 112), (10, 10, 224)])
def test_resize_with_pad_geometry(resize: str, h: int, w: int, size: int) -> None:
    """White content on black (-1) with the frameworks' sizes: int(dim / ratio), centred, remainder bottom/right."""
    ratio = max(w / size, h / size)
    new_h, new_w = int(h / ratio), int(w / ratio)
    if new_h == 0:
        with pytest.raises(ValueError, match="cannot be fitted"):
            image_to_model(np.full((h, w, 3), 255, np.uint8), size, resize)
        return
    top, left = (size - new_h) // 2, (size - new_w) // 2
    out = image_to_model(np.full((h, w, 3), 255, np.uint8), size, resize)
    assert out.shape == (3, size, size) and out.dtype == np.float32
    content = np.zeros((size, size), bool)
    content[top:top + new_h, left:left + new_w] = True
    np.testing.assert_array_equal(out[:, ~content], -1.0)
    np.testing.assert_allclose(out[:, content], 1.0, atol=1e-6)


@pytest.mark.parametrize("bad", [np.zeros((4, 4), np.uint8), np.zeros((4, 4, 4), np.uint8),
                                 np.zeros((4, 4, 3), np.int32), np.zeros((0, 4, 3), np.uint8),
                                 np.full((4, 4, 3), np.nan, np.float32)])
def test_non_rgb_images_are_rejected(bad: np.ndarray) -> None:
    from oxygen_ros.policy.images import as_hwc_uint8

    with pytest.raises(ValueError):
        as_hwc_uint8(bad)


# ---------------------------------------------------------------------------------------------- generated layouts
@pytest.fixture(scope="module")
def tiny_lerobot(tmp_path_factory) -> Path:
    model = make_model(get_config("tiny", max_token_len=64, action_dim=32), seed=5)
    return write_lerobot(tmp_path_factory.mktemp("lr"), model, cameras=["top", "wrist", "side"], state_dim=6,
                         action_dim=6, chunk_size=10, n_action_steps=5, norm="QUANTILES", relative=True,
                         action_names=["j1", "j2", "j3", "j4", "j5", "gripper"])


def test_lerobot_layout_is_read_from_its_files(tiny_lerobot: Path) -> None:
    policy = load_policy(tiny_lerobot)
    spec = policy.spec
    assert spec.camera_slots == ("top", "wrist", "side") and policy.model.config.num_cameras == 3
    assert (spec.chunk_size, spec.n_action_steps, spec.action_dims, spec.state_dim) == (10, 5, 6, 6)
    assert spec.state_norm.mode == "quantiles" and spec.delta_mask == (True,) * 5 + (False,)
    assert spec.time_schedule == "exact" and policy.model.config.action_horizon == 10
    state = np.linspace(-0.5, 0.5, 6).astype(np.float32)
    raw = RawObservation({"top": rgb(60, 80, 1), "side": rgb(30, 40, 2)}, state, " pick_up\nthe cube ")
    prepared = policy.prepare(raw)
    assert prepared.observation.image_masks.tolist() == [[True, True, False]]  # side moves up, placeholder last
    text = policy.tokenizer.decode(prepared.observation.tokens[0].tolist())
    assert text.startswith("Task: pick up the cube, State: ") and text.endswith(";\nAction: ")
    noise = torch.randn(1, 10, 32, generator=torch.Generator().manual_seed(0))
    actions = policy.infer(raw, noise)
    chunk = policy.model.sample_actions(prepared.observation, noise)[0, :, :6].numpy()
    stats = spec.action_norm.stats
    d = np.where(stats["q99"] - stats["q01"] == 0, 1e-8, stats["q99"] - stats["q01"]).astype(np.float32)
    absolute = (chunk + 1.0) * d / 2.0 + stats["q01"] + np.where(spec.delta_mask, state, 0).astype(np.float32)
    np.testing.assert_allclose(actions, absolute, rtol=1e-6, atol=1e-6)


def _lerobot_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src.parent, dst)
    return dst / "checkpoint"


def _edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("case, match", [
    ("not_json", "policy_preprocessor.json: not valid JSON"),
    ("memory_feature", "input_features.observation.memory .*not supported"),
    ("rtc", "rtc_config"),
    ("no_stats", "no observation.state.q01, observation.state.q99 statistics"),
    ("unknown_step", "steps\\[1\\].registry_name 'mystery_processor' is not supported"),
    ("resolution", "image_resolution"),
    ("n_action_steps", "n_action_steps 20 must be in 1..chunk_size"),
    ("tokenizer", "tokenizer_name 'nowhere/none' is not available locally"),
    ("layout", "unknown layout"),
])
def test_bad_lerobot_checkpoints_are_clear_errors(tiny_lerobot: Path, tmp_path: Path, case: str, match: str) -> None:
    ckpt = _lerobot_copy(tiny_lerobot, tmp_path / case)
    if case == "not_json":
        (ckpt / "policy_preprocessor.json").write_bytes(b"\x00\xff\xfe binary")
        match = "policy_preprocessor.json: not a text file"
    elif case == "memory_feature":
        _edit_json(ckpt / "config.json", lambda d: d["input_features"].update(
            {"observation.memory": {"type": "ENV", "shape": [8]}}))
    elif case == "rtc":
        _edit_json(ckpt / "config.json", lambda d: d.update(rtc_config={"prefix_attention_schedule": "COSINE"}))
    elif case == "no_stats":
        from safetensors.numpy import load_file as load_np
        from safetensors.numpy import save_file as save_np

        f = ckpt / "policy_preprocessor_step_3_normalizer_processor.safetensors"
        save_np({k: v for k, v in load_np(str(f)).items() if "state.q" not in k}, str(f))
    elif case == "unknown_step":
        _edit_json(ckpt / "policy_preprocessor.json", lambda d: d["steps"][1].update(registry_name="mystery_processor"))
    elif case == "resolution":
        _edit_json(ckpt / "config.json", lambda d: d.update(image_resolution=[256, 256]))
    elif case == "n_action_steps":
        _edit_json(ckpt / "config.json", lambda d: d.update(n_action_steps=20))
    elif case == "tokenizer":
        _edit_json(ckpt / "policy_preprocessor.json",
                   lambda d: d["steps"][5]["config"].update(tokenizer_name="nowhere/none"))
    elif case == "layout":
        (ckpt / "config.json").write_text("{}")
        (ckpt / "policy_preprocessor.json").unlink()
    with pytest.raises(PolicyConfigError, match=match):
        load_policy(ckpt)


def test_lerobot_rtc_config_is_read(tiny_lerobot: Path, tmp_path: Path) -> None:
    """A checkpoint saved with ``rtc_config`` loads; its settings (not LeRobot's defaults) become ``spec.rtc``."""
    from oxygen_ros.engine.rtc import RTCConfig

    plain = load_policy(tiny_lerobot)
    assert plain.spec.rtc is None
    from oxygen_ros.engine.rtc import RTCPrefix

    raw = RawObservation({plain.spec.camera_slots[0]: rgb(120, 160, 3)}, np.full(plain.spec.state_dim or 8, 0.1),
                         "open it")
    noise = np.random.default_rng(0).normal(size=(plain.spec.chunk_size, plain.model.config.action_dim))
    remainder = RTCPrefix(np.ones((4, plain.spec.action_dims), np.float32), 2)
    assert np.array_equal(plain.infer(raw, noise, rtc=remainder), plain.infer(raw, noise)), \
        "without rtc_config LeRobot's predict_action_chunk ignores the remainder"
    assert not np.array_equal(plain.infer(raw, noise, rtc=remainder, rtc_config=RTCConfig()), plain.infer(raw, noise))
    ckpt = _lerobot_copy(tiny_lerobot, tmp_path / "rtc")
    _edit_json(ckpt / "config.json", lambda d: d.update(rtc_config={
        "enabled": True, "prefix_attention_schedule": "EXP", "max_guidance_weight": 4.0, "execution_horizon": 7,
        "debug": False, "debug_maxlen": 100}))
    assert load_policy(ckpt).spec.rtc == RTCConfig(True, "identity", "exp", 4.0, 7)


def test_lerobot_refuses_overrides_that_would_lie(tiny_lerobot: Path) -> None:
    with pytest.raises(PolicyConfigError, match="norm_stats_path: not used for LeRobot"):
        load_policy(tiny_lerobot, SpecOptions(norm_stats_path="/x/norm_stats.json"))
    with pytest.raises(PolicyConfigError, match="cannot override a LeRobot checkpoint"):
        load_policy(tiny_lerobot, SpecOptions(normalization="quantile"))
    assert load_policy(tiny_lerobot, SpecOptions(normalization="none")).spec.action_norm is None


@pytest.fixture(scope="module")
def tiny_openpi(tmp_path_factory) -> Path:
    model = make_model(get_config("tiny", max_token_len=200, action_dim=32), seed=6)
    return write_openpi(tmp_path_factory.mktemp("op"), model, state_dim=8, action_dim=8, horizon=15)


def test_openpi_layout_reads_assets_and_the_data_config(tiny_openpi: Path, tmp_path: Path) -> None:
    policy = load_policy(tiny_openpi)
    spec = policy.spec
    assert (spec.framework, spec.chunk_size, spec.action_dims, spec.state_in_prompt) == ("openpi", 15, 8, True)
    assert spec.camera_slots == ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
    assert "pi05_droid" in spec.notes[0] and spec.time_schedule == "accumulate"
    libero = load_policy(tiny_openpi, SpecOptions(openpi_config="pi05_libero"))
    assert not libero.spec.state_in_prompt and libero.spec.action_dims == 7
    raw = RawObservation({"base_0_rgb": rgb(180, 320, 3)}, np.full(8, 0.2), "open the drawer")
    text = libero.tokenizer.decode(libero.prepare(raw).observation.tokens[0].tolist())
    assert text == "open the drawer\n"  # openpi's pi0 prompt format: no state

    two = shutil.copytree(tiny_openpi, tmp_path / "two")
    shutil.copytree(two / "assets" / "droid", two / "assets" / "org" / "other")
    with pytest.raises(PolicyConfigError, match=r"several norm stats \['droid', 'org/other'\]"):
        load_policy(two)
    assert load_policy(two, SpecOptions(asset_id="org/other")).spec.framework == "openpi"
    with pytest.raises(PolicyConfigError, match="asset_id: 'nope'"):
        load_policy(two, SpecOptions(asset_id="nope"))
    shutil.rmtree(two / "assets")
    with pytest.raises(PolicyConfigError, match="no assets/<asset_id>/norm_stats.json"):
        load_policy(two)
    (two / "bad.json").write_bytes((tiny_openpi / "model.safetensors").read_bytes()[:64])
    with pytest.raises(PolicyConfigError, match="bad.json: not a text file"):
        load_policy(two, SpecOptions(norm_stats_path=str(two / "bad.json")))
    with pytest.raises(PolicyConfigError, match="cannot tell the action dims"):
        load_policy(two, SpecOptions(normalization="none"))
    droid = SpecOptions(normalization="none", openpi_config="pi05_droid")
    assert load_policy(two, droid).spec.state_norm is None
    (two / "tokenizer.model").unlink()
    with pytest.raises(PolicyConfigError, match="tokenizer_path: openpi checkpoints do not ship"):
        load_policy(two, droid)


def test_openpi_quantile_pipeline_by_hand(tiny_openpi: Path) -> None:
    """openpi's Normalize -> discretised prompt -> model -> Unnormalize, written out independently."""
    policy = load_policy(tiny_openpi)
    stats = json.loads((tiny_openpi / "assets" / "droid" / "norm_stats.json").read_text())["norm_stats"]
    state = np.array([0.1, -3.0, 0.4, 2.0, 0.0, 0.3, -0.2, 0.05])
    s = {k: np.asarray(v) for k, v in stats["state"].items()}
    norm = (state - s["q01"]) / (s["q99"] - s["q01"] + 1e-6) * 2.0 - 1.0
    bins = np.digitize(norm, bins=np.linspace(-1, 1, 257)[:-1]) - 1
    assert bins.min() == -1
    raw = RawObservation({"base_0_rgb": rgb(224, 224, 4), "left_wrist_0_rgb": rgb(100, 120, 5)}, state, "stack")
    prepared = policy.prepare(raw)
    expected = f"Task: stack, State: {' '.join(map(str, bins))};\nAction: "
    assert policy.tokenizer.decode(prepared.observation.tokens[0].tolist()) == expected
    assert prepared.observation.image_masks.tolist() == [[True, True, False]]
    noise = torch.randn(1, 15, 32, generator=torch.Generator().manual_seed(1))
    out = policy.model.sample_actions(prepared.observation, noise)[0].numpy()  # float32, as openpi's model returns
    a = {k: np.asarray(v) for k, v in stats["actions"].items()}
    ref = (out[:, :8] + 1.0) / 2.0 * (a["q99"] - a["q01"] + 1e-6) + a["q01"]  # (x + 1) / 2 stays float32 in numpy
    assert ref.dtype == np.float64 and not np.array_equal(ref, (out[:, :8].astype(np.float64) + 1.0) / 2.0 * (
        a["q99"] - a["q01"] + 1e-6) + a["q01"])  # the order matters: casting first moves the actions by an ulp
    np.testing.assert_array_equal(policy.infer(raw, noise), ref)


def test_runner_engines_agree_and_execute_n_actions(tiny_lerobot: Path) -> None:
    """oxygen and isolated engines give bit-identical robot-unit chunks; n_action_steps of them are executed."""
    policy = load_policy(tiny_lerobot)
    tok = policy.tokenizer
    outs = {}
    for mode in ("oxygen", "isolated"):
        runner = FrameRunner(policy, lambda m=mode: build_engine(policy.model, EngineConfig(
            mode=m, k=2, eos_id=tok.eos_id, max_new_tokens=4), detokenize=tok.decode), LanguageSchedule(2, "memory"))
        outs[mode] = []
        for f in range(4):
            raw = RawObservation({"top": rgb(64, 64, f), "wrist": rgb(64, 64, f + 9)},
                                 feature_stats(6, 1)["mean"] + 0.1 * f, "pick up the cube")
            out = runner.step(raw, stamp_ns=f * 100)
            assert out.chunk.actions.shape == (5, 6) and out.chunk.chunk.shape == (10, 6)
            assert out.new_requests == (f % 2 == 0) and out.chunk.stamp_ns == f * 100
            assert 0 < out.chunk.inference_s <= out.chunk.latency_s + 1e-9
            outs[mode].append(out.chunk.chunk)
    for a, b in zip(outs["oxygen"], outs["isolated"], strict=True):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------------------------- node presets
PRESETS = {  # preset -> (asset id, state dims, action dims kept, horizon)
    "libero": ("physical-intelligence/libero", 8, 7, 10),
    "droid": ("droid", 8, 8, 15),
    "aloha": ("trossen", 14, 14, 50),
}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_fit_the_public_openpi_checkpoints(preset: str, tmp_path: Path) -> None:
    """config/<preset>.yaml + an openpi checkpoint laid out like the public one: configure's checks pass, and the
    checkpoint's own contract (not the YAML) decides horizon, prompt format, deltas and the adapter."""
    import yaml

    from oxygen_ros.runtime.model_loader import load_node_policy
    from oxygen_ros.runtime.params import validate

    asset, state_dim, action_dim, horizon = PRESETS[preset]
    model = make_model(get_config("tiny", max_token_len=200, action_dim=32), seed=7)
    ckpt = write_openpi(tmp_path / "ckpt", model, state_dim=state_dim, action_dim=action_dim, horizon=horizon,
                        asset_ids=(asset,))
    repo = Path(__file__).resolve().parents[1]
    values = yaml.safe_load((repo / "config" / f"{preset}.yaml").read_text())["/**"]["ros__parameters"]
    loaded = load_node_policy(validate({**values, "checkpoint_path": str(ckpt), "device": "cpu"}))
    spec = loaded.policy.spec
    assert spec.chunk_size == horizon and spec.action_dims == len(loaded.action_names) == action_dim
    assert spec.state_in_prompt == (preset != "libero")
    assert spec.robot_adapter == ("aloha" if preset == "aloha" else "none")
    assert any(spec.delta_mask) == (preset == "aloha")
    with pytest.raises(ValueError, match="action_horizon: 3 but the checkpoint denoises chunks of"):
        load_node_policy(validate({**values, "checkpoint_path": str(ckpt), "device": "cpu", "action_horizon": 3}))


def test_libero_preset_fits_a_lerobot_libero_checkpoint(tmp_path: Path) -> None:
    """LeRobot's LIBERO fine-tunes name their cameras after the dataset (image, image2), chunk 50, execute 10: the
    preset takes the cameras from the checkpoint and feeds its two topics to them in order."""
    import yaml

    from oxygen_ros.runtime.model_loader import load_node_policy
    from oxygen_ros.runtime.params import validate

    model = make_model(get_config("tiny", max_token_len=64, action_dim=32), seed=8)
    ckpt = write_lerobot(tmp_path, model, cameras=["image", "image2"], state_dim=8, action_dim=7, chunk_size=50,
                         n_action_steps=10)
    repo = Path(__file__).resolve().parents[1]
    values = yaml.safe_load((repo / "config" / "libero.yaml").read_text())["/**"]["ros__parameters"]
    loaded = load_node_policy(validate({**values, "checkpoint_path": str(ckpt), "device": "cpu"}))
    p = loaded.params
    assert p.camera_names == ("image", "image2") and p.camera_topic(0) == values["camera_topics"][0]
    assert (loaded.policy.spec.chunk_size, loaded.policy.spec.n_action_steps, len(loaded.action_names)) == (50, 10, 7)
    with pytest.raises(ValueError, match="camera_topics: 1 entries for the 2 cameras"):
        load_node_policy(validate({**values, "checkpoint_path": str(ckpt), "device": "cpu",
                                   "camera_topics": ["/only"], "camera_compressed": []}))
