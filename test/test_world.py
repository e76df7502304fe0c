"""The toy tabletop world: determinism, dynamics, rendering, memory ground truth and the scripted expert."""

from __future__ import annotations

import numpy as np
import pytest

from oxygen_ros.toy.world import (
    CAMERAS,
    JOINT_NAMES,
    TabletopWorld,
    WorldConfig,
    expert_chunk,
    expert_subtask,
    run_expert,
)
from oxygen_ros.toy.world.render import COLORS


def _trajectory(seed: int) -> tuple[list[np.ndarray], list[str]]:
    world = TabletopWorld()
    world.reset(seed)
    states, memories = [], []
    while not world.done:
        states.append(world.joint_state)
        memories.append(world.memory_text())
        world.step(expert_chunk(world, 8))
    return states, memories


def test_reset_is_deterministic() -> None:
    a, b = TabletopWorld(), TabletopWorld(seed=99)
    oa, ob = a.reset(7), b.reset(7)
    assert oa.instruction == ob.instruction
    np.testing.assert_array_equal(oa.state, ob.state)
    for cam in CAMERAS:
        np.testing.assert_array_equal(oa.images[cam], ob.images[cam])
    other = TabletopWorld().reset(8)
    assert not np.array_equal(other.images[CAMERAS[0]], oa.images[CAMERAS[0]])


def test_episodes_are_deterministic() -> None:
    sa, ma = _trajectory(3)
    sb, mb = _trajectory(3)
    assert ma == mb
    np.testing.assert_array_equal(np.stack(sa), np.stack(sb))


def test_expert_solves_its_tasks() -> None:
    world = TabletopWorld()
    results = [run_expert(world, seed) for seed in range(20)]
    assert np.mean(results) >= 0.95
    assert world.steps < world.config.max_steps


def test_memory_follows_the_task() -> None:
    world = TabletopWorld()
    _, memories = _trajectory(5)
    world.reset(5)
    s = world.state
    block, plate = s.block_colors[s.target_block], s.plate_colors[s.target_plate]
    assert world.instruction == f"put the {block} block on the {plate} plate"
    seen = list(dict.fromkeys(memories))  # distinct texts in order
    assert seen == [f"The {block} block is on the table.", f"The {block} block is in the gripper."]
    run_expert(world, 5)
    assert world.success and world.memory_text() == f"The {block} block is on the {plate} plate."


def test_subtask_names_the_goal() -> None:
    world = TabletopWorld()
    world.reset(5)
    s = world.state
    x, y = ((np.floor(s.block_xy[s.target_block] * 4) + 0.5) * 25 + 0.5).astype(int)  # its grid cell's centre
    assert expert_subtask(world) == f"pick up the {s.block_colors[s.target_block]} block at {x} {y}"
    run_expert(world, 5)
    assert expert_subtask(world) == "done"


def test_speed_limits_and_gripper() -> None:
    world = TabletopWorld()
    world.reset(0)
    start = world.joint_state.copy()
    world.apply(np.array([1.0, 1.0, 0.0, 1.0]))
    s = world.joint_state
    assert np.linalg.norm(s[:2] - start[:2]) == pytest.approx(world.config.xy_speed)
    assert s[2] == pytest.approx(1.0 - world.config.z_speed)
    assert s[3] == 1.0 and world.state.held == -1  # closed high above the table: nothing grasped
    assert world.steps == 1
    with pytest.raises(ValueError):
        world.apply(np.array([np.nan, 0.0, 0.0, 0.0]))


def test_step_applies_a_chunk_and_stops_when_done() -> None:
    world = TabletopWorld(WorldConfig(max_steps=5))
    world.reset(1)
    world.step(np.tile(world.joint_state, (8, 1)))
    assert world.steps == 5 and world.done and not world.success


@pytest.mark.parametrize("size", [32, 64, 96])
def test_rendering_shapes_and_ranges(size: int) -> None:
    world = TabletopWorld(WorldConfig(image_size=size))
    obs = world.reset(2)
    assert set(obs.images) == set(CAMERAS)
    for img in obs.images.values():
        assert img.shape == (size, size, 3) and img.dtype == np.uint8
        assert img.min() < 80 and img.max() > 150  # gripper is dark, table and objects are bright
    assert obs.state.shape == (len(JOINT_NAMES),) and obs.state.dtype == np.float32
    assert np.all((obs.state >= 0) & (obs.state <= 1))


def _has_color(img: np.ndarray, color: str) -> bool:
    return bool((np.abs(img.astype(int) - np.array(COLORS[color])).sum(-1) < 30).any())


def test_views_show_the_scene() -> None:
    world = TabletopWorld()
    world.reset(4)
    s = world.state
    target = s.block_colors[s.target_block]
    assert _has_color(world.render(CAMERAS[0]), target)
    # Above the block, low: the wrist camera sees it in the middle of its image.
    world.state.ee[:] = [*s.block_xy[s.target_block], 0.0]
    wrist = world.render(CAMERAS[1])
    c = wrist.shape[0] // 2
    assert _has_color(wrist[c - 3:c + 3, c - 3:c + 3], target)
    with pytest.raises(KeyError):
        world.render("right_wrist_0_rgb")


def test_sub_pixel_motion_changes_pixels() -> None:
    world = TabletopWorld()
    world.reset(6)
    before = world.render(CAMERAS[0])
    world.state.block_xy[0] += 0.003  # a fifth of a pixel at 64 px
    assert not np.array_equal(before, world.render(CAMERAS[0]))


def test_grid_layout_puts_objects_in_distinct_cells() -> None:
    cfg = WorldConfig()
    for seed in range(50):
        s = TabletopWorld(cfg, seed).state
        xy = np.concatenate([s.plate_xy, s.block_xy])
        cells = np.floor(xy * cfg.grid).astype(int)
        assert len({tuple(c) for c in cells}) == len(xy)  # one object per cell
        assert np.abs(xy - (cells + 0.5) / cfg.grid).max() <= cfg.jitter + 1e-12
        assert set(s.block_colors) <= set(cfg.block_palette) and set(s.plate_colors) <= set(cfg.plate_palette)


def test_scattered_layout_keeps_clearances() -> None:
    cfg = WorldConfig(grid=0, block_palette=("red", "green", "blue"), plate_palette=("blue", "yellow", "red"))
    for seed in range(50):
        w = TabletopWorld(cfg, seed)
        s = w.state
        assert np.linalg.norm(s.plate_xy[0] - s.plate_xy[1]) > 2 * cfg.plate_radius
        assert all(np.linalg.norm(b - p) > cfg.plate_radius for b in s.block_xy for p in s.plate_xy)
        assert run_expert(TabletopWorld(cfg), seed)
