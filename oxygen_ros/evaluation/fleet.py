"""Offline evaluation of a fleet's bags: every bag through :func:`~oxygen_ros.evaluation.run.evaluate_bag` with the
same parameters and scores, on Ray when it is installed, else sequentially in-process with the same code
(:class:`~oxygen_ros.evaluation.fleet_worker.FleetWorker`).

On Ray, one actor per worker loads the policy once and evaluates bags one by one (Ray's ``ActorPool`` hands them
out); an actor takes ``cpus_per_worker`` CPUs and, where the cluster has GPUs, one GPU. ``ray_address`` joins a
running cluster (its nodes need oxygen_ros installed and the bags at the same paths); without it a local Ray starts
for the run (and stops after it). Results come back to this process, which writes everything under ``out``:

- ``cache/<key>.json``: each finished bag's report, keyed by the run's settings and the bag's content digest
  (:func:`~oxygen_ros.evaluation.fleet_worker.cache_key`); a rerun skips those bags (failed bags are retried);
- ``fleet.json`` (:mod:`.fleet_report`): one row per bag (failed ones with their reason), the frame-weighted
  aggregates, the worst bags and the timing; ``fleet.md``: the same as a table; PNG plots.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from oxygen_ros.util.ray_pool import pool_results, ray_session

from .fleet_report import build_fleet_report, write_fleet_outputs
from .fleet_worker import FleetWorker, run_key
from .reference import ScoringOptions
from .run import INSTRUCTION_TOPIC, JOINT_STATES_TOPIC
from .timing import ReplayTiming

__all__ = ["CACHE_DIR", "evaluate_fleet", "find_bags", "is_bag", "ray_available"]

logger = logging.getLogger(__name__)

CACHE_DIR = "cache"
_OBJECT_STORE_BYTES = 128 * 2**20  # a local Ray's object store: results are reports of a few 100 kB


def is_bag(path: Path) -> bool:
    """A rosbag2 directory (metadata.yaml or a .db3 / .mcap file in it) or a single .db3 / .mcap file."""
    path = Path(path)
    if path.is_dir():
        return (path / "metadata.yaml").is_file() or any(path.glob("*.db3")) or any(path.glob("*.mcap"))
    return path.suffix in (".db3", ".mcap") and path.is_file()


def find_bags(items: Sequence[str | Path]) -> list[Path]:
    """The bags ``items`` name, in order, each once: a bag; a directory of bags (its bag subdirectories, sorted);
    or a glob pattern (``*``, ``?``, ``[``) matching either.

    Raises:
        FileNotFoundError: an item that matches nothing, or a directory without bags.
    """
    out: list[Path] = []
    for item in items:
        text = str(item)
        matches = [Path(m) for m in sorted(glob.glob(text))] if glob.has_magic(text) else [Path(text)]
        if not matches or not all(m.exists() for m in matches):
            raise FileNotFoundError(f"{item}: no such bag, directory or matching path")
        for m in matches:
            if is_bag(m):
                out.append(m)
            elif m.is_dir():
                found = sorted(p for p in m.iterdir() if is_bag(p))
                if not found and not glob.has_magic(text):
                    raise FileNotFoundError(f"{m}: a directory without bags")
                out.extend(found)
    seen: set[Path] = set()
    return [b for b in out if not (b.resolve() in seen or seen.add(b.resolve()))]


def ray_available() -> bool:
    """Whether Ray can be imported (the ``ray`` extra)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def _sequential(bags: Sequence[Path], worker_args: tuple) -> Iterator[dict[str, Any]]:
    worker = FleetWorker(*worker_args)
    try:
        for bag in bags:
            yield worker.evaluate(str(bag))
    finally:
        worker.close()


def _ray(bags: Sequence[Path], worker_args: tuple, workers: int | None, address: str | None,
         cpus_per_worker: float, gpus_per_worker: float | None, info: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Results from one Ray actor per worker; a bag whose actor died gets a failed result."""
    t0 = time.perf_counter()
    with ray_session(address, _OBJECT_STORE_BYTES) as ray:
        resources = ray.cluster_resources()
        gpus = float(resources.get("GPU", 0))
        device = str(worker_args[0].get("device", "auto"))
        if gpus_per_worker is None:
            gpus_per_worker = 1.0 if gpus >= 1 and device != "cpu" else 0.0
        if workers is None:
            by_cpu = int(float(resources.get("CPU", 1)) // cpus_per_worker)
            workers = int(gpus // gpus_per_worker) if gpus_per_worker else by_cpu
        workers = max(1, min(workers, len(bags)))
        actor = ray.remote(FleetWorker).options(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker,
                                                max_restarts=1, max_task_retries=0)
        actors = [actor.remote(*worker_args) for _ in range(workers)]
        info.update(engine="ray", workers=workers, cpus_per_worker=cpus_per_worker,
                    gpus_per_worker=gpus_per_worker, ray_address=address or "local",
                    cluster={k: v for k, v in resources.items() if k in ("CPU", "GPU", "memory")},
                    ray_init_s=time.perf_counter() - t0)
        yield from pool_results(actors, [(str(bag), str(bag)) for bag in bags], lambda a, b: a.evaluate.remote(b),
                                lambda bag, error: {"bag": bag, "status": "failed", "digest": None, "key": None,
                                                    "worker": None, "wall_s": None, "reason": f"worker died: {error}"})


def _row_names(bags: Sequence[Path]) -> list[str]:
    """Short unique names: the bag's own name, or its path below the bags' common folder where names repeat."""
    names = [b.name for b in bags]
    if len(set(names)) == len(names):
        return names
    resolved = [str(Path(b).resolve()) for b in bags]
    common = os.path.commonpath(resolved)
    return [os.path.relpath(r, common) for r in resolved]


def evaluate_fleet(
    bags: Sequence[str | Path],
    out: str | Path,
    params: Mapping[str, Any],
    *,
    scoring: ScoringOptions | None = None,
    max_frames: int | None = None,
    joint_states_topic: str = JOINT_STATES_TOPIC,
    instruction_topic: str = INSTRUCTION_TOPIC,
    use_ray: bool | None = None,
    ray_address: str | None = None,
    workers: int | None = None,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float | None = None,
    rerun: bool = False,
    plots: bool = True,
    progress: bool | None = None,
    timing: ReplayTiming | None = None,
) -> dict[str, Any]:
    """Evaluate and score every bag of ``bags`` (paths, directories of bags or glob patterns) into ``out``.

    Args:
        params: the node parameters (as for :func:`~oxygen_ros.evaluation.run.evaluate_bag`).
        scoring, max_frames, joint_states_topic, instruction_topic: as for ``evaluate_bag``, the same for every bag.
        use_ray: True: Ray (ImportError without it); False: sequentially in this process; None: Ray when
            installed. ray_address: a running cluster's address (implies Ray); None: a local Ray for this run.
        workers: Ray actors (None: one per GPU where the cluster has GPUs, else CPUs / ``cpus_per_worker``).
        cpus_per_worker, gpus_per_worker: each actor's Ray resources (GPUs None: 1 where the cluster has any
            and ``device`` is not cpu).
        rerun: evaluate bags found in the cache again.
        progress: a bar of bags done out of the total with an ETA (None: on a terminal).
        timing: the runs' clock (as for ``evaluate_bag``; default: the bag's clock, deterministic, so a bag's row
            is the same on Ray as sequentially and on a loaded host as on a quiet one).

    Returns:
        The fleet report (also ``out/fleet.json``; see :mod:`.fleet_report`).

    Raises:
        FileNotFoundError: an item naming no bag. ImportError: Ray asked for but not installed.
    """
    t0 = time.perf_counter()
    paths = find_bags(bags)
    out = Path(out)
    cache = out / CACHE_DIR
    cache.mkdir(parents=True, exist_ok=True)
    scoring = scoring or ScoringOptions()
    timing = timing or ReplayTiming()
    options = {"scoring": scoring.as_dict(), "max_frames": max_frames, "joint_states_topic": joint_states_topic,
               "instruction_topic": instruction_topic, "timing": dataclasses.asdict(timing)}
    run = run_key({"params": dict(params), **options})
    done = set() if rerun else {p.stem for p in cache.glob("*.json")}
    if not timing.deterministic:
        logger.warning("timing on the wall clock: the RTC delay (auto), k_auto and kernels (auto) follow the "
                       "measured timing, so results depend on the host's load")
    if use_ray is None:
        use_ray = bool(ray_address) or ray_available()
    worker_args = (dict(params), options, run, done)
    info: dict[str, Any] = {"engine": "sequential", "workers": 1}
    results = (_ray(paths, worker_args, workers, ray_address, cpus_per_worker, gpus_per_worker, info) if use_ray
               else _sequential(paths, worker_args))
    by_bag: dict[str, dict[str, Any]] = {}
    show = sys.stderr.isatty() if progress is None else progress
    with tqdm(total=len(paths), desc="bags", unit="bag", disable=not show) as bar:
        for r in results:
            if r["status"] == "ok":
                (cache / f"{r['key']}.json").write_text(json.dumps(
                    {"key": r["key"], "run": run, "bag": r["bag"], "digest": r["digest"], "report": r["report"]}))
            elif r["status"] == "cached":
                r["report"] = json.loads((cache / f"{r['key']}.json").read_text())["report"]
            by_bag[r["bag"]] = r
            bar.update()
            bar.set_postfix(failed=sum(x["status"] == "failed" for x in by_bag.values()), refresh=False)
    ordered = [by_bag[str(p)] for p in paths]
    info["wall_s"] = time.perf_counter() - t0
    fleet = build_fleet_report(ordered, _row_names(paths), params=dict(params), options=options, run=run,
                               timing=info)
    write_fleet_outputs(fleet, out, plots=plots)
    return fleet
