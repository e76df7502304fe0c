"""Object maps: which objects each image patch shows, the target of the training-only auxiliary loss on the vision
tokens.

A vision tower trained from scratch by the action loss alone barely moves: its image tokens start nearly alike, so the
action expert cannot tell patches apart, so no useful gradient reaches the tower (the expert learns the marginal
action distribution and ignores the images). PaliGemma's vision features come from pre-training; the toy recipe gets
its own, much smaller version: a linear probe on the image tokens (projector outputs) predicts, per patch, which
objects' centres lie in it (multi-label: a block of each colour, a plate of each colour, the gripper). The probe is
discarded after training; the saved checkpoint is plain pi0.5.
"""

from __future__ import annotations

import numpy as np

from oxygen_ros.toy.world import CAMERAS, TabletopWorld
from oxygen_ros.toy.world.render import COLORS

__all__ = ["OBJECT_CLASSES", "object_map", "object_maps"]

_COLOR_NAMES = tuple(COLORS)
OBJECT_CLASSES: tuple[str, ...] = (*(f"{c} block" for c in _COLOR_NAMES), *(f"{c} plate" for c in _COLOR_NAMES),
                                   "gripper")


def object_map(world: TabletopWorld, camera: str, patch_px: int) -> np.ndarray:
    """uint8 [patches, len(OBJECT_CLASSES)]: 1 where the object's centre falls into the patch (row-major patches of
    the camera's image at the world's image size)."""
    size = world.config.image_size
    grid = size // patch_px
    view = world.camera_view(camera, size)
    out = np.zeros((grid * grid, len(OBJECT_CLASSES)), np.uint8)
    s = world.state
    points = [(xy, _COLOR_NAMES.index(c)) for xy, c in zip(s.block_xy, s.block_colors, strict=True)]
    points += [(xy, len(_COLOR_NAMES) + _COLOR_NAMES.index(c)) for xy, c in zip(s.plate_xy, s.plate_colors,
                                                                                  strict=True)]
    points.append((s.ee[:2], len(OBJECT_CLASSES) - 1))
    for xy, cls in points:
        col, row = view.to_px(float(xy[0]), float(xy[1]))
        if 0.0 <= col < size and 0.0 <= row < size:
            out[int(row) // patch_px * grid + int(col) // patch_px, cls] = 1
    return out


def object_maps(world: TabletopWorld, patch_px: int) -> np.ndarray:
    """uint8 [cameras, patches, classes] for every camera in :data:`CAMERAS` order."""
    return np.stack([object_map(world, c, patch_px) for c in CAMERAS])
