"""Between a robot's raw data and the engine: checkpoint formats, pre/post-processing, the frame runner.

Pure Python + torch, no ROS: the node, the bag evaluation and the toy evaluation are thin shells around it.
"""

from .errors import PolicyConfigError
from .formats import SpecOptions, detect_layout
from .policy import Policy, PreparedObservation, RawObservation, load_policy
from .spec import FeatureNorm, PolicySpec

__all__ = ["FeatureNorm", "Policy", "PolicyConfigError", "PolicySpec", "PreparedObservation", "RawObservation",
           "SpecOptions", "detect_layout", "load_policy"]
