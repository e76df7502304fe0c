"""LeRobot async inference's payloads (pickled Python objects), read without pickle's hole: :func:`loads`.

LeRobot 0.6.1's ``PolicyServer`` calls ``pickle.loads`` on whatever arrives (CVE-2026-25874). :func:`loads` is an
allow-list unpickler: every global a pickle names goes through :meth:`_SafeUnpickler.find_class`, which knows only

- LeRobot's payload classes (``lerobot.async_inference.helpers.{TimedObservation, TimedAction, RemotePolicyConfig}``,
  ``lerobot.configs.types.{PolicyFeature, FeatureType}``), mapped to this package's own dataclasses (:mod:`.payloads`);
- numpy array and scalar reconstruction (``_reconstruct`` / ``_frombuffer`` / ``scalar``, ``ndarray``, ``dtype``),
  as inert proxies materialised afterwards from validated bytes (numbers and booleans only: no object, void,
  structured or string dtype, whose state could smuggle objects in; :mod:`.numpy_state`);
- torch tensor reconstruction as a plain ``pickle.dumps(tensor)`` writes it: ``torch._utils._rebuild_tensor_v2``
  over ``torch.storage._load_from_bytes`` (whose bytes are torch's legacy ``torch.save`` of the storage, itself a
  pickle: parsed with its own allow-list, the storage's raw bytes read directly, never ``torch.load``;
  :mod:`.torch_state`), and the empty ``collections.OrderedDict`` of backward hooks;
- ``builtins`` ``set``, ``frozenset``, ``bytearray`` and ``_codecs.encode(str, 'latin1')`` (protocol 2's
  containers and bytes).

Every pickle's opcodes are walked first (:mod:`.prescan`). Anything else is refused at ``find_class``, before anything
is built or called; persistent ids are refused; the
classes' state is checked field by field. The payload size is bounded by the caller (:class:`Limits`); the
nesting depth of the result is bounded here; a DAG of shared references (a "billion laughs" pickle) is walked once
per object. Every failure is a :class:`PayloadError` naming what was refused.
"""

from __future__ import annotations

import io
import pickle
from collections import OrderedDict
from dataclasses import fields
from typing import Any

import numpy as np
import torch

from .numpy_state import DType, NDArray, NDArrayClass, frombuffer, reconstruct, scalar
from .payloads import CLASSES, FeatureType, Payload, PayloadError
from .prescan import prescan
from .torch_state import load_from_bytes, rebuild_tensor_v2

__all__ = ["MAX_DEPTH", "loads"]

MAX_DEPTH = 32  # containers inside containers (LeRobot's payloads nest 4 deep)


def _ordered_dict(*args: object) -> OrderedDict:
    if args:
        raise PayloadError("collections.OrderedDict: only the empty one (backward hooks) is accepted")
    return OrderedDict()


def _container(kind: type) -> Any:
    def build(items: object = ()) -> Any:
        if not isinstance(items, list | tuple | bytes | str):
            raise PayloadError(f"builtins.{kind.__name__}: from a list only")
        if kind is bytearray:
            if not isinstance(items, bytes | str):
                raise PayloadError("builtins.bytearray: from bytes only")
            return bytearray(items.encode("latin-1") if isinstance(items, str) else items)
        return kind(items)

    return build


def _latin1(text: object, encoding: object = "latin1") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise PayloadError("_codecs.encode: only protocol 2's (str, 'latin1') bytes are accepted")
    return text.encode("latin-1")


_NUMPY = {"_reconstruct": reconstruct, "scalar": scalar}
_FUNCTIONS: dict[tuple[str, str], Any] = {
    **{(m, n): f for m in ("numpy._core.multiarray", "numpy.core.multiarray") for n, f in _NUMPY.items()},
    **{(m, "_frombuffer"): frombuffer for m in ("numpy._core.numeric", "numpy.core.numeric")},
    ("numpy", "ndarray"): NDArrayClass, ("numpy", "dtype"): DType,
    ("torch._utils", "_rebuild_tensor_v2"): rebuild_tensor_v2, ("torch.storage", "_load_from_bytes"): load_from_bytes,
    ("collections", "OrderedDict"): _ordered_dict,
    ("builtins", "set"): _container(set), ("builtins", "frozenset"): _container(frozenset),
    ("builtins", "bytearray"): _container(bytearray), ("_codecs", "encode"): _latin1}


