"""Bags -> one LeRobotDataset: each bag read into its episodes (:mod:`.episode`), in this process or on Ray as the
fleet evaluation runs bags (:mod:`oxygen_ros.evaluation.fleet`: its bag finding and Ray start-up), then written in
bag order by :func:`.writer.write_dataset` (temp folder, then rename). A bag (or an episode) that cannot be
exported gets a ``failed`` row with the reason; the others are still exported. The report (``export.json`` beside
the dataset's ``meta/``) lists every bag: episodes, frames, frames dropped by reason, language rows, reasons.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from oxygen_ros.util.ray_pool import pool_results, ray_session

from .contract import Contract
from .episode import Episode, bag_parts
from .worker import ExportWorker
from .writer import write_dataset

__all__ = ["export_bags"]

logger = logging.getLogger(__name__)
_OBJECT_STORE_BYTES = 256 * 2**20


def _sequential(bags: Sequence[Path], contract: Contract, staging: Path) -> Iterator[dict[str, Any]]:
    worker = ExportWorker(contract, str(staging))
    for i, bag in enumerate(bags):
        yield worker.export(str(bag), i)


def _ray(bags: Sequence[Path], contract: Contract, staging: Path, workers: int | None,
         address: str | None) -> Iterator[dict[str, Any]]:
    with ray_session(address, _OBJECT_STORE_BYTES) as ray:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        n = max(1, min(workers or cpus, len(bags)))
        actor = ray.remote(ExportWorker).options(num_cpus=1, max_restarts=0)
        actors = [actor.remote(contract, str(staging)) for _ in range(n)]
        yield from pool_results(actors, [(str(bag), (str(bag), i)) for i, bag in enumerate(bags)],
                                lambda a, v: a.export.remote(*v), _worker_died)


def _worker_died(bag: str, error: str) -> dict[str, Any]:
    logger.error("an export worker died (%s): %s", bag, error)
    return {"bag": bag, "status": "failed", "reason": "worker died", "episodes": [], "failed_episodes": []}


def export_bags(bags: Sequence[str | Path], contract: Contract, out: Path | str, *, use_ray: bool | None = False,
                workers: int | None = None, ray_address: str | None = None,
                progress: bool | None = None) -> dict[str, Any]:
    """Export ``bags`` (bags, folders of bags or globs; one episode per bag, or per ``episode_topic`` segment)
    into the dataset ``out``. ``use_ray``: True runs the bags on Ray actors; None: on Ray when it is installed and
    there are several bags; False: in this process. Returns the report (also written to
    ``<out>/meta/export.json`` when any episode was written); ``report["written"]`` is False when no bag gave an
    episode (nothing is written then)."""
    from oxygen_ros.evaluation.fleet import find_bags, ray_available  # the driver's only (it loads torch)

    paths = []
    for item in bags:  # A+B: one recording in several bags (episode.bag_parts), each part must be one bag
        parts = bag_parts(item)
        if len(parts) > 1:
            found = [find_bags([p]) for p in parts]
            if any(len(f) != 1 for f in found):
                raise FileNotFoundError(f"{item}: each part of A+B must be one bag")
            paths.append(Path("+".join(str(f[0]) for f in found)))
        else:
            paths.extend(find_bags([item]))
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; choose a new folder")
    if use_ray is None:  # Ray pays its start-up (seconds) only for several bags
        use_ray = bool(ray_address) or (ray_available() and len(paths) > 1)
    t0 = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging.", dir=out.parent))
    try:
        it = _ray(paths, contract, staging, workers, ray_address) if use_ray else _sequential(paths, contract, staging)
        results = {}
        for r in tqdm(it, total=len(paths), desc="exporting", unit="bag",
                      disable=not (progress if progress is not None else len(paths) > 1)):
            results[r["bag"]] = r
        rows = [results[str(p)] for p in paths]
        episodes: list[Episode] = [e["episode"] for r in rows for e in r["episodes"]]
        videos = [{k: Path(v) for k, v in e["videos"].items()} for r in rows for e in r["episodes"]]
        summary: dict[str, Any] = {"written": False}
        if episodes:
            summary = {"written": True, **write_dataset(episodes, out, contract.fps, contract.robot_type,
                                                        contract.video, videos_done=videos)}
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report = {
        "out": str(out), "engine": "ray" if use_ray else "sequential", "wall_s": time.perf_counter() - t0,
        **summary, "contract": contract.to_dict(),
        "bags": [{"bag": r["bag"], "status": r["status"], "reason": r.get("reason"), "wall_s": r.get("wall_s"),
                  "failed_episodes": r["failed_episodes"],
                  "episodes": [{"frames": e["episode"].length, "dropped": dict(e["episode"].dropped),
                                "bag_duration_s": e["episode"].bag_duration_s,
                                "persistent_rows": len(e["episode"].persistent),
                                "event_rows": sum(len(v) for v in e["episode"].events.values()),
                                "language_unmatched": e["episode"].language_unmatched} for e in r["episodes"]]}
                 for r in rows],
    }
    report["failed"] = [b["bag"] for b in report["bags"] if b["status"] != "ok"]
    if summary["written"]:
        (out / "meta" / "export.json").write_text(json.dumps(report, indent=2))
    return report
