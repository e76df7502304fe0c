"""numpy arrays, scalars and dtypes in a payload, read inertly: ``numpy.ndarray``, ``dtype``, ``_reconstruct``,
``_frombuffer`` and ``scalar`` stand for proxies whose validated bytes become an array afterwards (numbers and
booleans only: no object, void, structured or string dtype, whose state could smuggle objects in)."""

from __future__ import annotations

import math

import numpy as np

from .payloads import MAX_TENSOR_DIMS, PayloadError

__all__ = ["NDArray", "NDArrayClass", "DType", "frombuffer", "reconstruct", "scalar"]

DTYPE_KINDS = "biuf"  # booleans, integers, floats


class DType:
    """numpy's ``dtype(spec, align, copy)`` + BUILD state, checked: a plain number or boolean type only."""

    def __init__(self, spec: object = None, align: object = False, copy: object = False) -> None:
        if not isinstance(spec, str) or len(spec) > 4:
            raise PayloadError(f"numpy dtype {spec!r} refused")
        try:
            self.dtype = np.dtype(spec)
        except TypeError as e:
            raise PayloadError(f"numpy dtype {spec!r}: {e}") from None
        if self.dtype.kind not in DTYPE_KINDS or self.dtype.fields is not None or self.dtype.subdtype is not None:
            raise PayloadError(f"numpy dtype {self.dtype} refused (numbers and booleans only)")

    def __setstate__(self, state: object) -> None:
        if not isinstance(self, DType):
            raise PayloadError("BUILD on a class refused")
        # (version, byte order, subarray, names, fields, elsize, alignment, flags): plain types only
        if not isinstance(state, tuple) or len(state) < 5 or state[2] is not None or state[3] is not None \
                or state[4] is not None or state[1] not in ("<", ">", "|", "="):
            raise PayloadError("numpy dtype state refused (a structured or subarray dtype)")
        if state[1] in "<>":
            self.dtype = self.dtype.newbyteorder(state[1])


def as_dtype(d: object) -> np.dtype:
    if not isinstance(d, DType):
        raise PayloadError(f"expected a numpy dtype, got {type(d).__name__}")
    return d.dtype


def array_from_bytes(data: object, dtype: np.dtype, shape: object, order: str = "C") -> np.ndarray:
    if isinstance(data, bytearray | memoryview):
        data = bytes(data)
    if not isinstance(data, bytes):
        raise PayloadError(f"numpy array data must be bytes, got {type(data).__name__}")
    if not isinstance(shape, tuple) or len(shape) > MAX_TENSOR_DIMS or \
            not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise PayloadError(f"numpy array shape {shape!r} refused")
    n = math.prod(shape)
    if n * dtype.itemsize != len(data):
        raise PayloadError(f"numpy array {shape} {dtype} needs {n * dtype.itemsize} bytes, got {len(data)}")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order=order).copy()


class NDArray:
    """numpy's ``_reconstruct(ndarray, (0,), b'b')`` + BUILD ``(version, shape, dtype, fortran, data)``: an inert
    proxy whose validated array replaces it once the pickle is read."""

    def __init__(self) -> None:
        self.array: np.ndarray | None = None

    def __setstate__(self, state: object) -> None:
        if not isinstance(self, NDArray):
            raise PayloadError("BUILD on a class refused")
        if not isinstance(state, tuple) or len(state) != 5 or not isinstance(state[3], bool):
            raise PayloadError("numpy array state refused")
        _, shape, dtype, fortran, data = state
        self.array = array_from_bytes(data, as_dtype(dtype), shape, "F" if fortran else "C")


class NDArrayClass:
    """Stands for ``numpy.ndarray`` (only ever an argument of ``_reconstruct``)."""

    def __setstate__(self, state: object) -> None:
        raise PayloadError("BUILD on a class refused")


def reconstruct(cls: object, shape: object, typecode: object) -> NDArray:
    if cls is not NDArrayClass or shape != (0,) or typecode != b"b":
        raise PayloadError("numpy _reconstruct: only (ndarray, (0,), b'b') is accepted")
    return NDArray()


def frombuffer(buf: object, dtype: object, shape: object, order: object) -> np.ndarray:
    if order not in ("C", "F"):
        raise PayloadError(f"numpy _frombuffer order {order!r} refused")
    return array_from_bytes(buf, as_dtype(dtype), shape, str(order))


def scalar(dtype: object, data: object = None) -> np.generic:
    d = as_dtype(dtype)
    if not isinstance(data, bytes) or len(data) != d.itemsize:
        raise PayloadError(f"numpy scalar of {d} needs {d.itemsize} bytes")
    return np.frombuffer(data, dtype=d)[0]

