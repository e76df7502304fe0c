"""One export worker: reads bags into episodes and encodes their videos (the same class runs in-process and as a
Ray actor, :mod:`.exporter`). It imports neither torch nor rclpy, so a Ray actor starts light."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from .contract import Contract
from .episode import ExportError, read_episodes
from .stats import image_stats
from .writer import encode_video, pick_codec

__all__ = ["ExportWorker"]

logger = logging.getLogger(__name__)


class ExportWorker:
    """Reads bags into episodes and encodes their videos into ``staging`` (the same class runs in-process and as
    a Ray actor). Returns the episodes without their frames (the videos are files) so results stay small."""

    def __init__(self, contract: Contract, staging: str) -> None:
        self.contract, self.staging = contract, Path(staging)
        self.codec = pick_codec(contract.video)

    def export(self, bag: str, slot: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        row: dict[str, Any] = {"bag": bag, "status": "ok", "episodes": [], "failed_episodes": []}
        try:
            for e, ep in enumerate(read_episodes(bag, self.contract)):
                if isinstance(ep, ExportError):
                    row["failed_episodes"].append({"episode": e, "reason": str(ep)})
                    continue
                videos = {}
                for key, frames in ep.images.items():
                    path = self.staging / f"{slot:05d}_{e:03d}" / f"{key}.mp4"
                    encode_video(frames, path, self.contract.fps, self.codec, self.contract.video)
                    videos[key] = str(path)
                # the frames stay here: their stats and shapes go back, the videos are files
                ep.image_stats, ep.image_shapes = image_stats(ep.images), ep.camera_shapes()
                ep.images = {}
                row["episodes"].append({"episode": ep, "videos": videos})
        except ExportError as exc:
            row.update(status="failed", reason=str(exc))
        except Exception as exc:  # an unexpected failure of one bag must not stop the others
            logger.exception("exporting %s failed", bag)
            row.update(status="failed", reason=f"{type(exc).__name__}: {exc}")
        if row["status"] == "ok" and not row["episodes"]:
            row.update(status="failed", reason="; ".join(f["reason"] for f in row["failed_episodes"]))
        row["wall_s"] = time.perf_counter() - t0
        return row
