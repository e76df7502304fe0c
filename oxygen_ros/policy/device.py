"""Where and in which precision a policy runs: the ``device`` and ``dtype`` options resolved (node, server and
``evaluate_bag``).

``dtype: auto`` follows the checkpoint, so that the node returns what the checkpoint's own framework returns:

=================================  ==================  ===========================================================
checkpoint                         device              precision
=================================  ==================  ===========================================================
openpi                             any                 ``bfloat16_islands`` (``create_trained_policy`` casts every
                                                       PyTorch pi0.5 to its mixed bf16, fp32 checkpoints and CPUs
                                                       included)
LeRobot, ``config.json`` float32   any                 ``float32``
LeRobot, ``config.json`` bfloat16  any                 ``bfloat16_lerobot`` (LeRobot's own cast rules)
ours (and generated models)        cuda                ``bfloat16_islands``
ours (and generated models)        cpu, mps            ``float32``
=================================  ==================  ===========================================================

An explicit ``dtype`` always wins.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oxygen_ros.engine.backends.precision import PRECISIONS

__all__ = ["PrecisionChoice", "choose_precision", "resolve_device", "resolve_precision"]


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a policy runs in (a key of ``PRECISIONS``) and why, for the log and ``/diagnostics``."""

    precision: str
    reason: str

    def describe(self) -> str:
        """e.g. ``bfloat16_islands (openpi checkpoint: openpi runs bf16)``."""
        return f"{self.precision} ({self.reason})"


def choose_precision(device: torch.device, dtype: str, framework: str | None = None,
                     checkpoint_dtype: str = "") -> PrecisionChoice:
    """The precision of the ``dtype`` option for a checkpoint of ``framework`` (oxygen | openpi | lerobot; None:
    not known yet, treated as ours) whose config declares ``checkpoint_dtype`` (LeRobot's ``config.json`` ``dtype``),
    on ``device``: see the module's table.

    Raises:
        ValueError: an unknown dtype.
    """
    if dtype != "auto":
        if dtype not in PRECISIONS:
            raise ValueError(f"dtype must be auto or one of {sorted(PRECISIONS)}, got {dtype!r}")
        return PrecisionChoice(dtype, "dtype parameter")
    if framework == "openpi":
        return PrecisionChoice("bfloat16_islands", "openpi checkpoint: openpi's create_trained_policy runs bf16 "
                                                   "on every device")
    if framework == "lerobot":
        if checkpoint_dtype == "bfloat16":
            return PrecisionChoice("bfloat16_lerobot", "LeRobot checkpoint: config.json dtype bfloat16, LeRobot's "
                                                       "casts")
        return PrecisionChoice("float32", f"LeRobot checkpoint: config.json dtype {checkpoint_dtype or 'float32'}")
    if device.type == "cuda":
        return PrecisionChoice("bfloat16_islands", "own checkpoint on cuda")
    return PrecisionChoice("float32", f"own checkpoint on {device.type}")


def resolve_precision(device: torch.device, dtype: str, framework: str | None = None,
                      checkpoint_dtype: str = "") -> str:
    """The precision policy (``oxygen_ros.engine.backends.precision.PRECISIONS``) of the ``dtype`` parameter:
    :func:`choose_precision` without the reason."""
    return choose_precision(device, dtype, framework, checkpoint_dtype).precision


def resolve_device(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """'auto' -> cuda when available; the compute dtype of ``dtype`` ('auto': of our own checkpoints on that
    device; the checkpoint decides the final one, :func:`choose_precision`).

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
