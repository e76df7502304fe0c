"""Numpy drawing of the tabletop from a camera: anti-aliased rectangles and discs, no graphics library.

Coverage is analytic (box filter for axis-aligned rectangles, a one-pixel ramp for discs), so sub-pixel positions
show up in the pixel values and a render at one size resized to another stays close to a direct render.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["COLORS", "Canvas", "View"]

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (215, 40, 40),
    "green": (40, 165, 60),
    "blue": (45, 85, 220),
    "yellow": (235, 200, 35),
}
TABLE_RGB = (205, 192, 168)
FLOOR_RGB = (60, 60, 66)
GRIPPER_RGB = (35, 35, 40)


@dataclass(frozen=True)
class View:
    """A top-down camera: world point ``(x0, y0)`` maps to pixel (0, 0); ``scale`` pixels per world unit."""

    x0: float
    y0: float
    scale: float
    size: int

    @staticmethod
    def centered(cx: float, cy: float, half_width: float, size: int) -> View:
        """A view of the square [cx - half_width, cx + half_width] x [cy - half_width, cy + half_width]."""
        return View(cx - half_width, cy - half_width, size / (2.0 * half_width), size)

    def to_px(self, x: float, y: float) -> tuple[float, float]:
        """World (x, y) -> pixel (column, row) in continuous coordinates (pixel i spans [i, i + 1))."""
        return (x - self.x0) * self.scale, (y - self.y0) * self.scale


def _overlap(lo: float, hi: float, n: int) -> np.ndarray:
    """Length of [lo, hi) inside each unit pixel interval [i, i + 1), i = 0..n-1."""
    edges = np.arange(n, dtype=np.float32)
    return np.clip(np.minimum(edges + 1.0, hi) - np.maximum(edges, lo), 0.0, 1.0)


class Canvas:
    """A float RGB image drawn in pixel coordinates; :meth:`to_uint8` gives the final picture."""

    def __init__(self, size: int, background: tuple[int, int, int]) -> None:
        self.size = size
        self.rgb = np.empty((size, size, 3), dtype=np.float32)
        self.rgb[:] = background

    def _blend(self, r0: int, c0: int, alpha: np.ndarray, color, opacity: float) -> None:
        """Composite ``color`` with coverage ``alpha`` onto the block of pixels starting at (r0, c0)."""
        a = alpha[..., None] * np.float32(opacity)
        block = self.rgb[r0:r0 + alpha.shape[0], c0:c0 + alpha.shape[1]]
        block += a * (np.asarray(color, dtype=np.float32) - block)

    def _span(self, lo: float, hi: float) -> tuple[int, int]:
        return max(0, int(np.floor(lo))), min(self.size, int(np.ceil(hi)))

    def rect(self, c0: float, r0: float, c1: float, r1: float, color, opacity: float = 1.0) -> None:
        """Fill the pixel-space rectangle [c0, c1) x [r0, r1) (exact area coverage)."""
        (i0, i1), (j0, j1) = self._span(r0, r1), self._span(c0, c1)
        if i1 <= i0 or j1 <= j0:
            return
        self._blend(i0, j0, np.outer(_overlap(r0 - i0, r1 - i0, i1 - i0), _overlap(c0 - j0, c1 - j0, j1 - j0)),
                    color, opacity)

    def disc(self, col: float, row: float, radius: float, color, opacity: float = 1.0) -> None:
        """Fill a disc centred at pixel (col, row) with a one-pixel anti-aliased edge."""
        (i0, i1), (j0, j1) = self._span(row - radius - 1, row + radius + 1), self._span(col - radius - 1,
                                                                                       col + radius + 1)
        if i1 <= i0 or j1 <= j0:
            return
        rows = np.arange(i0, i1, dtype=np.float32)[:, None] + 0.5 - row
        cols = np.arange(j0, j1, dtype=np.float32)[None, :] + 0.5 - col
        self._blend(i0, j0, np.clip(radius - np.sqrt(rows * rows + cols * cols) + 0.5, 0.0, 1.0), color, opacity)

    def to_uint8(self) -> np.ndarray:
        """The picture as uint8 [size, size, 3]."""
        return np.clip(self.rgb + 0.5, 0, 255).astype(np.uint8)

    # --------------------------------------------------------------------------------------- world-space helpers
    def world_rect(self, view: View, x0: float, y0: float, x1: float, y1: float, color, opacity: float = 1.0):
        """Fill the world-space rectangle [x0, x1] x [y0, y1] seen through ``view``."""
        c0, r0 = view.to_px(x0, y0)
        c1, r1 = view.to_px(x1, y1)
        self.rect(c0, r0, c1, r1, color, opacity)

    def world_disc(self, view: View, x: float, y: float, radius: float, color, opacity: float = 1.0) -> None:
        """Fill a world-space disc seen through ``view``."""
        col, row = view.to_px(x, y)
        self.disc(col, row, radius * view.scale, color, opacity)
