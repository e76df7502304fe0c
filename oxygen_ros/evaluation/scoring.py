"""Scores against the recording: each predicted chunk against what the robot was commanded over the same future
steps (the open-loop figure LeRobot and openpi users compute on their datasets), and each language output against
the annotation valid at its observation's time.

Actions (:func:`score_chunks`): chunk action ``i`` is compared with the reference at ``stamp + (i + 1) * dt``
(:mod:`.alignment`, linear interpolation); steps outside the reference's span are left out (a chunk running past the
recording's end is scored on its covered steps; ``uncovered_chunks`` counts the chunks with none). Reported: MAE and
MSE overall, per joint, per horizon step and per step and joint; the first action's error; the executed part (the
first ``n_execute`` actions, what the node publishes) and the whole chunk; the fraction of chunks whose largest
absolute error over the executed part (or the whole chunk) is within ``tolerance``; per chunk, its MAE. The sums
behind the means are kept (``sums``) so that a fleet pools bags exactly.

Language (:func:`score_language`): per stream, exact match (texts stripped) and the normalised edit distance
(Levenshtein distance / the longer text's length; 0 = equal, 1 = nothing in common) against the latest annotation
at or before the output's observation stamp. Outputs older than the first annotation are counted as unannotated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .alignment import Annotations, ReferenceSeries, action_times

__all__ = ["ChunkRecord", "edit_distance", "normalized_edit_distance", "score_chunks",
           "score_language"]


@dataclass(frozen=True)
class ChunkRecord:
    """A predicted chunk: its frame, observation stamp (ns) and actions [H, D] in robot units."""

    frame: int
    stamp_ns: int
    actions: np.ndarray


def _mean(total: float, count: int) -> float | None:
    return float(total / count) if count else None


def _means(total: np.ndarray, count: np.ndarray) -> list[float | None]:
    return [float(t / c) if c else None for t, c in zip(total.reshape(-1), count.reshape(-1), strict=True)]


def score_chunks(chunks: Sequence[ChunkRecord], action_names: Sequence[str], reference: ReferenceSeries,
                 joints: Sequence[str], dt_s: float, n_execute: int, tolerance: float) -> dict[str, Any]:
    """Scores of ``chunks`` against ``reference`` on ``joints`` (names present in both ``action_names`` and the
    reference). ``dt_s``: seconds between actions; ``n_execute``: the executed part's length.

    Raises:
        KeyError: a joint missing from the actions or the reference. ValueError: dt_s <= 0.
    """
    if dt_s <= 0:
        raise ValueError(f"dt_s must be positive, got {dt_s}")
    missing = [j for j in joints if j not in action_names]
    if missing:
        raise KeyError(f"joints {missing} are not among the action names {list(action_names)}")
    ref = reference.select(joints)
    cols = [list(action_names).index(j) for j in joints]
    horizon = max((c.actions.shape[0] for c in chunks), default=0)
    n_j, dt_ns = len(joints), round(dt_s * 1e9)
    abs_sum, sq_sum = np.zeros((horizon, n_j)), np.zeros((horizon, n_j))
    count = np.zeros(horizon, np.int64)
    per_chunk: list[dict[str, Any]] = []
    first_abs, first_sq, first_n = np.zeros(n_j), np.zeros(n_j), 0
    parts = {"executed": [0.0, 0.0, 0, 0, 0], "chunk": [0.0, 0.0, 0, 0, 0]}  # abs, sq, values, chunks, within
    for c in chunks:
        h = c.actions.shape[0]
        target, covered = ref.at(action_times(c.stamp_ns, h, dt_ns))
        if not covered.any():
            continue
        err = np.asarray(c.actions, np.float64)[:, cols] - target  # [h, J], NaN where uncovered
        steps = np.flatnonzero(covered)
        abs_sum[steps] += np.abs(err[steps])
        sq_sum[steps] += err[steps] ** 2
        count[steps] += 1
        if covered[0]:
            first_abs += np.abs(err[0])
            first_sq += err[0] ** 2
            first_n += 1
        for name, limit in (("executed", min(n_execute, h)), ("chunk", h)):
            sel = steps[steps < limit]
            if sel.size:
                e = err[sel]
                acc = parts[name]
                acc[0] += float(np.abs(e).sum())
                acc[1] += float((e ** 2).sum())
                acc[2] += e.size
                acc[3] += 1
                acc[4] += int(np.abs(e).max() <= tolerance)
        per_chunk.append({"frame": c.frame, "stamp_ns": c.stamp_ns, "covered_steps": int(steps.size),
                          "mae": float(np.abs(err[steps]).mean()),
                          "first_mae": float(np.abs(err[0]).mean()) if covered[0] else None})
    values = int(count.sum()) * n_j
    per_joint_n = np.full(n_j, int(count.sum()))
    return {
        "joints": list(joints), "horizon": horizon, "n_execute": int(n_execute), "dt_s": dt_s,
        "tolerance": tolerance, "chunks": len(per_chunk), "uncovered_chunks": len(chunks) - len(per_chunk),
        "actions_scored": int(count.sum()),
        "mae": _mean(abs_sum.sum(), values), "mse": _mean(sq_sum.sum(), values),
        "mae_per_joint": _means(abs_sum.sum(0), per_joint_n), "mse_per_joint": _means(sq_sum.sum(0), per_joint_n),
        "mae_per_step": _means(abs_sum.sum(1), count * n_j), "mse_per_step": _means(sq_sum.sum(1), count * n_j),
        "mae_per_step_joint": [_means(abs_sum[i], np.full(n_j, count[i])) for i in range(horizon)],
        "count_per_step": count.tolist(),
        "first_action": {"chunks": first_n, "mae": _mean(first_abs.sum(), first_n * n_j),
                         "mse": _mean(first_sq.sum(), first_n * n_j),
                         "mae_per_joint": _means(first_abs, np.full(n_j, first_n))},
        **{name: {"chunks": acc[3], "mae": _mean(acc[0], acc[2]), "mse": _mean(acc[1], acc[2])}
           for name, acc in parts.items()},
        "within_tolerance": {name: _mean(acc[4], acc[3]) for name, acc in parts.items()},
        "sums": {"abs": abs_sum.tolist(), "sq": sq_sum.tolist(), "count": count.tolist()},
        "per_chunk": per_chunk,
    }


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance between ``a`` and ``b`` (characters; insertions, deletions, substitutions)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def normalized_edit_distance(a: str, b: str) -> float:
    """:func:`edit_distance` / the longer text's length (0.0 for two empty texts)."""
    return edit_distance(a, b) / max(len(a), len(b)) if a or b else 0.0


def score_language(items: Sequence[Mapping[str, Any]], annotations: Mapping[str, Annotations]) -> dict[str, Any]:
    """Per annotated stream: outputs scored, unannotated, exact matches, exact-match rate and mean normalised edit
    distance. ``items``: ``report["requests"]["items"]`` (dropped requests are ignored)."""
    out: dict[str, Any] = {}
    for stream, ann in annotations.items():
        mine = [r for r in items if r["stream"] == stream and not r["dropped"]]
        pairs = [(r["text"].strip(), truth.strip()) for r in mine if (truth := ann.at(r["stamp_ns"])) is not None]
        dist = [normalized_edit_distance(a, b) for a, b in pairs]
        exact = sum(a == b for a, b in pairs)
        out[stream] = {"topic": ann.topic, "annotations": len(ann.texts), "outputs": len(mine),
                       "scored": len(pairs), "unannotated": len(mine) - len(pairs), "exact": exact,
                       "exact_match": _mean(exact, len(pairs)), "edit_distance": _mean(sum(dist), len(pairs)),
                       "edit_distance_sum": float(sum(dist))}
    return out
