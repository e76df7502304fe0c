"""A deterministic 2-D tabletop: coloured blocks and plates, a top-down end effector with a parallel gripper.

The table is the unit square. The robot state is four joint-like values in [0, 1] (:data:`JOINT_NAMES`): the
end effector's x, y, its height z (0 = at the table, 1 = fully raised) and the gripper (0 open, 1 closed). An
action is the next target of those four joints; the world moves towards it under speed limits, closes the gripper
when the command is above 0.5, grasps the block under the fingers when it closes low enough, and drops the held
block where it is when it opens. A task is "put the <colour> block on the <colour> plate"; it succeeds when that
block rests (released) on that plate. Objects start in distinct cells of a ``grid`` x ``grid`` table (one cell = one
16 px patch of the 64 px top view), a little off the cell centre; blocks and plates take colours from their own
palettes, so every scene holds a red and a green block, a blue and a yellow plate (``grid=0`` and wider palettes give
free layouts and colour clashes, a harder world than the toy model is trained for).

Everything is a pure function of the seed and the actions, so a ROS node can wrap it: ``reset(seed)``,
``observation()`` (camera images + joint state), ``step(chunk)``, ``instruction``, ``success``, ``memory_text()``;
narration and answers to questions are functions of the world in :mod:`.language`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from .render import COLORS, FLOOR_RGB, GRIPPER_RGB, TABLE_RGB, Canvas, View

__all__ = ["CAMERAS", "JOINT_NAMES", "TabletopWorld", "WorldConfig", "WorldObservation", "WorldState"]

CAMERAS: tuple[str, ...] = ("base_0_rgb", "left_wrist_0_rgb")  # top view, wrist view (pi0.5 camera slots)
JOINT_NAMES: tuple[str, ...] = ("ee_x", "ee_y", "ee_z", "gripper")
COLOR_NAMES: tuple[str, ...] = tuple(COLORS)


@dataclass(frozen=True)
class WorldConfig:
    """Scene size, geometry (world units: the table is 1 x 1) and speed limits (per step)."""

    image_size: int = 64
    num_blocks: int = 2
    num_plates: int = 2
    max_steps: int = 120
    xy_speed: float = 0.06
    z_speed: float = 0.25
    block_half: float = 0.045
    plate_radius: float = 0.1
    grasp_radius: float = 0.045
    grasp_height: float = 0.15
    wrist_half_width: tuple[float, float] = (0.1, 0.25)  # wrist camera field (half width) at z = 0 and z = 1
    block_palette: tuple[str, ...] = ("red", "green")  # colours blocks are drawn from (see render.COLORS)
    plate_palette: tuple[str, ...] = ("blue", "yellow")  # colours plates are drawn from
    grid: int = 4  # blocks and plates start in distinct cells of a grid x grid table (0: anywhere, with clearances)
    jitter: float = 0.01  # largest offset of an object from its cell centre


@dataclass
class WorldState:
    """Everything that changes; ``held`` is the index of the block in the gripper or -1."""

    block_colors: tuple[str, ...]
    plate_colors: tuple[str, ...]
    block_xy: np.ndarray  # [num_blocks, 2]
    plate_xy: np.ndarray  # [num_plates, 2]
    ee: np.ndarray  # [3] x, y, z
    closed: bool
    held: int
    held_offset: np.ndarray  # [2] block centre minus end effector while held
    target_block: int
    target_plate: int
    steps: int = 0


@dataclass
class WorldObservation:
    """What a robot's sensors give: one RGB uint8 [S, S, 3] image per camera and the joint positions."""

    images: dict[str, np.ndarray]
    state: np.ndarray  # float32 [4] in JOINT_NAMES order
    instruction: str
    step: int


