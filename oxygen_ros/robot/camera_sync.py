"""Approximate-time camera synchronisation: pick one image per camera so that their stamps agree.

The reference behaviour is message_filters' ``ApproximateTime`` policy (not installable from PyPI): among the
candidate sets (one message per topic) choose the one with the smallest spread of stamps (newest minus oldest),
and accept it only when the spread is within a bound (``max_interval_duration``; here ``max_camera_skew_s``).
This is the small, tick-driven equivalent: at each control tick the candidates are the images each camera keeps
in its short buffer, and :func:`best_match` returns the best set: the smallest spread; among equal spreads the
newest set (largest newest stamp, then largest oldest stamp).

Pure Python, no ROS: the stamps are integers (nanoseconds).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Match", "best_match"]


@dataclass(frozen=True)
class Match:
    """The chosen set: ``indices[c]`` is the chosen position in camera ``c``'s stamp list."""

    indices: tuple[int, ...]
    spread_ns: int  # newest - oldest stamp of the set
    newest_ns: int
    oldest_ns: int

    def within(self, max_skew_ns: int) -> bool:
        """The spread is at most ``max_skew_ns`` (a negative bound accepts any spread: no synchronisation)."""
        return max_skew_ns < 0 or self.spread_ns <= max_skew_ns


def best_match(stamps: Sequence[Sequence[int]], after_ns: int | None = None) -> Match | None:
    """The best-matching set of one stamp per camera (smallest spread, then newest), or None when a camera has no
    candidate. Whether its spread is acceptable is the caller's :meth:`Match.within`.

    Args:
        stamps: per camera, its candidate stamps (any order).
        after_ns: only sets whose newest stamp is later than this (a set already acted on is never chosen again,
            nor an older one; None when no set qualifies).

    Every set's newest member is some candidate ``p``; for a fixed ``p`` the smallest spread takes from each other
    camera its newest stamp at or before ``p``. Trying every candidate as ``p`` therefore finds the optimum in
    O(n log n) for n candidates, without enumerating the product of the buffers.
    """
    if not stamps or any(len(s) == 0 for s in stamps):
        return None
    order = [sorted(range(len(s)), key=s.__getitem__) for s in stamps]  # positions by ascending stamp
    ordered = [[s[i] for i in o] for s, o in zip(stamps, order, strict=True)]
    best: tuple[int, int, int] | None = None  # (spread, -newest, -oldest): smaller is better
    best_picks: list[int] = []
    for cam_stamps in ordered:
        for pivot in cam_stamps:
            if after_ns is not None and pivot <= after_ns:
                continue
            picks = [bisect_right(other, pivot) - 1 for other in ordered]  # newest at or before the pivot
            if min(picks) < 0:
                continue  # a camera has nothing this old: no set has this pivot as its newest member
            oldest = min(other[j] for other, j in zip(ordered, picks, strict=True))
            key = (pivot - oldest, -pivot, -oldest)
            if best is None or key < best:
                best, best_picks = key, picks
    if best is None:
        return None
    return Match(tuple(o[j] for o, j in zip(order, best_picks, strict=True)), best[0], -best[1], -best[2])
