"""LeRobot async inference's payloads (pickled Python objects), read without pickle's hole and written without
importing ``lerobot``.

LeRobot 0.6.1's ``PolicyServer`` calls ``pickle.loads`` on whatever arrives (CVE-2026-25874). :func:`loads` is an
allow-list unpickler: every global a pickle names goes through :meth:`_SafeUnpickler.find_class`, which knows only

- LeRobot's payload classes (``lerobot.async_inference.helpers.{TimedObservation, TimedAction, RemotePolicyConfig}``,
  ``lerobot.configs.types.{PolicyFeature, FeatureType}``), mapped to this module's own dataclasses;
- numpy array and scalar reconstruction (``_reconstruct`` / ``_frombuffer`` / ``scalar``, ``ndarray``, ``dtype``),
  as inert proxies materialised afterwards from validated bytes (numbers and booleans only: no object, void,
  structured or string dtype, whose state could smuggle objects in);
- torch tensor reconstruction as a plain ``pickle.dumps(tensor)`` writes it: ``torch._utils._rebuild_tensor_v2``
  over ``torch.storage._load_from_bytes`` (whose bytes are torch's legacy ``torch.save`` of the storage, itself a
  pickle: parsed here with its own allow-list, the storage's raw bytes read directly, never ``torch.load``), and the
  empty ``collections.OrderedDict`` of backward hooks;
- ``builtins`` ``set``, ``frozenset``, ``bytearray`` and ``_codecs.encode(str, 'latin1')`` (protocol 2's
  containers and bytes).

Anything else is refused at ``find_class``, before anything is built or called; persistent ids are refused; the
classes' state is checked field by field. The payload size is bounded by the caller (:class:`Limits`); the
nesting depth of the result is bounded here; a DAG of shared references (a "billion laughs" pickle) is walked once
per object. Every failure is a :class:`PayloadError` naming what was refused.

:func:`dumps` writes the other direction (a list of :class:`TimedAction` for LeRobot's ``RobotClient``, or the
client's own payloads in tests): LeRobot's class names are written as globals without importing them, tensors with
torch's own reduction, so LeRobot's ``pickle.loads`` rebuilds its own classes.
"""

from __future__ import annotations

import enum
import io
import math
import pickle
import pickletools
import struct
from collections import OrderedDict
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import numpy as np
import torch

__all__ = ["MAX_DEPTH", "FeatureType", "PayloadError", "PolicyFeature", "RemotePolicyConfig", "TimedAction",
           "TimedObservation", "dumps", "loads"]

MAX_DEPTH = 32  # containers inside containers (LeRobot's payloads nest 4 deep)
MAX_TENSOR_DIMS = 8
HELPERS = "lerobot.async_inference.helpers"
TYPES = "lerobot.configs.types"


class PayloadError(ValueError):
    """A payload refused: not a pickle, a class or function outside the allow-list, malformed state, too deep."""


# ---------------------------------------------------------------------------------------------- LeRobot's classes
class _Payload:
    """Base of the payload dataclasses: built by NEWOBJ + BUILD with a dict state of exactly known fields."""

    def __setstate__(self, state: object) -> None:
        if not isinstance(self, _Payload):  # BUILD on the class object itself
            raise PayloadError("BUILD on a class refused")
        names = {f.name for f in fields(self)}  # type: ignore[arg-type]
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise PayloadError(f"{type(self).__name__}: state must be a dict of field names")
        unknown = sorted(set(state) - names)
        if unknown:
            raise PayloadError(f"{type(self).__name__}: unknown field(s) {unknown}")
        for f in fields(self):  # type: ignore[arg-type]
            if f.name in state:
                object.__setattr__(self, f.name, state[f.name])
            elif f.default_factory is not MISSING:
                object.__setattr__(self, f.name, f.default_factory())
            elif f.default is not MISSING:
                object.__setattr__(self, f.name, f.default)
            else:
                raise PayloadError(f"{type(self).__name__}: missing field {f.name!r}")


@dataclass(eq=False)
class TimedObservation(_Payload):
    """LeRobot's ``TimedObservation``: the robot's raw observation dict (motor values, camera images, ``task``)."""

    timestamp: float
    timestep: int
    observation: dict
    must_go: bool = False


@dataclass(eq=False)
class TimedAction(_Payload):
    """LeRobot's ``TimedAction``: one action [action_dim] (a float32 tensor) for ``timestep``."""

    timestamp: float
    timestep: int
    action: torch.Tensor


@dataclass(eq=False)
class RemotePolicyConfig(_Payload):
    """LeRobot's ``RemotePolicyConfig`` (``SendPolicyInstructions``)."""

    policy_type: str
    pretrained_name_or_path: str
    lerobot_features: dict
    actions_per_chunk: int
    device: str = "cpu"
    rename_map: dict = field(default_factory=dict)


