"""openpi's wire format: msgpack, with numpy arrays and scalars as maps of bytes keys.

An array is ``{b"__ndarray__": True, b"data": raw C-order bytes, b"dtype": dtype.str, b"shape": shape}``, a numpy
scalar ``{b"__npgeneric__": True, b"data": value, b"dtype": dtype.str}`` (``openpi_client.msgpack_numpy``). Object,
void and complex dtypes are refused both ways: an object array built from received bytes would be raw pointers.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

__all__ = ["ProtocolError", "pack", "unpack"]

_REFUSED_KINDS = ("O", "V", "c")


class ProtocolError(ValueError):
    """A message that is not openpi's msgpack-numpy encoding (or holds a refused dtype)."""


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic) and obj.dtype.kind in _REFUSED_KINDS:
        raise ProtocolError(f"unsupported dtype {obj.dtype}")
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": np.ascontiguousarray(obj).tobytes(), b"dtype": obj.dtype.str,
                b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def _dtype(obj: dict) -> np.dtype:
    try:
        dtype = np.dtype(obj[b"dtype"])
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"bad dtype {obj.get(b'dtype')!r}: {e}") from e
    if dtype.kind in _REFUSED_KINDS:
        raise ProtocolError(f"unsupported dtype {dtype}")
    return dtype


def _decode(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        dtype, data, shape = _dtype(obj), obj.get(b"data"), obj.get(b"shape")
        if not isinstance(data, bytes) or not isinstance(shape, list | tuple) or \
                not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ProtocolError("an __ndarray__ needs bytes data and a shape of non-negative integers")
        if len(data) != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise ProtocolError(f"an __ndarray__ of shape {tuple(shape)} and dtype {dtype} needs "
                                f"{int(np.prod(shape, dtype=np.int64)) * dtype.itemsize} bytes, got {len(data)}")
        return np.ndarray(buffer=data, dtype=dtype, shape=tuple(shape))
    if b"__npgeneric__" in obj:
        return _dtype(obj).type(obj[b"data"])
    return obj


def pack(obj: Any) -> bytes:
    """``obj`` (maps, lists, scalars, strings, numpy arrays and scalars) as one msgpack message."""
    return msgpack.packb(obj, default=_encode)


def unpack(data: bytes) -> Any:
    """One msgpack message back, arrays as read-only numpy views of the message.

    Raises:
        ProtocolError: not msgpack, or a malformed or refused array.
    """
    try:
        return msgpack.unpackb(data, object_hook=_decode)
    except ProtocolError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise ProtocolError(f"not a msgpack message: {e}") from e
