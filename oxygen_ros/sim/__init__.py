"""The tabletop simulator as a ROS 2 node, the robot of the closed-loop demo: :mod:`.node` (the node and ``main``;
``python -m oxygen_ros.sim``, ``ros2 run oxygen_ros tabletop_sim``), :mod:`.chunks` (when each action of a chunk is
due, chunk validation) and :mod:`.scoring` (episode records, counters, memory truth).

``chunks`` and ``scoring`` are ROS-free; the names below load their module on first use, so only the node's need
rclpy and the built messages.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "TabletopSimNode": "node", "main": "node",
    "aligned_actions": "chunks", "chunk_problem": "chunks", "chunk_start_index": "chunks",
    "EpisodeRecord": "scoring", "MemoryTruth": "scoring", "SimCounters": "scoring",
}

__all__ = sorted(_MODULES)


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULES[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULES))
