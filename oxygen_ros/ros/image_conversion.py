"""Camera messages to model input: decode ROS images to RGB uint8, then resize-with-pad and normalise.

Pure functions (no node). Messages are duck-typed: rclpy messages (``data`` is an ``array.array``) and
rosbags-deserialised messages (``data`` is a numpy array) both work.
"""

from __future__ import annotations

import array
from typing import Any

import cv2
import numpy as np
from sensor_msgs.msg import Image

from .stamps import to_time_msg

__all__ = [
    "SUPPORTED_ENCODINGS",
    "ImageError",
    "array_to_image_msg",
    "compressed_msg_to_array",
    "image_msg_to_array",
]


class ImageError(ValueError):
    """An image message that cannot be turned into an RGB array (bad sizes, data or encoding)."""


# encoding -> (channels, dtype); 16-bit images are scaled to 8 bits (value >> 8).
_ENCODINGS: dict[str, tuple[int, np.dtype]] = {
    "rgb8": (3, np.dtype(np.uint8)),
    "bgr8": (3, np.dtype(np.uint8)),
    "rgba8": (4, np.dtype(np.uint8)),
    "bgra8": (4, np.dtype(np.uint8)),
    "mono8": (1, np.dtype(np.uint8)),
    "8UC1": (1, np.dtype(np.uint8)),
    "mono16": (1, np.dtype(np.uint16)),
    "16UC1": (1, np.dtype(np.uint16)),
}
SUPPORTED_ENCODINGS: tuple[str, ...] = tuple(_ENCODINGS)
_TO_RGB = {"bgr8": cv2.COLOR_BGR2RGB, "rgba8": cv2.COLOR_RGBA2RGB, "bgra8": cv2.COLOR_BGRA2RGB}
_TO_RGB.update(dict.fromkeys(("mono8", "8UC1", "mono16", "16UC1"), cv2.COLOR_GRAY2RGB))


def _as_bytes_array(data: Any) -> np.ndarray:
    """View a message's ``data`` field (array.array, bytes, list or ndarray) as a flat uint8 array."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8) if data.dtype.itemsize == 1 else data.astype(np.uint8).reshape(-1)
    if isinstance(data, (bytes, bytearray, memoryview, array.array)):
        return np.frombuffer(data, dtype=np.uint8)
    try:
        return np.asarray(data, dtype=np.uint8).reshape(-1)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ImageError(f"image data is not a byte sequence: {type(data).__name__}") from exc


def image_msg_to_array(msg: Image) -> np.ndarray:
    """Decode a ``sensor_msgs/Image`` into a fresh RGB uint8 array [H, W, 3].

    Supports rgb8, bgr8, rgba8, bgra8 (alpha dropped), mono8/8UC1 and mono16/16UC1 (top 8 bits, grey
    replicated to 3 channels). Rows may be padded (``step`` > width * bytes per pixel).

    Raises:
        ImageError: zero sizes, unknown encoding, ``step`` too small, or ``data`` not ``step * height`` bytes.
    """
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    encoding = str(msg.encoding)
    if height <= 0 or width <= 0:
        raise ImageError(f"image has zero size ({width}x{height})")
    if encoding not in _ENCODINGS:
        raise ImageError(f"unsupported image encoding {encoding!r}; supported: {', '.join(SUPPORTED_ENCODINGS)}")
    channels, dtype = _ENCODINGS[encoding]
    row_bytes = width * channels * dtype.itemsize
    if step < row_bytes:
        raise ImageError(f"step {step} is smaller than width * bytes per pixel = {width} * "
                         f"{channels * dtype.itemsize} = {row_bytes} ({encoding})")
    buf = _as_bytes_array(msg.data)
    if buf.size != step * height:
        what = "truncated" if buf.size < step * height else "oversized"
        raise ImageError(f"image data {what}: {buf.size} bytes, expected step * height = {step} * {height} = "
                         f"{step * height} ({width}x{height} {encoding})")

    rows = buf.reshape(height, step)[:, :row_bytes]
    if dtype.itemsize == 1:
        pixels = rows.reshape(height, width, channels)
    else:
        big_endian = bool(msg.is_bigendian)
        wide = np.ascontiguousarray(rows).view(dtype.newbyteorder(">" if big_endian else "<"))
        pixels = (wide >> 8).astype(np.uint8).reshape(height, width, 1)

    if encoding == "rgb8":
        return np.array(pixels, order="C", copy=True)  # never a view of the message buffer
    # cv2.cvtColor copies, honours padded rows, and is several times faster than numpy channel shuffles
    return cv2.cvtColor(pixels, _TO_RGB[encoding])


def compressed_msg_to_array(msg: Any) -> np.ndarray:
    """Decode a ``sensor_msgs/CompressedImage`` (jpeg, png, ... anything cv2.imdecode reads) to RGB uint8.

    Raises:
        ImageError: empty or undecodable data.
    """
    buf = _as_bytes_array(msg.data)
    if buf.size == 0:
        raise ImageError(f"compressed image is empty (format {msg.format!r})")
    try:
        bgr = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    except cv2.error as exc:
        raise ImageError(f"cannot decode compressed image (format {msg.format!r}): {exc}") from exc
    if bgr is None or bgr.size == 0:
        raise ImageError(f"cannot decode compressed image (format {msg.format!r}, {buf.size} bytes)")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def _check_rgb(rgb: np.ndarray) -> None:
    if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        shape = getattr(rgb, "shape", None)
        raise ImageError(f"expected an RGB uint8 array [H, W, 3], got {getattr(rgb, 'dtype', type(rgb))} {shape}")
    if rgb.shape[0] == 0 or rgb.shape[1] == 0:
        raise ImageError(f"image has zero size {rgb.shape}")


def array_to_image_msg(rgb: np.ndarray, stamp: Any = None, frame_id: str = "") -> Image:
    """RGB uint8 [H, W, 3] -> ``sensor_msgs/Image`` (rgb8), built by hand (cv_bridge fails under numpy 2).

    ``stamp`` is a builtin_interfaces Time, an rclpy Time, integer nanoseconds or None (zero).
    """
    _check_rgb(rgb)
    msg = Image()
    msg.header.stamp = to_time_msg(stamp)
    msg.header.frame_id = frame_id
    msg.height, msg.width = int(rgb.shape[0]), int(rgb.shape[1])
    msg.encoding = "rgb8"
    msg.is_bigendian = 0
    msg.step = msg.width * 3
    msg.data = array.array("B", np.ascontiguousarray(rgb).tobytes())  # bytes initialiser: a fast copy
    return msg
