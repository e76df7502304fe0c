"""A toy tabletop world for closed-loop evaluation of pi0.5: numpy simulation, rendering and a scripted expert."""

from .expert import expert_action, expert_chunk, expert_subtask, run_expert
from .tabletop import CAMERAS, JOINT_NAMES, TabletopWorld, WorldConfig, WorldObservation, WorldState

__all__ = [
    "CAMERAS",
    "JOINT_NAMES",
    "TabletopWorld",
    "WorldConfig",
    "WorldObservation",
    "WorldState",
    "expert_action",
    "expert_chunk",
    "expert_subtask",
    "run_expert",
]
