"""The scripted expert: a feedback policy of the world state, and the action chunks it would execute.

Because every action is a function of the current state only, the expert can label any state, including the
ones a perturbed or learned policy drives the world into (DART-style data collection).
"""

from __future__ import annotations

import numpy as np

from .tabletop import TabletopWorld

__all__ = ["expert_action", "expert_chunk", "expert_subtask", "run_expert"]


def expert_action(world: TabletopWorld) -> np.ndarray:
    """Next target (x, y, z, gripper): the goal's x, y (the world's speed limit makes the path); raised until the
    goal is within one step, then down; at the table, grasp or release."""
    cfg, s = world.config, world.state
    x, y, z = (float(v) for v in s.ee)
    if world.success:
        return np.array([x, y, 1.0, 0.0])
    if s.held >= 0 and s.held != s.target_block or s.closed and s.held < 0:
        return np.array([x, y, z, 0.0])  # holding the wrong block, or a missed grasp: open the gripper
    holding = s.held == s.target_block
    goal = s.plate_xy[s.target_plate] - s.held_offset if holding else s.block_xy[s.target_block]
    if float(np.linalg.norm(goal - s.ee[:2])) > cfg.xy_speed + 1e-9:  # not above the goal after this step
        return np.array([*goal, 1.0, float(s.closed)])
    if z > 1e-9:  # above the goal: descend
        return np.array([*goal, 0.0, float(s.closed)])
    return np.array([*goal, 0.0, 0.0 if holding else 1.0])  # at the goal: release or grasp


def expert_subtask(world: TabletopWorld) -> str:
    """The expert's current subtask with its goal in table percent, e.g. "pick up the red block at 12 85"
    (pi0.5-style high-level text; the training recipe co-trains on it to ground colours to positions)."""
    s = world.state
    if world.success:
        return "done"
    if s.held == s.target_block:
        x, y = np.clip(np.round(s.plate_xy[s.target_plate] * 100), 0, 99).astype(int)
        return f"put it on the {s.plate_colors[s.target_plate]} plate at {x} {y}"
    x, y = np.clip(np.round(s.block_xy[s.target_block] * 100), 0, 99).astype(int)
    return f"pick up the {s.block_colors[s.target_block]} block at {x} {y}"


def expert_chunk(world: TabletopWorld, horizon: int) -> np.ndarray:
    """The expert's next ``horizon`` actions [H, 4], planned on a copy of the world (float32)."""
    sim = world.clone()
    out = np.empty((horizon, 4), dtype=np.float32)
    for i in range(horizon):
        out[i] = expert_action(sim)
        sim.apply(out[i])
    return out


def run_expert(world: TabletopWorld, seed: int, horizon: int = 8) -> bool:
    """Reset to ``seed`` and execute expert chunks until the episode ends; True on success."""
    world.reset(seed)
    while not world.done:
        world.step(expert_chunk(world, horizon))
    return world.success