class FeatureType(enum.Enum):
    """LeRobot's ``FeatureType`` (its values)."""

    STATE = "STATE"
    VISUAL = "VISUAL"
    ENV = "ENV"
    ACTION = "ACTION"
    REWARD = "REWARD"
    LANGUAGE = "LANGUAGE"

    def __setstate__(self, state: object) -> None:  # BUILD on the enum (its class object) would set attributes
        raise PayloadError("BUILD on FeatureType refused")


@dataclass(eq=False)
class PolicyFeature(_Payload):
    """LeRobot's ``PolicyFeature`` (a feature's type and shape)."""

    type: FeatureType
    shape: tuple


_CLASSES: dict[tuple[str, str], type] = {
    (HELPERS, "TimedObservation"): TimedObservation, (HELPERS, "TimedAction"): TimedAction,
    (HELPERS, "RemotePolicyConfig"): RemotePolicyConfig, (TYPES, "PolicyFeature"): PolicyFeature,
    (TYPES, "FeatureType"): FeatureType}
_NAMES = {cls: key for key, cls in _CLASSES.items()}


# ---------------------------------------------------------------------------------------------- numpy, inert
_DTYPE_KINDS = "biuf"  # booleans, integers, floats


class _DType:
    """numpy's ``dtype(spec, align, copy)`` + BUILD state, checked: a plain number or boolean type only."""

    def __init__(self, spec: object = None, align: object = False, copy: object = False) -> None:
        if not isinstance(spec, str) or len(spec) > 4:
            raise PayloadError(f"numpy dtype {spec!r} refused")
        try:
            self.dtype = np.dtype(spec)
        except TypeError as e:
            raise PayloadError(f"numpy dtype {spec!r}: {e}") from None
        if self.dtype.kind not in _DTYPE_KINDS or self.dtype.fields is not None or self.dtype.subdtype is not None:
            raise PayloadError(f"numpy dtype {self.dtype} refused (numbers and booleans only)")

    def __setstate__(self, state: object) -> None:
        if not isinstance(self, _DType):
            raise PayloadError("BUILD on a class refused")
        # (version, byte order, subarray, names, fields, elsize, alignment, flags): plain types only
        if not isinstance(state, tuple) or len(state) < 5 or state[2] is not None or state[3] is not None \
                or state[4] is not None or state[1] not in ("<", ">", "|", "="):
            raise PayloadError("numpy dtype state refused (a structured or subarray dtype)")
        if state[1] in "<>":
            self.dtype = self.dtype.newbyteorder(state[1])


def _as_dtype(d: object) -> np.dtype:
    if not isinstance(d, _DType):
        raise PayloadError(f"expected a numpy dtype, got {type(d).__name__}")
    return d.dtype


def _array_from_bytes(data: object, dtype: np.dtype, shape: object, order: str = "C") -> np.ndarray:
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


class _NDArray:
    """numpy's ``_reconstruct(ndarray, (0,), b'b')`` + BUILD ``(version, shape, dtype, fortran, data)``: an inert
    proxy whose validated array replaces it once the pickle is read."""

    def __init__(self) -> None:
        self.array: np.ndarray | None = None

    def __setstate__(self, state: object) -> None:
        if not isinstance(self, _NDArray):
            raise PayloadError("BUILD on a class refused")
        if not isinstance(state, tuple) or len(state) != 5 or not isinstance(state[3], bool):
            raise PayloadError("numpy array state refused")
        _, shape, dtype, fortran, data = state
        self.array = _array_from_bytes(data, _as_dtype(dtype), shape, "F" if fortran else "C")


class _NDArrayClass:
    """Stands for ``numpy.ndarray`` (only ever an argument of ``_reconstruct``)."""

    def __setstate__(self, state: object) -> None:
        raise PayloadError("BUILD on a class refused")


def _reconstruct(cls: object, shape: object, typecode: object) -> _NDArray:
    if cls is not _NDArrayClass or shape != (0,) or typecode != b"b":
        raise PayloadError("numpy _reconstruct: only (ndarray, (0,), b'b') is accepted")
    return _NDArray()


def _frombuffer(buf: object, dtype: object, shape: object, order: object) -> np.ndarray:
    if order not in ("C", "F"):
        raise PayloadError(f"numpy _frombuffer order {order!r} refused")
    return _array_from_bytes(buf, _as_dtype(dtype), shape, str(order))


def _scalar(dtype: object, data: object = None) -> np.generic:
    d = _as_dtype(dtype)
    if not isinstance(data, bytes) or len(data) != d.itemsize:
        raise PayloadError(f"numpy scalar of {d} needs {d.itemsize} bytes")
    return np.frombuffer(data, dtype=d)[0]


