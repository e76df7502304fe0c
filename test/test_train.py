"""Training and closed-loop evaluation of the toy pi0.5: conversions, losses, a training smoke run, engine
equivalence in the loop and (when committed) the trained model's success."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from oxygen_ros.engine.checkpoint import load_checkpoint, read_config, save_checkpoint
from oxygen_ros.engine.tokenizer import PromptTokenizer
from oxygen_ros.policy import PolicyConfigError, load_policy
from oxygen_ros.policy.coverage import coverage_warning
from oxygen_ros.policy.shipped_model import TOY_MODEL_DIR
from oxygen_ros.study.reference import reference_language_logits
from oxygen_ros.toy.train.data import collect, make_batch
from oxygen_ros.toy.train.evaluate import ClosedLoop, evaluate
from oxygen_ros.toy.train.losses import _mask_and_positions, sample_time, training_losses
from oxygen_ros.toy.train.object_maps import OBJECT_CLASSES, object_maps
from oxygen_ros.toy.train.policy import NormStats, episode_noise
from oxygen_ros.toy.train.recipe import init_toy_model, make_world_tokenizer, sincos_2d, toy_config
from oxygen_ros.toy.train.train import TrainConfig, train, warm_start
from oxygen_ros.toy.world import TabletopWorld


@pytest.fixture(scope="module")
def demos():
    return collect(6, progress=False)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return PromptTokenizer(make_world_tokenizer(tmp_path_factory.mktemp("tok")), toy_config().max_token_len)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A few training steps end to end (the smoke run the evaluation tests reuse)."""
    out = tmp_path_factory.mktemp("toy")
    train(TrainConfig(out=out, episodes=6, steps=12, batch_size=8, num_noise=2, threads=1, log_every=1),
          progress=False)
    return out


def test_demonstrations(demos) -> None:
    n = len(demos)
    assert n > 50 and demos.images.shape == (n, 2, 64, 64, 3) and demos.images.dtype == np.uint8
    assert demos.actions.shape == (n, 8, 4) and demos.states.shape == (n, 4)
    assert {m.split(" is ")[1] for m in demos.memories} >= {"on the table.", "in the gripper."}
    assert {s.split(" ")[0] for s in demos.subtasks} == {"pick", "put", "done"}
    assert len(set(demos.episodes.tolist())) == 6


def test_norm_stats_round_trip(demos, tmp_path) -> None:
    stats = NormStats.fit(demos.states, demos.actions)
    stats.save(tmp_path)
    stats = NormStats.load(tmp_path)
    model = stats.actions_to_model(demos.actions[:5], demos.states[:5])
    assert np.abs(model).max() < 3.0
    for i in range(5):
        np.testing.assert_allclose(stats.actions_from_model(model[i], demos.states[i]), demos.actions[i], atol=1e-5)


def test_time_distribution() -> None:
    t = sample_time(20000, torch.Generator().manual_seed(0))
    assert float(t.min()) >= 0.001 and float(t.max()) <= 1.0
    assert float(t.mean()) == pytest.approx(0.001 + 0.999 * 0.6, abs=0.01)  # Beta(1.5, 1) mean 0.6


def test_joint_loss_streams_match_reference(demos, tok) -> None:
    cfg = toy_config()
    model = init_toy_model(cfg, seed=1).eval()
    stats = NormStats.fit(demos.states, demos.actions)
    batch = make_batch(demos, np.arange(3), tok, stats, cfg.action_dim)
    memory, subtask = batch.language["memory"][0], batch.language["subtask"][0]
    assert memory[0, :3].tolist() == tok.tokenize_request("memory") and (memory == tok.eos_id).sum() == 3
    with torch.no_grad():
        prefix, valid = model.embed_prefix(batch.observation)
        h = cfg.action_horizon
        x, t = torch.randn(3, h, cfg.action_dim), torch.full((3,), 0.4)
        act, cond = model.embed_suffix(x, t)
        other, other_cond = model.embed_suffix(torch.randn_like(x), torch.full((3,), 0.9))
        mask, pos = _mask_and_positions(valid, [memory.shape[1], subtask.shape[1]], h, 2)
        out = model.joint_forward([(prefix, model.backbone, None), (model.embed_tokens(memory), model.backbone, None),
                                   (model.embed_tokens(subtask), model.backbone, None),
                                   (other, model.expert, other_cond), (act, model.expert, cond)], mask, pos)
        mask1, pos1 = _mask_and_positions(valid, [], h, 1)
        alone = model.joint_forward([(prefix, model.backbone, None), (act, model.expert, cond)], mask1, pos1)[1]
        for tokens, hidden in ((memory, out[1]), (subtask, out[2])):
            ref = reference_language_logits(model, batch.observation, tokens)[:, 1:]
            torch.testing.assert_close(model.lm_logits(hidden), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out[4], alone, atol=1e-5, rtol=1e-5)


