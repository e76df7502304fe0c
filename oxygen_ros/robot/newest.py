"""The per-publisher filter (:class:`NewestPerPublisher`): a subscriber on both a transient-local and a volatile
subscription keeps only each publisher's newest message (the node's instruction and halt, the executor's chunks).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["NewestPerPublisher"]


class NewestPerPublisher:
    """Drops a message not newer than the last one taken from the same publisher (a subscriber on both a
    transient-local and a volatile subscription receives a latched publisher's messages twice, the late duplicate
    possibly after a newer message). ``info``: rclpy's message info."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq: dict[str, int] = {}

    def is_new(self, info: Mapping[str, Any] | None) -> bool:
        gid = None if info is None else info.get("publisher_gid")
        seq = None if info is None else info.get("publication_sequence_number")
        if gid is None or seq is None:
            return True
        key = repr(gid.get("data", gid) if isinstance(gid, Mapping) else gid)
        with self._lock:
            if seq <= self._seq.get(key, -1):
                return False
            self._seq[key] = int(seq)
        return True
