"""The tabletop simulator as a ROS 2 node, the robot of the closed-loop demo: :mod:`.node` (the node and ``main``;
``python -m oxygen_ros.toy.sim``, ``ros2 run oxygen_ros tabletop_sim``), :mod:`.chunks` (when each action of a chunk is
due, chunk validation), :mod:`.setpoints` (the setpoint-stream input, e.g. from the chunk executor) and
:mod:`.scoring` (episode records, counters, the language truth of every observation).

``chunks``, ``setpoints`` and ``scoring`` are ROS-free; the names below load their module on first use, so only the
node's need rclpy and the built messages.
"""

from oxygen_ros._lazy import lazy_exports

_EXPORTS = {
    "TabletopSimNode": "node", "main": "node",
    "aligned_actions": "chunks", "chunk_problem": "chunks", "chunk_start_index": "chunks",
    "EpisodeRecord": "scoring", "MemoryTruth": "scoring", "SimCounters": "scoring", "TaskScore": "scoring",
    "scene_truth": "scoring",
    "SETPOINT_TYPES": "setpoints", "setpoint_from_array": "setpoints", "setpoint_from_joint_state": "setpoints",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
