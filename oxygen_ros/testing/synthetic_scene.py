"""A deterministic synthetic table-top scene for demos, bags and tests (numpy only, ~1 ms per 224x224 frame).

A red block travels back and forth between its start and a blue plate, followed by a gripper; a green and a
yellow block drift slowly. Each camera name is a viewpoint: ``base_0_rgb`` looks at the whole table, the wrist
cameras follow the gripper zoomed in (the right one upside down), other names get a viewpoint derived from the
name. Everything is a pure function of (t, camera, size, seed). :func:`joint_state` gives matching joint positions
as plain floats (the ROS message is built by :class:`oxygen_ros.testing.Probe`).

Unlike :class:`oxygen_ros.toy.world.TabletopWorld` nothing here reacts to actions: it is a timing and plumbing stream
(the synthetic demo scene, demo bags, node tests), not a task.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = ["DEFAULT_CAMERAS", "SCENE_PERIOD_S", "joint_state", "render_scene"]

DEFAULT_CAMERAS: tuple[str, ...] = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
SCENE_PERIOD_S = 8.0  # one pick-and-place round trip

_RED, _BLUE, _GREEN, _YELLOW = (200, 30, 30), (40, 70, 200), (40, 160, 60), (220, 200, 40)
_GRIPPER = (45, 45, 50)
_WORLD_MIN, _WORLD_SPAN = -0.5, 2.0  # the texture covers world [-0.5, 1.5]^2; the table is [0, 1]^2


@dataclass(frozen=True)
class _View:
    zoom: float  # image widths per world unit
    offset: tuple[float, float]  # camera centre relative to its anchor
    follow_gripper: bool
    flip: bool


def _view(camera: str) -> _View:
    if camera.startswith("base"):
        return _View(0.85, (0.0, 0.0), False, False)
    if camera.startswith("left_wrist"):
        return _View(3.0, (-0.05, 0.02), True, False)
    if camera.startswith("right_wrist"):
        return _View(3.0, (0.05, 0.02), True, True)
    h = zlib.crc32(camera.encode())  # stable across processes, unlike hash()
    return _View(1.2 + (h % 7) * 0.2, (((h >> 3) % 21 - 10) / 50, ((h >> 8) % 21 - 10) / 50), False, bool(h & 1))


@lru_cache(maxsize=16)
def _texture(ppu: int, seed: int) -> np.ndarray:
    """Floor and wooden table covering world [-0.5, 1.5]^2 at ``ppu`` pixels per world unit (read-only)."""
    n = int(_WORLD_SPAN * ppu)
    rng = np.random.default_rng(seed)
    coords = (np.arange(n, dtype=np.float32) + 0.5) / ppu + _WORLD_MIN
    y, x = coords[:, None], coords[None, :]
    grain = 0.5 + 0.5 * np.sin(y * 90.0 + 3.0 * np.sin(x * 7.0 + seed))
    noise = rng.normal(0.0, 6.0, (n, n)).astype(np.float32)
    table = (np.array([150, 105, 65], np.float32) + grain[..., None] * np.array([25, 18, 10], np.float32)
             + noise[..., None])
    floor = np.array([70, 70, 75], np.float32) + noise[..., None] * 0.5
    on_table = ((x >= 0) & (x <= 1) & (y >= 0) & (y <= 1))[..., None]
    tex = np.clip(np.where(on_table, table, floor), 0, 255).astype(np.uint8)
    tex.flags.writeable = False
    return tex


def _smooth(t: float, period: float) -> float:
    """0 -> 1 -> 0 over one period, smooth (raised cosine)."""
    return 0.5 - 0.5 * math.cos(2.0 * math.pi * t / period)


def _layout(t: float, seed: int) -> dict[str, tuple[float, float]]:
    """World positions (x, y) of the scene's objects at time t."""
    rng = np.random.default_rng(seed + 1)
    jitter = rng.uniform(-0.05, 0.05, 8)
    start = (0.28 + jitter[0], 0.35 + jitter[1])
    plate = (0.70 + jitter[2], 0.62 + jitter[3])
    s = _smooth(t, SCENE_PERIOD_S)
    red = (start[0] + s * (plate[0] - start[0]), start[1] + s * (plate[1] - start[1]))
    green = (0.25 + jitter[4] + 0.04 * math.sin(0.5 * t), 0.75 + jitter[5])
    yellow = (0.78 + jitter[6], 0.22 + jitter[7] + 0.03 * math.sin(0.7 * t + 1.0))
    lead = 0.02 * math.sin(2.0 * math.pi * t / SCENE_PERIOD_S)  # the gripper slightly leads the block
    return {"plate": plate, "red": red, "green": green, "yellow": yellow, "gripper": (red[0] + lead, red[1] - 0.01)}


