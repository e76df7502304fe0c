"""Where and in which precision a policy runs: the ``device`` and ``dtype`` options resolved (node and server)."""

from __future__ import annotations

import torch

from oxygen_ros.engine.precision import PRECISIONS

__all__ = ["resolve_device", "resolve_precision"]


def resolve_precision(device: torch.device, dtype: str) -> str:
    """The precision policy (``oxygen_ros.engine.precision.PRECISIONS``) of the ``dtype`` parameter on ``device``:
    'auto' is openpi's on CUDA (``bfloat16_islands``, what its ``create_trained_policy`` applies even to fp32
    checkpoints) and float32 elsewhere."""
    if dtype == "auto":
        return "bfloat16_islands" if device.type == "cuda" else "float32"
    return dtype


def resolve_device(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """'auto' -> cuda when available; the compute dtype of ``dtype`` (:func:`resolve_precision`; 'auto' ->
    bfloat16 on cuda, float32 elsewhere).

    Raises:
        ValueError: an unknown dtype, or a CUDA/MPS device that is not available.
    """
    if dtype != "auto" and dtype not in PRECISIONS:
        raise ValueError(f"dtype must be auto or one of {sorted(PRECISIONS)}, got {dtype!r}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device} requested but CUDA is not available (use device:=cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device: {device} does not exist ({torch.cuda.device_count()} CUDA device(s))")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device: mps requested but not available")
    return dev, PRECISIONS[resolve_precision(dev, dtype)]
