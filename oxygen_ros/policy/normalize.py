"""State and action (un)normalisation with each framework's exact arithmetic.

openpi (``transforms.Normalize`` / ``Unnormalize``): numpy, statistics as stored (float64), ``+1e-6`` both ways::

    mean_std   (x - mean) / (std + 1e-6)            x * (std + 1e-6) + mean
    quantiles  (x - q01) / (q99 - q01 + 1e-6) * 2 - 1   (x + 1) / 2 * (q99 - q01 + 1e-6) + q01

Statistics longer than the vector are cut to it; dims beyond shorter statistics pass through (mean_std pads
mean 0 / std 1, as openpi does).

LeRobot (``NormalizerProcessorStep``): torch in the input's dtype (float32), ``eps`` from the processor JSON::

    MEAN_STD    (x - mean) / (std + eps)            x * std + mean
    QUANTILES   2 (x - q01) / d - 1,  d = q99 - q01 (eps where d == 0)   (x + 1) * d / 2 + q01
    QUANTILE10  the same with q10 / q90;  MIN_MAX the same with min / max

No clipping anywhere.
"""

from __future__ import annotations

import numpy as np
import torch

from .spec import FeatureNorm

__all__ = ["STATS_NEEDED", "normalize", "unnormalize"]

STATS_NEEDED = {"identity": (), "mean_std": ("mean", "std"), "quantiles": ("q01", "q99"),
                "quantile10": ("q10", "q90"), "min_max": ("min", "max")}


def normalize(x: np.ndarray, norm: FeatureNorm | None) -> np.ndarray:
    """Robot units -> model space."""
    return _apply(x, norm, inverse=False)


def unnormalize(x: np.ndarray, norm: FeatureNorm | None) -> np.ndarray:
    """Model space -> robot units."""
    return _apply(x, norm, inverse=True)


def _apply(x: np.ndarray, norm: FeatureNorm | None, inverse: bool) -> np.ndarray:
    if norm is None or norm.mode == "identity":
        return np.asarray(x)
    return (_lerobot if norm.convention == "lerobot" else _openpi)(x, norm, inverse)


def _openpi(x: np.ndarray, norm: FeatureNorm, inverse: bool) -> np.ndarray:
    x = np.asarray(x)
    s, n, eps = norm.stats, x.shape[-1], norm.eps
    if norm.mode == "mean_std":
        if not inverse:
            return (x - s["mean"][..., :n]) / (s["std"][..., :n] + eps)
        mean = _pad(s["mean"], n, 0.0)
        std = _pad(s["std"], n, 1.0)
        return x * (std + eps) + mean
    if norm.mode != "quantiles":
        raise ValueError(f"openpi normalisation has no mode {norm.mode!r}")
    q01, q99 = s["q01"], s["q99"]
    if not inverse:
        return (x - q01[..., :n]) / (q99[..., :n] - q01[..., :n] + eps) * 2.0 - 1.0
    d = q01.shape[-1]
    if d < n:
        head = (x[..., :d] + 1.0) / 2.0 * (q99 - q01 + eps) + q01
        return np.concatenate([head, x[..., d:]], axis=-1)
    return (x + 1.0) / 2.0 * (q99 - q01 + eps) + q01


def _pad(a: np.ndarray, n: int, value: float) -> np.ndarray:
    if a.shape[-1] >= n:
        return a[..., :n]
    return np.concatenate([a, np.full(n - a.shape[-1], value, dtype=a.dtype)])


def _lerobot(x: np.ndarray, norm: FeatureNorm, inverse: bool) -> np.ndarray:
    t = torch.as_tensor(np.asarray(x))
    stats = {k: torch.as_tensor(v).to(t.dtype) for k, v in norm.stats.items()}
    eps = torch.tensor(norm.eps, dtype=t.dtype)
    if norm.mode == "mean_std":
        mean, std = stats["mean"], stats["std"]
        out = t * std + mean if inverse else (t - mean) / (std + norm.eps)
        return out.numpy()
    lo_key, hi_key = {"quantiles": ("q01", "q99"), "quantile10": ("q10", "q90"), "min_max": ("min", "max")}[norm.mode]
    lo, hi = stats[lo_key], stats[hi_key]
    d = hi - lo
    d = torch.where(d == 0, eps, d)
    if norm.mode == "min_max":
        out = (t + 1) / 2 * d + lo if inverse else 2 * (t - lo) / d - 1
    else:
        out = (t + 1.0) * d / 2.0 + lo if inverse else 2.0 * (t - lo) / d - 1.0
    return out.numpy()
