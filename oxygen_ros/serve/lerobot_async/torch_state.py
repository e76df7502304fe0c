"""torch tensors in a payload, rebuilt by hand as a plain ``pickle.dumps(tensor)`` writes them:
``torch._utils._rebuild_tensor_v2`` over ``torch.storage.load_from_bytes``, whose bytes are torch's legacy
``torch.save`` of the storage, itself a pickle: parsed here with its own allow-list (storage types and one persistent
id), the storage's raw bytes read directly, never ``torch.load``."""

from __future__ import annotations

import io
import math
import pickle
import pickletools
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from .payloads import MAX_TENSOR_DIMS, PayloadError
from .prescan import prescan

__all__ = ["load_from_bytes", "rebuild_tensor_v2"]

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
    """A storage read from ``torch.storage.load_from_bytes``: a flat tensor."""

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
    """An unpickler for the next pickle in ``f``, its opcodes checked first (:func:`.prescan.prescan`)."""
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
    prescan(f.read(stop - start))
    f.seek(start)
    return _StorageUnpickler(f)


def load_from_bytes(data: object) -> _Storage:
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


def rebuild_tensor_v2(storage: object, offset: object, size: object, stride: object, requires_grad: object = False,
                       hooks: object = None, metadata: object = None) -> torch.Tensor:
    """torch's ``_rebuild_tensor_v2``, checked: a strided view inside its storage, copied; no hooks, no grad."""
    if not isinstance(storage, _Storage):
        raise PayloadError("torch tensor: its storage must come from load_from_bytes")
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

