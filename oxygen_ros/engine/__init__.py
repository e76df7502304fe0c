"""The inference engine: pi0.5 with an engine-owned KV cache (pure torch, no ROS imports)."""

from .config import MODEL_CONFIGS, WORKLOAD_PRESETS, GemmaConfig, Pi05Config, VisionConfig, get_config
from .kv_cache import KVCache
from .model import Pi05Model, Prefix
from .modes import ENGINE_MODES, NODE_MODES, OVERFLOW_POLICIES, EngineConfig
from .observation import Observation

__all__ = [
    "ENGINE_MODES",
    "NODE_MODES",
    "OVERFLOW_POLICIES",
    "EngineConfig",
    "MODEL_CONFIGS",
    "WORKLOAD_PRESETS",
    "GemmaConfig",
    "KVCache",
    "Observation",
    "Pi05Config",
    "Pi05Model",
    "Prefix",
    "VisionConfig",
    "get_config",
]