# ---------------------------------------------------------------------------------------------- torch, by hand
_STORAGES = {f"{name}Storage": dtype for name, dtype in (
    ("Float", torch.float32), ("Double", torch.float64), ("Half", torch.float16), ("BFloat16", torch.bfloat16),
    ("Long", torch.int64), ("Int", torch.int32), ("Short", torch.int16), ("Char", torch.int8),
    ("Byte", torch.uint8), ("Bool", torch.bool))}
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER
_LEGACY_PROTOCOL = 1001


@dataclass(frozen=True)
class _StorageType:
    dtype: torch.dtype


class _Storage:
    """A storage read from ``torch.storage._load_from_bytes``: a flat tensor."""

    def __init__(self, flat: torch.Tensor) -> None:
        self.flat = flat


class _StorageUnpickler(pickle.Unpickler):
    """The inner pickle of torch's legacy storage format: storage types and one persistent id only."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self.storages: dict[str, tuple[torch.dtype, int]] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in _STORAGES:
            return _StorageType(_STORAGES[name])
        raise PayloadError(f"refused global {module}.{name} inside a torch storage")

    def persistent_load(self, pid: object) -> Any:
        if not isinstance(pid, tuple) or len(pid) < 5 or pid[0] != "storage" or \
                not isinstance(pid[1], _StorageType) or not isinstance(pid[2], str) or pid[3] != "cpu" or \
                not isinstance(pid[4], int) or pid[4] < 0 or (len(pid) > 5 and pid[5] is not None):
            raise PayloadError("refused persistent id in a torch storage")
        self.storages[pid[2]] = (pid[1].dtype, pid[4])
        return pid[2]


def _scanned(f: io.BytesIO) -> _StorageUnpickler:
    """An unpickler for the next pickle in ``f``, its opcodes checked first (:func:`_prescan`)."""
    start = f.tell()
    stop = None
    try:
        for op, _, pos in pickletools.genops(f):
            if op.name == "STOP":
                stop = pos + 1
                break
    except Exception as e:
        raise PayloadError(f"malformed torch storage: {type(e).__name__}: {e}") from None
    if stop is None:
        raise PayloadError("malformed torch storage: no STOP opcode")
    f.seek(start)
    _prescan(f.read(stop - start))
    f.seek(start)
    return _StorageUnpickler(f)


def _load_from_bytes(data: object) -> _Storage:
    """torch's legacy ``torch.save(storage)`` bytes -> the storage's elements (no ``torch.load``)."""
    if not isinstance(data, bytes):
        raise PayloadError("a torch storage must be bytes")
    f = io.BytesIO(data)
    try:
        magic, protocol, info = (_scanned(f).load() for _ in range(3))
        if magic != _LEGACY_MAGIC or protocol != _LEGACY_PROTOCOL:
            raise PayloadError("not torch's legacy storage format")
        if not isinstance(info, dict) or info.get("little_endian") is not True:
            raise PayloadError("a torch storage must be little-endian")
        inner = _scanned(f)
        key = inner.load()
        keys = _scanned(f).load()
    except PayloadError:
        raise
    except Exception as e:
        raise PayloadError(f"malformed torch storage: {type(e).__name__}: {e}") from None
    if not isinstance(key, str) or keys != [key] or key not in inner.storages:
        raise PayloadError("a torch storage must hold exactly one storage")
    dtype, numel = inner.storages[key]
    head = f.read(8)
    if len(head) != 8 or struct.unpack("<q", head)[0] != numel:
        raise PayloadError("torch storage: element count mismatch")
    size = numel * torch.empty((), dtype=dtype).element_size()
    raw = f.read(size)
    if len(raw) != size or f.read(1):
        raise PayloadError(f"torch storage: expected {size} bytes of data")
    flat = torch.frombuffer(bytearray(raw), dtype=dtype) if size else torch.empty(0, dtype=dtype)
    return _Storage(flat)


def _rebuild_tensor_v2(storage: object, offset: object, size: object, stride: object, requires_grad: object = False,
                       hooks: object = None, metadata: object = None) -> torch.Tensor:
    """torch's ``_rebuild_tensor_v2``, checked: a strided view inside its storage, copied; no hooks, no grad."""
    if not isinstance(storage, _Storage):
        raise PayloadError("torch tensor: its storage must come from _load_from_bytes")
    ints = (isinstance(offset, int) and isinstance(size, tuple) and isinstance(stride, tuple)
            and all(isinstance(x, int) and not isinstance(x, bool) for x in (*size, *stride)))
    if not ints or len(size) != len(stride) or len(size) > MAX_TENSOR_DIMS or offset < 0 or \
            any(x < 0 for x in (*size, *stride)):
        raise PayloadError(f"torch tensor: bad geometry offset={offset!r} size={size!r} stride={stride!r}")
    if hooks is not None and (not isinstance(hooks, OrderedDict) or hooks) or metadata not in (None, {}) or \
            not isinstance(requires_grad, bool):
        raise PayloadError("torch tensor: backward hooks or metadata refused")
    numel = storage.flat.numel()
    if math.prod(size) and offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) >= numel:
        raise PayloadError("torch tensor: its view reaches past its storage")
    if not math.prod(size):
        return torch.empty(size, dtype=storage.flat.dtype)
    return torch.as_strided(storage.flat, size, stride, offset).clone()


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


