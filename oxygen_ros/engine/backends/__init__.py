"""The ways to run a stage, and the one point the engine's core picks them through.

- ``fused.py`` + ``fast_path.py`` + ``fusion.py``: the fused stages (the default stage runner);
- ``graphs.py`` (+ ``step_weights.py``, ``aot_steps.py``, ``compiled_store.py``): static-shape steps, eager,
  compiled, ahead-of-time compiled or captured as CUDA graphs;
- ``kernel_choice.py``, ``cpu_kernels.py``, ``packed_linear.py``: which matrix-product kernels a stage runs on;
- ``precision.py``: float32 / bfloat16 / openpi's bfloat16 with float32 islands.

The core (``model.py``, ``model_runner.py``) imports this package only, never its modules (pyproject.toml's
contract); a model picks its stage runner once, when it is built (:func:`make_stages`).
"""

from __future__ import annotations

from ..stages import EagerStages, Stages
from .fused import FusedStages, decode_tokens
from .graphs import FrameGraphs, resolve_backend
from .kernel_choice import StageTiming, choose, synthetic_observation, time_pair

__all__ = ["STAGES", "FrameGraphs", "StageTiming", "choose", "decode_tokens", "make_stages", "resolve_backend",
           "synthetic_observation", "time_pair"]

STAGES = ("fused", "eager")  # fused: the default; eager: the module-by-module reference the tests compare with


def make_stages(name: str = "fused") -> Stages:
    """The stage runner called ``name`` (``STAGES``)."""
    if name == "fused":
        return FusedStages()
    if name == "eager":
        return EagerStages()
    raise ValueError(f"stages must be one of {STAGES}, got {name!r}")
