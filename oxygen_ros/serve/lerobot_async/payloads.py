"""LeRobot async inference's payload classes, as this package's own dataclasses: ``TimedObservation``,
``TimedAction``, ``RemotePolicyConfig``, ``PolicyFeature`` and ``FeatureType``, and the global names LeRobot's pickles
give them (:data:`CLASSES`). Their state is set field by field, exactly the known fields (:meth:`Payload.__setstate__`).
"""

from __future__ import annotations

import enum
from dataclasses import MISSING, dataclass, field, fields

import torch

__all__ = ["CLASSES", "MAX_TENSOR_DIMS", "NAMES", "FeatureType", "Payload", "PayloadError", "PolicyFeature",
           "RemotePolicyConfig", "TimedAction", "TimedObservation"]

MAX_TENSOR_DIMS = 8
HELPERS = "lerobot.async_inference.helpers"
TYPES = "lerobot.configs.types"


class PayloadError(ValueError):
    """A payload refused: not a pickle, a class or function outside the allow-list, malformed state, too deep."""



class Payload:
    """Base of the payload dataclasses: built by NEWOBJ + BUILD with a dict state of exactly known fields."""

    def __setstate__(self, state: object) -> None:
        if not isinstance(self, Payload):  # BUILD on the class object itself
            raise PayloadError("BUILD on a class refused")
        names = {f.name for f in fields(self)}  # type: ignore[arg-type]
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise PayloadError(f"{type(self).__name__}: state must be a dict of field names")
        unknown = sorted(set(state) - names)
        if unknown:
            raise PayloadError(f"{type(self).__name__}: unknown field(s) {unknown}")
        for f in fields(self):  # type: ignore[arg-type]
            if f.name in state:
                object.__setattr__(self, f.name, state[f.name])
            elif f.default_factory is not MISSING:
                object.__setattr__(self, f.name, f.default_factory())
            elif f.default is not MISSING:
                object.__setattr__(self, f.name, f.default)
            else:
                raise PayloadError(f"{type(self).__name__}: missing field {f.name!r}")


@dataclass(eq=False)
class TimedObservation(Payload):
    """LeRobot's ``TimedObservation``: the robot's raw observation dict (motor values, camera images, ``task``)."""

    timestamp: float
    timestep: int
    observation: dict
    must_go: bool = False


@dataclass(eq=False)
class TimedAction(Payload):
    """LeRobot's ``TimedAction``: one action [action_dim] (a float32 tensor) for ``timestep``."""

    timestamp: float
    timestep: int
    action: torch.Tensor


@dataclass(eq=False)
class RemotePolicyConfig(Payload):
    """LeRobot's ``RemotePolicyConfig`` (``SendPolicyInstructions``)."""

    policy_type: str
    pretrained_name_or_path: str
    lerobot_features: dict
    actions_per_chunk: int
    device: str = "cpu"
    rename_map: dict = field(default_factory=dict)


class FeatureType(enum.Enum):
    """LeRobot's ``FeatureType`` (its values)."""

    STATE = "STATE"
    VISUAL = "VISUAL"
    ENV = "ENV"
    ACTION = "ACTION"
    REWARD = "REWARD"
    LANGUAGE = "LANGUAGE"

    def __setstate__(self, state: object) -> None:  # BUILD on the enum (its class object) would set attributes
        raise PayloadError("BUILD on FeatureType refused")


@dataclass(eq=False)
class PolicyFeature(Payload):
    """LeRobot's ``PolicyFeature`` (a feature's type and shape)."""

    type: FeatureType
    shape: tuple


CLASSES: dict[tuple[str, str], type] = {
    (HELPERS, "TimedObservation"): TimedObservation, (HELPERS, "TimedAction"): TimedAction,
    (HELPERS, "RemotePolicyConfig"): RemotePolicyConfig, (TYPES, "PolicyFeature"): PolicyFeature,
    (TYPES, "FeatureType"): FeatureType}
NAMES = {cls: key for key, cls in CLASSES.items()}
