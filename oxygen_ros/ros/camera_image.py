"""A camera's image as the node keeps it (:class:`CameraImage`: checked on arrival, decoded when a frame first uses
it, at most once), a camera's receive statistics (:class:`CameraStatus`) and the buffering constants the input store
and the observation builder share.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .image_conversion import ImageError, compressed_msg_to_array, image_msg_to_array

__all__ = ["CAMERA_BUFFER_DEPTH", "FUTURE_TOLERANCE_NS", "FUTURE_TOLERANCE_S", "RATE_WINDOW_S", "CameraImage",
           "CameraStatus"]

CAMERA_BUFFER_DEPTH = 4  # recent images kept per camera for synchronisation (~130 ms at 30 Hz)
FUTURE_TOLERANCE_S = 0.1  # images stamped further ahead of the node clock are rejected (image_from_future)
FUTURE_TOLERANCE_NS = int(FUTURE_TOLERANCE_S * 1e9)
RATE_WINDOW_S = 2.0  # window of the per-camera receive rate


@dataclass(frozen=True)
class CameraStatus:
    """One camera's receive statistics (for /diagnostics)."""

    name: str
    received: int  # messages that reached the node (accepted or rejected)
    rate_hz: float  # messages per second over the recent window
    last_arrival: float | None  # monotonic time of the newest message
    newest_stamp_ns: int | None  # header stamp of the newest accepted image


class CameraImage:
    """A validated camera message, decoded on first use (at most once).

    Cameras usually publish faster than the control rate and most images are never used, so arrival only runs
    the cheap checks (sizes, encoding, data length, a compressed image's header); :attr:`rgb` decodes the message
    the first time a control frame uses the image, and :meth:`pixels` converts it to model input once.
    """

    def __init__(self, msg: Any, compressed: bool, stamp_ns: int, received: float, camera: str = "") -> None:
        self._msg: Any = msg
        self.compressed = compressed
        self.stamp_ns = stamp_ns  # header stamp
        self.received = received  # monotonic arrival time (for latency)
        self.camera = camera
        self.error: ImageError | None = None  # set when decoding failed: the image is never used again
        self._rgb: np.ndarray | None = None
        self._pixels: np.ndarray | None = None
        self._lock = threading.Lock()

    @property
    def decoded(self) -> bool:
        return self._rgb is not None

    @property
    def converted(self) -> bool:
        return self._pixels is not None

    @property
    def rgb(self) -> np.ndarray:
        """uint8 [H, W, 3], decoded from the message on first access.

        Raises:
            ImageError: the data does not decode (also on every later access).
        """
        with self._lock:
            if self._rgb is None:
                if self.error is not None:
                    raise self.error
                try:
                    rgb = compressed_msg_to_array(self._msg) if self.compressed else image_msg_to_array(self._msg)
                    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8 or 0 in rgb.shape:
                        raise ImageError(f"not an RGB uint8 image: {rgb.dtype} {rgb.shape}")
                except ImageError as e:
                    self.error = e
                    raise
                self._rgb, self._msg = rgb, None  # the message's buffer is no longer needed
            return self._rgb

    def pixels(self, convert: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """float32 [3, S, S] in [-1, 1], converted by ``convert`` on first use."""
        if self._pixels is None:
            self._pixels = convert(self.rgb)
        return self._pixels