def _box(img: np.ndarray, cx: float, cy: float, half: float, color, shadow: bool = True) -> None:
    """Fill a square of half-size ``half`` pixels centred at pixel (cx, cy), with a drop shadow."""
    h, w = img.shape[:2]
    if shadow:
        d = max(1.0, half * 0.3)
        y0, y1 = max(0, int(cy - half + d)), min(h, int(cy + half + d))
        x0, x1 = max(0, int(cx - half + d)), min(w, int(cx + half + d))
        if y1 > y0 and x1 > x0:
            img[y0:y1, x0:x1] >>= 1
    y0, y1 = max(0, int(cy - half)), min(h, int(cy + half))
    x0, x1 = max(0, int(cx - half)), min(w, int(cx + half))
    if y1 > y0 and x1 > x0:
        img[y0:y1, x0:x1] = color
        edge = max(1, int(half * 0.15))  # lit top edge
        img[y0:min(y1, y0 + edge), x0:x1] = tuple(min(255, c + 40) for c in color)


def _disk(img: np.ndarray, cx: float, cy: float, r: float, color) -> None:
    h, w = img.shape[:2]
    y0, y1 = max(0, int(cy - r)), min(h, int(cy + r) + 1)
    x0, x1 = max(0, int(cx - r)), min(w, int(cx + r) + 1)
    if y1 <= y0 or x1 <= x0:
        return
    yy, xx = np.ogrid[y0:y1, x0:x1]
    mask = (yy + 0.5 - cy) ** 2 + (xx + 0.5 - cx) ** 2 <= r * r
    img[y0:y1, x0:x1][mask] = color


def render_scene(t: float, camera: str = "base_0_rgb", size: int = 224, seed: int = 0) -> np.ndarray:
    """The scene at time ``t`` seconds seen by ``camera``: a fresh uint8 RGB array [size, size, 3]."""
    if size <= 0:
        raise ValueError(f"size must be positive, got {size}")
    view = _view(camera)
    ppu = max(1, round(size * view.zoom))
    tex = _texture(ppu, seed)
    objs = _layout(t, seed)
    anchor = objs["gripper"] if view.follow_gripper else (0.5, 0.5)
    cam_x, cam_y = anchor[0] + view.offset[0], anchor[1] + view.offset[1]
    limit = tex.shape[0] - size
    x0 = min(max(0, round((cam_x - _WORLD_MIN) * ppu - size / 2)), limit)
    y0 = min(max(0, round((cam_y - _WORLD_MIN) * ppu - size / 2)), limit)
    img = tex[y0:y0 + size, x0:x0 + size].copy()

    def px(p: tuple[float, float]) -> tuple[float, float]:
        return (p[0] - _WORLD_MIN) * ppu - x0, (p[1] - _WORLD_MIN) * ppu - y0

    _disk(img, *px(objs["plate"]), 0.09 * ppu, _BLUE)
    for name, color in (("green", _GREEN), ("yellow", _YELLOW), ("red", _RED)):
        _box(img, *px(objs[name]), 0.04 * ppu, color)
    if view.follow_gripper:  # fingers in the foreground of the wrist camera
        fw, fh = max(1, size // 10), size // 3
        img[size - fh:, :fw] = _GRIPPER
        img[size - fh:, size - fw:] = _GRIPPER
    else:  # the gripper seen from above: two fingers around the red block
        gx, gy = px(objs["gripper"])
        open_ = 0.06 * ppu * (1.0 - 0.4 * _smooth(t, SCENE_PERIOD_S))
        for side in (-1, 1):
            _box(img, gx + side * open_, gy, 0.015 * ppu, _GRIPPER, shadow=False)
    if view.flip:
        img = np.ascontiguousarray(img[::-1, ::-1])
    return img


def joint_state(t: float, names: list[str] | tuple[str, ...]) -> np.ndarray:
    """Smooth joint positions at time ``t`` (float64, one per name): arm joints in radians, any joint whose
    name contains "gripper" in [0, 1] (1 = open), in step with the scene's pick-and-place cycle."""
    out = np.empty(len(names), dtype=np.float64)
    for i, name in enumerate(names):
        if "gripper" in name.lower():
            out[i] = 1.0 - _smooth(t, SCENE_PERIOD_S)
            continue
        h = zlib.crc32(name.encode())
        base = ((h % 1000) / 1000.0 - 0.5) * 1.5
        amp = 0.2 + ((h >> 10) % 100) / 250.0
        period = SCENE_PERIOD_S / (1 + (h >> 17) % 3)
        phase = ((h >> 20) % 628) / 100.0 + 0.3 * i
        out[i] = base + amp * math.sin(2.0 * math.pi * t / period + phase)
    return out
