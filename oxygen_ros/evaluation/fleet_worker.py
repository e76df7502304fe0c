"""One fleet worker: evaluates bags one by one with a policy it loads once. The same class runs in-process (no Ray)
and as a Ray actor (``ray.remote(FleetWorker)``), so both paths run the same code.

Each bag's result is independent of the others and of the order (every run builds a fresh frame runner: noise
seeded by frame index, a new engine). A bag that cannot be read or evaluated gives a ``failed`` result with the
reason instead of raising. A bag whose cache key (the run's parameters + the bag's content digest) is in
``done_keys`` is not evaluated again (``cached``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["CACHE_VERSION", "FleetWorker", "bag_digest", "cache_key", "run_key"]

logger = logging.getLogger(__name__)

CACHE_VERSION = 2  # bump when a change to the evaluation or the scores invalidates cached results
# 2: the bag clock's delay model (timing.py) replaced the measured RTC delay, k_auto and kernels: auto


def bag_digest(bag: Path) -> str:
    """sha256 of a bag's content: every file of the bag directory (relative name, size, bytes) in name order, or
    the one storage file.

    Raises:
        FileNotFoundError: nothing at ``bag``.
    """
    bag = Path(bag)
    if not bag.exists():
        raise FileNotFoundError(f"{bag} does not exist")
    files = sorted(p for p in bag.rglob("*") if p.is_file()) if bag.is_dir() else [bag]
    h = hashlib.sha256()
    for path in files:
        h.update(f"{path.relative_to(bag) if bag.is_dir() else path.name}\0{path.stat().st_size}\0".encode())
        with path.open("rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    return h.hexdigest()


def run_key(settings: Mapping[str, Any]) -> str:
    """sha256 of everything but the bag that decides a bag's result (node parameters, scoring options, topics,
    frame limit) and :data:`CACHE_VERSION`."""
    text = json.dumps({"version": CACHE_VERSION, **settings}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def cache_key(run: str, digest: str) -> str:
    """A bag's cache key: the run key and the bag digest."""
    return hashlib.sha256(f"{run}:{digest}".encode()).hexdigest()


class FleetWorker:
    """Evaluates bags with the node parameters ``params`` and :func:`~oxygen_ros.evaluation.run.evaluate_bag`'s
    keyword arguments ``options`` (``scoring``, ``max_frames``, topics), loading the policy on its first bag.

    Args:
        params: the node parameters (a mapping).
        options: evaluate_bag keyword arguments (``scoring`` as a dict of ScoringOptions fields).
        run: :func:`run_key` of the settings. done_keys: cache keys of bags already evaluated.
    """

    def __init__(self, params: Mapping[str, Any], options: Mapping[str, Any], run: str,
                 done_keys: Iterable[str] = ()) -> None:
        from .reference import ScoringOptions
        from .run import PolicyCache

        self.params, self.run, self.done_keys = dict(params), run, frozenset(done_keys)
        self.options = dict(options)
        scoring = self.options.get("scoring")
        if isinstance(self.options.get("timing"), Mapping):
            from .timing import ReplayTiming

            self.options["timing"] = ReplayTiming(**self.options["timing"])
        if isinstance(scoring, Mapping):
            self.options["scoring"] = ScoringOptions(**{**scoring, "reference_joints": tuple(
                scoring.get("reference_joints", ()))})
        self.policies = PolicyCache()
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def evaluate(self, bag: str) -> dict[str, Any]:
        """One bag: ``{"bag", "status": ok | cached | failed, "digest", "key", "worker", "wall_s"}`` plus
        ``report`` (ok; its ``outputs`` section dropped: the output bag went to a temporary directory) or
        ``reason`` (failed)."""
        from .run import evaluate_bag

        t0 = time.perf_counter()
        result: dict[str, Any] = {"bag": str(bag), "worker": self.name, "digest": None, "key": None}
        try:
            result["digest"] = bag_digest(Path(bag))
            result["key"] = cache_key(self.run, result["digest"])
            if result["key"] in self.done_keys:
                return {**result, "status": "cached", "wall_s": time.perf_counter() - t0}
            with tempfile.TemporaryDirectory(prefix="oxygen_fleet_") as tmp:
                report = evaluate_bag(bag, Path(tmp) / "out", self.params, plots=False, progress=False,
                                      policies=self.policies, **self.options)
        except Exception as e:  # a corrupt or unreadable bag (or one the parameters do not fit): its own row
            logger.warning("%s failed: %s: %s", bag, type(e).__name__, e)
            return {**result, "status": "failed", "reason": f"{type(e).__name__}: {e}",
                    "wall_s": time.perf_counter() - t0}
        report.pop("outputs", None)
        return {**result, "status": "ok", "report": report, "wall_s": time.perf_counter() - t0}

    def close(self) -> None:
        """Release the loaded policy."""
        self.policies.close()