class _Global:
    """An allow-listed function as a pickle sees it: callable, and nothing else. BUILD on a bare function would
    set its attributes (``__defaults__`` among them) for every later request; here it is refused."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Any) -> None:
        object.__setattr__(self, "_fn", fn)

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)

    def __setstate__(self, state: object) -> None:
        raise PayloadError("BUILD on a function refused")

    def __setattr__(self, name: str, value: object) -> None:
        raise PayloadError("setting attributes of a function refused")


_GLOBALS: dict[tuple[str, str], Any] = {
    **CLASSES, **{k: v if isinstance(v, type) else _Global(v) for k, v in _FUNCTIONS.items()}}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _GLOBALS.get((module, name))
        if found is None:
            raise PayloadError(f"refused global {module}.{name} (not on the allow-list)")
        return found

    def persistent_load(self, pid: object) -> Any:
        raise PayloadError("refused persistent id")


def _materialise(obj: Any, depth: int, seen: dict[int, Any]) -> Any:
    """The loaded object with array proxies replaced by arrays; each object visited once; depth bounded."""
    if depth > MAX_DEPTH:
        raise PayloadError(f"nesting deeper than {MAX_DEPTH}")
    if obj is None or isinstance(obj, bool | int | float | str | bytes | np.generic | torch.Tensor | FeatureType):
        return obj
    key = id(obj)
    if key in seen:
        return seen[key]
    if isinstance(obj, NDArray):
        if obj.array is None:
            raise PayloadError("a numpy array without its state")
        out: Any = obj.array
    elif isinstance(obj, np.ndarray):
        out = obj
    elif isinstance(obj, dict):
        out = type(obj)() if isinstance(obj, OrderedDict) else {}
        seen[key] = out
        for k, v in obj.items():
            out[_materialise(k, depth + 1, seen)] = _materialise(v, depth + 1, seen)
        return out
    elif isinstance(obj, list):
        out = []
        seen[key] = out
        out.extend(_materialise(v, depth + 1, seen) for v in obj)
        return out
    elif isinstance(obj, tuple | set | frozenset):
        out = type(obj)(_materialise(v, depth + 1, seen) for v in obj)
    elif isinstance(obj, bytearray):
        out = bytes(obj)
    elif isinstance(obj, Payload):
        for f in fields(obj):  # type: ignore[arg-type]
            if not hasattr(obj, f.name):
                raise PayloadError(f"{type(obj).__name__} without its state")
        seen[key] = obj
        for f in fields(obj):  # type: ignore[arg-type]
            object.__setattr__(obj, f.name, _materialise(getattr(obj, f.name), depth + 1, seen))
        return obj
    else:
        raise PayloadError(f"refused object of type {type(obj).__name__}")
    seen[key] = out
    return out


def loads(data: bytes | bytearray | memoryview) -> Any:
    """A LeRobot payload back (see the module docstring).

    Raises:
        PayloadError: what was refused or malformed, named.
    """
    data = bytes(data)
    prescan(data)
    try:
        obj = _SafeUnpickler(io.BytesIO(data)).load()
    except PayloadError:
        raise
    except RecursionError:
        raise PayloadError(f"nesting deeper than {MAX_DEPTH}") from None
    except Exception as e:  # truncated, malformed opcodes, wrong argument types, unhashable keys...
        raise PayloadError(f"not a valid payload: {type(e).__name__}: {e}") from None
    try:
        return _materialise(obj, 0, {})
    except RecursionError:
        raise PayloadError(f"nesting deeper than {MAX_DEPTH}") from None
