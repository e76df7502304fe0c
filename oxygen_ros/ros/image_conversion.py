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
    "check_image_msg",
    "compressed_image_size",
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


def _data_length(data: Any) -> int:
    """Byte length of a message's ``data`` field without copying it."""
    if isinstance(data, np.ndarray):
        return int(data.nbytes) if data.dtype.itemsize == 1 else int(data.size)
    if isinstance(data, array.array):
        return len(data) * data.itemsize
    try:
        return len(data)
    except TypeError as exc:
        raise ImageError(f"image data is not a byte sequence: {type(data).__name__}") from exc


def check_image_msg(msg: Image) -> tuple[int, int, int, int]:
    """The cheap checks of a ``sensor_msgs/Image`` (sizes, encoding, step, data length; nothing is converted):
    returns ``(height, width, step, row_bytes)``.

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
    size = _data_length(msg.data)
    if size != step * height:
        what = "truncated" if size < step * height else "oversized"
        raise ImageError(f"image data {what}: {size} bytes, expected step * height = {step} * {height} = "
                         f"{step * height} ({width}x{height} {encoding})")
    return height, width, step, row_bytes


def image_msg_to_array(msg: Image) -> np.ndarray:
    """Decode a ``sensor_msgs/Image`` into a fresh RGB uint8 array [H, W, 3].

    Supports rgb8, bgr8, rgba8, bgra8 (alpha dropped), mono8/8UC1 and mono16/16UC1 (top 8 bits, grey
    replicated to 3 channels). Rows may be padded (``step`` > width * bytes per pixel).

    Raises:
        ImageError: zero sizes, unknown encoding, ``step`` too small, or ``data`` not ``step * height`` bytes.
    """
    height, width, step, row_bytes = check_image_msg(msg)
    encoding = str(msg.encoding)
    channels, dtype = _ENCODINGS[encoding]
    buf = _as_bytes_array(msg.data)
    if buf.size != step * height:  # data that is not a plain byte buffer (e.g. a list of ints)
        raise ImageError(f"image data has {buf.size} bytes, expected step * height = {step * height}")

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


_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame (not DHT, JPG, DAC)


def _jpeg_size(buf: np.ndarray) -> tuple[int, int] | None:
    """(width, height) from a JPEG's start-of-frame segment, walking the marker segments (no decoding)."""
    i, n = 2, buf.size
    while i + 4 <= n:
        if buf[i] != 0xFF:
            return None
        marker = int(buf[i + 1])
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # standalone markers
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame header
            return None
        length = int(buf[i + 2]) << 8 | int(buf[i + 3])
        if length < 2:
            return None
        if marker in _SOF_MARKERS:
            if i + 9 > n:
                return None
            height = int(buf[i + 5]) << 8 | int(buf[i + 6])
            width = int(buf[i + 7]) << 8 | int(buf[i + 8])
            return (width, height) if width and height else None
        i += 2 + length
    return None


def compressed_image_size(data: Any) -> tuple[int, int] | None:
    """(width, height) of a JPEG or PNG from its header alone (cheap: no pixel is decoded).

    Returns None for other formats (cv2.imdecode decides when the image is used).

    Raises:
        ImageError: a JPEG or PNG whose header is malformed or truncated.
    """
    buf = _as_bytes_array(data)
    if buf.size >= 2 and buf[0] == 0xFF and buf[1] == 0xD8:
        size = _jpeg_size(buf)
        if size is None:
            raise ImageError(f"malformed JPEG header ({buf.size} bytes, no frame header before the image data)")
        return size
    if buf.size >= 8 and buf[:8].tobytes() == b"\x89PNG\r\n\x1a\n":
        if buf.size < 24 or buf[12:16].tobytes() != b"IHDR":
            raise ImageError(f"malformed PNG header ({buf.size} bytes)")
        width, height = (int.from_bytes(buf[k:k + 4].tobytes(), "big") for k in (16, 20))
        if not width or not height:
            raise ImageError(f"PNG header has zero size ({width}x{height})")
        return width, height
    return None


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