_NUMPY = {"_reconstruct": _reconstruct, "scalar": _scalar}
_FUNCTIONS: dict[tuple[str, str], Any] = {
    **{(m, n): f for m in ("numpy._core.multiarray", "numpy.core.multiarray") for n, f in _NUMPY.items()},
    **{(m, "_frombuffer"): _frombuffer for m in ("numpy._core.numeric", "numpy.core.numeric")},
    ("numpy", "ndarray"): _NDArrayClass, ("numpy", "dtype"): _DType,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2, ("torch.storage", "_load_from_bytes"): _load_from_bytes,
    ("collections", "OrderedDict"): _ordered_dict,
    ("builtins", "set"): _container(set), ("builtins", "frozenset"): _container(frozenset),
    ("builtins", "bytearray"): _container(bytearray), ("_codecs", "encode"): _latin1}


MAX_OPCODES = 1 << 20
_MEMO_OPS = {"PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET"}


def _prescan(data: bytes) -> None:
    """Walk the opcodes once before unpickling (``pickletools.genops``, which builds nothing): at most
    :data:`MAX_OPCODES`, one pickle, and memo indices within the opcodes seen. CPython's unpickler sizes its memo
    by the largest index a PUT names: a 20-byte pickle could make it allocate and zero gigabytes."""
    count, end = 0, False
    try:
        for op, arg, _ in pickletools.genops(io.BytesIO(data)):
            count += 1
            if count > MAX_OPCODES:
                raise PayloadError(f"more than {MAX_OPCODES} pickle opcodes")
            if op.name in _MEMO_OPS and (not isinstance(arg, int) or not 0 <= arg <= count):
                raise PayloadError(f"pickle memo index {arg!r} out of range")
            end = op.name == "STOP"
    except PayloadError:
        raise
    except Exception as e:
        raise PayloadError(f"not a valid payload: {type(e).__name__}: {e}") from None
    if not end:
        raise PayloadError("not a valid payload: no STOP opcode")


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
    **_CLASSES, **{k: v if isinstance(v, type) else _Global(v) for k, v in _FUNCTIONS.items()}}


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
    if isinstance(obj, _NDArray):
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
    elif isinstance(obj, _Payload):
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
    _prescan(data)
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


# ---------------------------------------------------------------------------------------------- writing
class _Pickler(pickle._Pickler):  # the Python pickler: its dispatch can write LeRobot's globals by name
    dispatch = dict(pickle._Pickler.dispatch)

    def _save_payload(self, obj: _Payload | FeatureType) -> None:
        module, name = _NAMES[type(obj)]
        if self.proto >= 4:
            self.save(module)
            self.save(name)
            self.write(pickle.STACK_GLOBAL)
        else:
            self.write(pickle.GLOBAL + f"{module}\n{name}\n".encode())
        if isinstance(obj, FeatureType):
            self.save((obj.value,))
            self.write(pickle.REDUCE)
            self.memoize(obj)
            return
        self.save(())
        self.write(pickle.NEWOBJ)
        self.memoize(obj)
        self.save({f.name: getattr(obj, f.name) for f in fields(obj)})  # type: ignore[arg-type]
        self.write(pickle.BUILD)

    for _cls in _NAMES:
        dispatch[_cls] = _save_payload


def dumps(obj: Any, protocol: int = 4) -> bytes:
    """``obj`` (LeRobot payloads of this module's classes, containers, numpy arrays, torch tensors) as the pickle
    LeRobot's ``pickle.loads`` rebuilds with its own classes (protocol 4: LeRobot's ``pickle.dumps`` on Python
    3.12 / 3.13; 2 to 5 accepted)."""
    if not 2 <= protocol <= 5:
        raise ValueError(f"protocol {protocol}: 2 to 5")
    f = io.BytesIO()
    _Pickler(f, protocol=protocol).dump(obj)
    return f.getvalue()
