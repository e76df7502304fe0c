"""How two predictions for one time step merge when chunks overlap (``switch: aggregate``).

LeRobot's async inference (``lerobot/async_inference/configs.py``, ``AGGREGATE_FUNCTIONS``) merges the queued
value (``old``, itself the result of earlier merges) with the incoming one (``new``) pairwise:

- ``weighted_average``: 0.3 old + 0.7 new (LeRobot's default)
- ``average``: 0.5 old + 0.5 new
- ``conservative``: 0.7 old + 0.3 new
- ``latest_only``: new

ACT's temporal ensembling (Zhao et al. 2023; LeRobot's ``ACTTemporalEnsembler``) averages every prediction made for
a step with weights ``exp(-m * i)``, i = 0 for the oldest: kept online as a running weighted mean and the number of
predictions merged so far (``temporal_ensemble(m)``, e.g. ``temporal_ensemble(0.01)``, ACT's coefficient).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

__all__ = ["AGGREGATE_NAMES", "Aggregator", "parse_aggregate"]

# LeRobot's pairwise rules: (weight of old, weight of new)
_PAIRWISE = {"weighted_average": (0.3, 0.7), "average": (0.5, 0.5), "conservative": (0.7, 0.3),
             "latest_only": (0.0, 1.0)}
AGGREGATE_NAMES = (*_PAIRWISE, "temporal_ensemble(m)")
_ENSEMBLE_RE = re.compile(r"^temporal_ensemble(?:\(\s*([-+0-9.eE]+)\s*\))?$")
DEFAULT_ENSEMBLE_M = 0.01  # ACT's temporal_ensemble_coeff


@dataclass(frozen=True)
class Aggregator:
    """One merge rule: ``merge(old, count, new)`` -> (merged value, predictions merged). ``count``: how many
    predictions ``old`` already merges (1 for a value from one chunk)."""

    name: str
    old_weight: float = 0.0
    new_weight: float = 1.0
    ensemble_m: float | None = None  # temporal_ensemble's m (None: a pairwise rule)

    def merge(self, old: np.ndarray, count: np.ndarray | int, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Merge rows ``old`` [N, D] (each the merge of ``count`` [N] predictions) with ``new`` [N, D]."""
        old, new = np.asarray(old, np.float64), np.asarray(new, np.float64)
        n = np.broadcast_to(np.asarray(count, dtype=np.int64), old.shape[:1]).copy()
        if self.ensemble_m is None:
            return self.old_weight * old + self.new_weight * new, n + 1
        m = self.ensemble_m
        # weights exp(-m i), i = 0 the oldest: the old mean carries sum_{i<n} w_i, the new prediction w_n
        w_old = _ensemble_weight_sum(m, n)
        w_new = np.exp(-m * n.astype(np.float64))
        return ((old * w_old[:, None] + new * w_new[:, None]) / (w_old + w_new)[:, None]), n + 1


def _ensemble_weight_sum(m: float, n: np.ndarray) -> np.ndarray:
    """sum_{i=0}^{n-1} exp(-m i) per entry of ``n``."""
    n = n.astype(np.float64)
    if m == 0:
        return n
    return (1.0 - np.exp(-m * n)) / (1.0 - math.exp(-m))


def parse_aggregate(text: str) -> Aggregator:
    """The rule named by the ``aggregate`` parameter (see the module docstring).

    Raises:
        ValueError: an unknown name or a malformed ``temporal_ensemble(m)``.
    """
    name = text.strip()
    if name in _PAIRWISE:
        old, new = _PAIRWISE[name]
        return Aggregator(name, old, new)
    match = _ENSEMBLE_RE.match(name)
    if match:
        try:
            m = DEFAULT_ENSEMBLE_M if match.group(1) is None else float(match.group(1))
        except ValueError:
            m = float("nan")
        if math.isfinite(m):
            return Aggregator(f"temporal_ensemble({m:g})", ensemble_m=m)
    raise ValueError(f"aggregate: one of {', '.join(AGGREGATE_NAMES)}; got {text!r}")