def test_loss_decreases_on_a_fixed_batch(demos, tok) -> None:
    cfg = toy_config()
    torch.manual_seed(0)
    model = init_toy_model(cfg).train()
    stats = NormStats.fit(demos.states, demos.actions)
    batch = make_batch(demos, np.arange(0, len(demos), 7)[:8], tok, stats, cfg.action_dim)
    head = torch.nn.Linear(cfg.backbone.width, len(OBJECT_CLASSES))
    opt = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=2e-3)
    losses = []
    for step in range(25):
        gen = torch.Generator().manual_seed(step % 2)  # two fixed noise draws, so the loss is comparable
        parts = training_losses(model, batch, num_noise=2, gen=gen, object_head=head)
        assert set(parts) == {"action", "memory", "subtask", "narration", "answer", "objects"}
        loss = sum(parts.values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_training_writes_a_loadable_model(trained: Path) -> None:
    names = {p.name for p in trained.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.model", "norm_stats.json", "train_log.json",
            "train_curves.png"} <= names
    model = load_checkpoint(trained)
    assert model.config.name == "toy" and model.config.action_dim == 4
    assert sum(p.stat().st_size for p in trained.iterdir()) < 20e6


def test_engines_act_identically_in_the_loop(trained: Path) -> None:
    runs = {}
    for mode in ("oxygen", "isolated"):
        loop = ClosedLoop(trained, mode, k=2, max_new_tokens=6, max_steps=24)
        runs[mode] = loop.run_episode(1_000_000)
    a, b = runs["oxygen"], runs["isolated"]
    assert len(a.chunks) == len(b.chunks) == 3
    # the recipe's chunk is 16 actions; a frame executes the checkpoint's n_action_steps (8) of them
    assert loop.policy.spec.chunk_size == 16 and loop.policy.spec.n_action_steps == loop.runner.n_execute == 8
    assert all(len(c) == 8 for c in a.chunks)
    for x, y in zip(a.chunks, b.chunks, strict=True):
        np.testing.assert_array_equal(x, y)
    assert a.memory_total == b.memory_total == a.frames  # every request finished (oxygen drains its backlog)
    assert a.memory_exact == b.memory_exact


def test_warm_start_changes_the_horizon(trained: Path, tok) -> None:
    # no weight depends on the horizon (RoPE positions in the action expert): every tensor of a 16-action checkpoint
    # warm-starts a model of another horizon, which then samples chunks of its own length
    model = init_toy_model(toy_config(horizon=4), seed=3).eval()
    info = warm_start(model, tok, trained)
    assert info["tensors"] == len(model.state_dict())
    torch.testing.assert_close(model.state_dict(), load_checkpoint(trained).state_dict())
    assert model.config.action_horizon == 4


def test_cached_demonstrations_must_match_the_horizon(demos, tmp_path: Path) -> None:
    demos.save(tmp_path / "demos.npz")  # chunks of 8
    with pytest.raises(ValueError, match="chunks of 8 actions, but horizon is 16"):
        train(TrainConfig(out=tmp_path / "out", data=tmp_path / "demos.npz", horizon=16, steps=1), progress=False)


def test_committed_chunk_outlasts_the_frame() -> None:
    # the tabletop preset (make demo, the executor benchmark): a published chunk must last until the next one is
    # there, one control period plus the node's latency later, with margin for a loaded host (ages up to 0.5 s);
    # the 8-action model (400 ms at 20 Hz) failed this
    import yaml

    params = next(iter(yaml.safe_load((Path(__file__).parents[1] / "config" / "tabletop.yaml").read_text())
                       .values()))["ros__parameters"]
    horizon = read_config(TOY_MODEL_DIR).action_horizon
    dt, period = 1.0 / params["action_rate_hz"], 1.0 / params["control_rate_hz"]
    assert horizon == 16 and horizon * dt >= 8 * period
    assert coverage_warning(horizon, dt, period, age_s=0.5, rtc=True) is None
    assert coverage_warning(8, dt, period, age_s=0.5, rtc=True) is not None
    # where the node derives the action rate from the checkpoint's n_action_steps (action_rate_hz 0: 8 x 10 Hz),
    # the whole chunk (real-time chunking publishes it) spans two periods: the node's p99 latency (65 ms) fits
    spec = load_policy(TOY_MODEL_DIR).spec
    assert spec.n_action_steps == 8 and spec.chunk_size == horizon
    derived = 1.0 / (spec.n_action_steps * params["control_rate_hz"])
    assert coverage_warning(horizon, derived, period, age_s=0.065, rtc=True) is None
    assert coverage_warning(8, derived, period, age_s=0.065, rtc=True) is not None  # the 8-action model's


def test_checkpoint_n_action_steps_is_validated(trained: Path, tmp_path: Path) -> None:
    import json
    import shutil

    assert json.loads((trained / "config.json").read_text())["n_action_steps"] == 8
    bad = Path(shutil.copytree(trained, tmp_path / "bad"))
    meta = json.loads((bad / "config.json").read_text())
    for value in (0, 17, "8"):
        (bad / "config.json").write_text(json.dumps({**meta, "n_action_steps": value}))
        with pytest.raises(PolicyConfigError, match="n_action_steps"):
            load_policy(bad)
    with pytest.raises(ValueError, match="n_action_steps"):
        save_checkpoint(load_checkpoint(trained), tmp_path / "x", n_action_steps=17)


def test_episode_noise_is_fixed() -> None:
    assert torch.equal(episode_noise(3, 2, 8, 4), episode_noise(3, 2, 8, 4))
    assert not torch.equal(episode_noise(3, 2, 8, 4), episode_noise(3, 3, 8, 4))


def test_evaluate_writes_json_and_filmstrip(trained: Path, tmp_path: Path) -> None:
    m = evaluate(trained, episodes=1, mode="oxygen", max_new_tokens=4, out=tmp_path, progress=False)
    assert m["success_rate"] in (0.0, 1.0) and m["memory_requests"] > 0  # one episode: it succeeded or not
    assert m["actions_per_s"] > 0 and m["language_tokens_per_s"] > 0
    assert (tmp_path / "eval_oxygen.json").exists() and (tmp_path / "filmstrip_oxygen.png").stat().st_size > 1000


def test_committed_model_succeeds_in_closed_loop() -> None:
    m = evaluate(TOY_MODEL_DIR, episodes=10, mode="oxygen", progress=False)  # fixed seeds: deterministic
    summary = {k: v for k, v in m.items() if k != "per_episode"}
    assert m["success_rate"] >= 0.8 and m["memory_exact_match"] >= 0.85, summary


def test_committed_model_acts_identically_under_oxygen_and_isolated() -> None:
    runs = {mode: [ClosedLoop(TOY_MODEL_DIR, mode).run_episode(1_000_000 + i) for i in range(2)]
            for mode in ("oxygen", "isolated")}
    for a, b in zip(runs["oxygen"], runs["isolated"], strict=True):
        assert (a.success, a.steps, len(a.chunks)) == (b.success, b.steps, len(b.chunks))
        for x, y in zip(a.chunks, b.chunks, strict=True):
            np.testing.assert_array_equal(x, y)


def test_object_maps_mark_object_centres() -> None:
    world = TabletopWorld()
    world.reset(7)
    maps = object_maps(world, 16)
    assert maps.shape == (2, 16, len(OBJECT_CLASSES)) and maps.dtype == np.uint8
    s = world.state
    for xy, color in zip(s.block_xy, s.block_colors, strict=True):
        patch = int(xy[1] * 4) * 4 + int(xy[0] * 4)  # top view: the table fills the image, one cell per patch
        assert maps[0, patch, OBJECT_CLASSES.index(f"{color} block")] == 1
    assert maps[0].sum() == len(s.block_xy) + len(s.plate_xy) + 1  # + the gripper
    wrist = maps[1, :, OBJECT_CLASSES.index("gripper")]
    assert wrist.sum() == 1 and wrist.argmax() in (5, 6, 9, 10)  # the wrist camera looks down at the gripper


def test_fixed_vision_positions_are_frozen_sincos() -> None:
    cfg = toy_config()
    grid = cfg.vision.image_size // cfg.vision.patch_size
    table = sincos_2d(grid, cfg.vision.width)
    assert table.shape == (cfg.vision.tokens_per_image, cfg.vision.width)
    assert len({tuple(r) for r in table.round(decimals=4).tolist()}) == grid * grid  # every patch distinct
    pos = init_toy_model(cfg).paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings
    assert not pos.position_embedding.weight.requires_grad
    torch.testing.assert_close(pos.position_embedding.weight.detach(), table)
