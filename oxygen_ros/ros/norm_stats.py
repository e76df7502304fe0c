"""openpi-style normalisation statistics: robot state in, model-space actions out.

The file is openpi's ``norm_stats.json``::

    {"norm_stats": {"state":   {"mean": [...], "std": [...], "q01": [...], "q99": [...]},
                    "actions": {"mean": [...], "std": [...], "q01": [...], "q99": [...]}}}

pi0.5 uses quantile normalisation, ``x -> (x - q01) / (q99 - q01 + 1e-6) * 2 - 1``; pi0 uses mean/std,
``x -> (x - mean) / (std + 1e-6)``. As in openpi, statistics longer than the vector are cut to its length;
dimensions beyond the statistics pass through unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["EPS", "NORMALIZATIONS", "NormStats", "NormStatsError", "Normalizer", "Stats", "load_norm_stats",
           "pad_or_truncate"]

EPS = 1e-6  # openpi's guard against zero ranges
NORMALIZATIONS = ("quantile", "mean_std", "none")


class NormStatsError(ValueError):
    """A norm stats file that cannot be used (missing keys, ragged or non-finite values)."""


@dataclass(frozen=True)
class Stats:
    """Per-dimension statistics of one vector (float64 arrays of equal length)."""

    mean: np.ndarray
    std: np.ndarray
    q01: np.ndarray
    q99: np.ndarray

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    @staticmethod
    def from_dict(d: dict, where: str) -> Stats:
        """Parse ``{"mean", "std", "q01", "q99"}``; q01/q99 may be absent (mean/std use only)."""
        if not isinstance(d, dict):
            raise NormStatsError(f"{where}: expected an object with mean/std/q01/q99, got {type(d).__name__}")
        arrays = {}
        for key in ("mean", "std", "q01", "q99"):
            if key not in d or d[key] is None:
                if key in ("q01", "q99"):
                    continue
                raise NormStatsError(f"{where}: missing {key!r}")
            try:
                a = np.asarray(d[key], dtype=np.float64).reshape(-1)
            except (TypeError, ValueError) as e:
                raise NormStatsError(f"{where}.{key}: not a list of numbers ({e})") from e
            if not np.all(np.isfinite(a)):
                raise NormStatsError(f"{where}.{key}: contains NaN or Inf")
            arrays[key] = a
        n = arrays["mean"].shape[0]
        if any(a.shape[0] != n for a in arrays.values()):
            lengths = {k: int(a.shape[0]) for k, a in arrays.items()}
            raise NormStatsError(f"{where}: statistics have different lengths {lengths}")
        nan = np.full(n, np.nan)
        return Stats(arrays["mean"], arrays["std"], arrays.get("q01", nan), arrays.get("q99", nan))

    @property
    def has_quantiles(self) -> bool:
        return bool(np.all(np.isfinite(self.q01)) and np.all(np.isfinite(self.q99)))


@dataclass(frozen=True)
class NormStats:
    """Statistics of the robot state and of the actions."""

    state: Stats | None
    actions: Stats | None


def load_norm_stats(path: str | Path) -> NormStats:
    """Read an openpi ``norm_stats.json`` (the top-level ``norm_stats`` key is optional).

    Raises:
        NormStatsError: unreadable JSON, no ``state``/``actions`` entry, or malformed statistics.
    """
    path = Path(path).expanduser()
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise NormStatsError(f"cannot read norm stats {path}: {e}") from e
    except json.JSONDecodeError as e:
        raise NormStatsError(f"{path}: not valid JSON ({e})") from e
    if isinstance(data, dict) and "norm_stats" in data:
        data = data["norm_stats"]
    if not isinstance(data, dict) or not ({"state", "actions"} & set(data)):
        raise NormStatsError(f"{path}: expected {{'norm_stats': {{'state': ..., 'actions': ...}}}}")
    state = Stats.from_dict(data["state"], f"{path}:state") if "state" in data else None
    actions = Stats.from_dict(data["actions"], f"{path}:actions") if "actions" in data else None
    return NormStats(state, actions)


def pad_or_truncate(x: np.ndarray, dim: int, axis: int = -1) -> np.ndarray:
    """Zero-pad or cut ``x`` along ``axis`` to length ``dim`` (openpi's pad_to_dim, plus truncation)."""
    n = x.shape[axis]
    if n == dim:
        return x
    if n > dim:
        return np.take(x, np.arange(dim), axis=axis)
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, dim - n)
    return np.pad(x, widths)


class Normalizer:
    """Normalises robot state for the prompt and unnormalises model actions to robot units.

    Args:
        stats: loaded statistics, or None for the identity.
        mode: ``quantile`` (pi0.5), ``mean_std`` (pi0) or ``none``.
    """

    def __init__(self, stats: NormStats | None, mode: str = "quantile") -> None:
        if mode not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {mode!r}")
        self.stats = stats if mode != "none" else None
        self.mode = mode
        if self.stats is not None and mode == "quantile":
            for name, s in (("state", self.stats.state), ("actions", self.stats.actions)):
                if s is not None and not s.has_quantiles:
                    raise NormStatsError(f"quantile normalisation needs q01/q99 for {name}")

    @property
    def identity(self) -> bool:
        return self.stats is None

    def _affine(self, s: Stats, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(center, scale) with normalised = (x - center) / scale for the first n dims."""
        if self.mode == "quantile":  # [q01, q99] -> [-1, 1]
            half = (s.q99[:n] - s.q01[:n] + EPS) / 2.0
            return s.q01[:n] + half, half
        return s.mean[:n], s.std[:n] + EPS

    def _map(self, x: np.ndarray, s: Stats | None, inverse: bool = False) -> np.ndarray:
        """Normalise (or, ``inverse``, unnormalise) the first dims covered by ``s``; the rest pass through."""
        x = np.asarray(x, dtype=np.float64)
        if s is None:
            return x
        n = min(x.shape[-1], s.dim)
        center, scale = self._affine(s, n)
        out = x.copy()
        out[..., :n] = x[..., :n] * scale + center if inverse else (x[..., :n] - center) / scale
        return out

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        """Robot-unit state [..., d] -> normalised (about [-1, 1] for quantile)."""
        return self._map(state, None if self.stats is None else self.stats.state)

    def unnormalize_state(self, state: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`normalize_state`."""
        return self._map(state, None if self.stats is None else self.stats.state, inverse=True)

    def normalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """Robot-unit actions [..., d] -> model space (used by tests and data tools)."""
        return self._map(actions, None if self.stats is None else self.stats.actions)

    def unnormalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """Model-space actions [..., A] -> robot units (dimensions beyond the statistics unchanged)."""
        return self._map(actions, None if self.stats is None else self.stats.actions, inverse=True)
