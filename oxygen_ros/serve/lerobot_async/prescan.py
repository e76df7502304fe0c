"""The opcode walk every pickle gets before it is unpickled (the payload and torch's inner storage pickles)."""

from __future__ import annotations

import io
import pickletools

from .payloads import PayloadError

__all__ = ["MAX_OPCODES", "prescan"]

MAX_OPCODES = 1 << 20
_MEMO_OPS = {"PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET"}


def prescan(data: bytes) -> None:
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
