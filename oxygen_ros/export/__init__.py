"""Recorded runs -> LeRobot datasets (``oxygen-export-lerobot``), without ROS at run time (rosbags) and without
LeRobot: the contract (:mod:`.contract`), a bag's episodes on a fixed frame clock with the node's language rows
(:mod:`.episode`), LeRobot's statistics (:mod:`.stats`), the v3.0 writer (:mod:`.writer`), bags on Ray
(:mod:`.exporter`), a demo bag with the node's outputs (:mod:`.demo`), the command line (:mod:`.cli`)."""

from oxygen_ros._lazy import lazy_exports

_EXPORTS = {"Contract": "contract", "load_contract": "contract", "contract_from_preset": "contract",
            "export_bags": "exporter", "read_episodes": "episode", "write_dataset": "writer",
            "make_export_demo_bag": "demo"}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