class TabletopWorld:
    """The simulator. ``reset(seed)`` lays out a new scene; everything after it is deterministic."""

    def __init__(self, config: WorldConfig | None = None, seed: int = 0) -> None:
        self.config = config or WorldConfig()
        self.state = self._layout(seed)
        self.seed = seed

    # ------------------------------------------------------------------------------------------ episode
    def reset(self, seed: int) -> WorldObservation:
        """Lay out the scene of ``seed`` and return the first observation."""
        self.seed = seed
        self.state = self._layout(seed)
        return self.observation()

    def _layout(self, seed: int) -> WorldState:
        cfg = self.config
        rng = np.random.default_rng(seed)
        block_colors = tuple(rng.choice(cfg.block_palette, cfg.num_blocks, replace=False).tolist())
        plate_colors = tuple(rng.choice(cfg.plate_palette, cfg.num_plates, replace=False).tolist())
        if cfg.grid:
            cells = rng.choice(cfg.grid * cfg.grid, cfg.num_plates + cfg.num_blocks, replace=False)
            centres = (np.stack([cells % cfg.grid, cells // cfg.grid], 1) + 0.5) / cfg.grid
            xy = centres + rng.uniform(-cfg.jitter, cfg.jitter, centres.shape)
            plates, blocks = list(xy[:cfg.num_plates]), list(xy[cfg.num_plates:])
        else:
            plates, blocks = self._scatter(rng)
        ee = np.array([*rng.uniform(0.2, 0.8, 2), 1.0])
        return WorldState(
            block_colors, plate_colors, np.array(blocks), np.array(plates), ee, False, -1, np.zeros(2),
            int(rng.integers(cfg.num_blocks)), int(rng.integers(cfg.num_plates)),
        )

    def _scatter(self, rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Plate and block centres anywhere on the table, by rejection sampling with clearances."""
        cfg = self.config
        plates: list[np.ndarray] = []
        blocks: list[np.ndarray] = []
        r = cfg.plate_radius
        while len(plates) < cfg.num_plates:
            p = rng.uniform(0.1 + r, 0.9 - r, 2)
            if all(np.linalg.norm(p - q) > 2 * r + 0.06 for q in plates):
                plates.append(p)
        while len(blocks) < cfg.num_blocks:
            b = rng.uniform(0.12, 0.88, 2)
            if all(np.linalg.norm(b - p) > r + 0.07 for p in plates) and all(
                np.linalg.norm(b - q) > 0.15 for q in blocks
            ):
                blocks.append(b)
        return plates, blocks

    def clone(self) -> TabletopWorld:
        """An independent copy (the expert plans by simulating one)."""
        return copy.deepcopy(self)

    # ------------------------------------------------------------------------------------------ queries
    @property
    def instruction(self) -> str:
        """The task in words, e.g. "put the red block on the blue plate"."""
        s = self.state
        return f"put the {s.block_colors[s.target_block]} block on the {s.plate_colors[s.target_plate]} plate"

    @property
    def joint_state(self) -> np.ndarray:
        """float32 [4]: x, y, z, gripper (1.0 closed) in [0, 1]."""
        s = self.state
        return np.array([*s.ee, float(s.closed)], dtype=np.float32)

    @property
    def steps(self) -> int:
        """Actions applied since reset."""
        return self.state.steps

    def plate_under(self, block: int) -> int:
        """Index of the plate a resting block's centre lies on, or -1 (table, or the block is held)."""
        s = self.state
        if s.held == block:
            return -1
        d = np.linalg.norm(s.plate_xy - s.block_xy[block], axis=1)
        i = int(np.argmin(d))
        return i if d[i] <= self.config.plate_radius else -1

    @property
    def success(self) -> bool:
        """The target block rests, released, on the target plate."""
        return self.plate_under(self.state.target_block) == self.state.target_plate

    @property
    def done(self) -> bool:
        """Succeeded or out of steps."""
        return self.success or self.state.steps >= self.config.max_steps

    def memory_text(self) -> str:
        """Ground-truth memory of the target block, e.g. "The red block is in the gripper."."""
        s = self.state
        color = s.block_colors[s.target_block]
        if s.held == s.target_block:
            return f"The {color} block is in the gripper."
        plate = self.plate_under(s.target_block)
        where = "table" if plate < 0 else f"{s.plate_colors[plate]} plate"
        return f"The {color} block is on the {where}."

    # ------------------------------------------------------------------------------------------ dynamics
    def apply(self, action: np.ndarray) -> None:
        """One control step towards ``action`` = target (x, y, z, gripper) within the speed limits."""
        cfg, s = self.config, self.state
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        if a.shape[0] < 4 or not np.all(np.isfinite(a[:4])):
            raise ValueError(f"action must hold 4 finite values (x, y, z, gripper), got {a}")
        delta = np.clip(a[:2], 0.0, 1.0) - s.ee[:2]
        dist = float(np.linalg.norm(delta))
        if dist > cfg.xy_speed:
            delta *= cfg.xy_speed / dist
        s.ee[:2] += delta
        s.ee[2] += np.clip(np.clip(a[2], 0.0, 1.0) - s.ee[2], -cfg.z_speed, cfg.z_speed)
        close = bool(a[3] > 0.5)
        if close and not s.closed:
            s.closed = True
            self._grasp()
        elif not close and s.closed:
            s.closed = False
            s.held = -1
        if s.held >= 0:
            s.block_xy[s.held] = s.ee[:2] + s.held_offset
        s.steps += 1

    def _grasp(self) -> None:
        cfg, s = self.config, self.state
        if s.ee[2] > cfg.grasp_height:
            return
        d = np.linalg.norm(s.block_xy - s.ee[:2], axis=1)
        i = int(np.argmin(d))
        if d[i] <= cfg.grasp_radius:
            s.held = i
            s.held_offset = s.block_xy[i] - s.ee[:2]

    def step(self, actions: np.ndarray) -> None:
        """Apply an action chunk [H, 4] (or one action [4]) in order, stopping early when the episode is done."""
        a = np.asarray(actions, dtype=np.float64)
        for row in a.reshape(-1, a.shape[-1]):
            if self.done:
                break
            self.apply(row)

    # ------------------------------------------------------------------------------------------ sensing
    def observation(self) -> WorldObservation:
        """Camera images (see :data:`CAMERAS`) and joint state at the current step."""
        return WorldObservation({c: self.render(c) for c in CAMERAS}, self.joint_state, self.instruction,
                                self.state.steps)

    def camera_view(self, camera: str, size: int | None = None) -> View:
        """Where ``camera`` looks now ("base_0_rgb": the whole table from above; "left_wrist_0_rgb": down from the
        gripper, the field of view widening with height) at ``size`` px."""
        size = size or self.config.image_size
        s = self.state
        if camera == CAMERAS[0]:
            return View(0.0, 0.0, float(size), size)
        if camera == CAMERAS[1]:
            lo, hi = self.config.wrist_half_width
            return View.centered(s.ee[0], s.ee[1], lo + (hi - lo) * s.ee[2], size)
        raise KeyError(f"unknown camera {camera!r}; known: {CAMERAS}")

    def render(self, camera: str, size: int | None = None) -> np.ndarray:
        """RGB uint8 [size, size, 3] from ``camera`` (see :meth:`camera_view`)."""
        size = size or self.config.image_size
        cfg, s = self.config, self.state
        view = self.camera_view(camera, size)
        hand = 1.0 + 0.5 * s.ee[2] if camera == CAMERAS[0] else 0.0  # top view: the hand grows with height
        canvas = Canvas(size, FLOOR_RGB)
        canvas.world_rect(view, 0.0, 0.0, 1.0, 1.0, TABLE_RGB)
        for xy, color in zip(s.plate_xy, s.plate_colors, strict=True):
            rgb = np.asarray(COLORS[color], np.float32)
            canvas.world_disc(view, *xy, cfg.plate_radius, 0.55 * rgb + 0.45 * 255)
            canvas.world_disc(view, *xy, cfg.plate_radius * 0.75, 0.75 * rgb + 0.25 * 255)
        canvas.world_disc(view, s.ee[0], s.ee[1], 0.03, (0, 0, 0), opacity=0.2)  # gripper shadow on the table
        for i, (xy, color) in enumerate(zip(s.block_xy, s.block_colors, strict=True)):
            if i != s.held:
                self._draw_block(canvas, view, xy, COLORS[color], 1.0)
        # The hand (held block + fingers): in the top view it grows with height; the wrist camera rides on it.
        hand_view = view if hand else View.centered(s.ee[0], s.ee[1], cfg.wrist_half_width[0], size)
        scale = hand or 1.0
        if s.held >= 0:
            self._draw_block(canvas, hand_view, s.ee[:2] + s.held_offset * scale, COLORS[s.block_colors[s.held]],
                             scale)
        spread = (cfg.block_half + 0.008) if s.closed else 0.065
        for side in (-1.0, 1.0):
            fx = s.ee[0] + side * spread * scale
            canvas.world_rect(hand_view, fx - 0.009 * scale, s.ee[1] - 0.03 * scale, fx + 0.009 * scale,
                              s.ee[1] + 0.03 * scale, GRIPPER_RGB)
        canvas.world_rect(hand_view, s.ee[0] - spread * scale, s.ee[1] - 0.034 * scale, s.ee[0] + spread * scale,
                          s.ee[1] - 0.026 * scale, GRIPPER_RGB)
        return canvas.to_uint8()

    def _draw_block(self, canvas: Canvas, view: View, c: np.ndarray, color, scale: float) -> None:
        h = self.config.block_half * scale
        canvas.world_rect(view, c[0] - h, c[1] - h, c[0] + h, c[1] + h, tuple(0.6 * v for v in color))
        e = 0.006 * scale  # darker rim, lighter face
        canvas.world_rect(view, c[0] - h + e, c[1] - h + e, c[0] + h - e, c[1] + h - e, color)
