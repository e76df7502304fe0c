"""Robot adapters: fixed conversions between a robot's joint space and the space a checkpoint was trained in.

``aloha`` is openpi's ALOHA adapter (``aloha_policy.py`` with ``adapt_to_pi=True``): joints 1, 2, 8, 9 are
flipped, and the grippers (dims 6 and 13) convert between ALOHA's linear opening and pi's angular convention, on
the state going in and on the actions coming out.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["ADAPTERS", "decode_actions", "decode_state", "encode_actions"]

ADAPTERS = ("none", "aloha")
_FLIP = np.array([1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1])
_GRIPPERS = [6, 13]


def _normalize(x, lo, hi):
    return (x - lo) / (hi - lo)


def _unnormalize(x, lo, hi):
    return x * (hi - lo) + lo


def _gripper_to_angular(value: np.ndarray) -> np.ndarray:
    value = _unnormalize(value, 0.01844, 0.05800)
    arm, horn = 0.036, 0.022
    value = np.arcsin(np.clip((horn**2 + value**2 - arm**2) / (2 * horn * value), -1.0, 1.0))
    return _normalize(value, 0.5476, 1.6296)


def _gripper_from_angular(value: np.ndarray) -> np.ndarray:
    return _normalize(value + 0.5476, -0.6213, 1.4910)


def decode_state(state: np.ndarray, adapter: str) -> np.ndarray:
    """Robot state -> the checkpoint's state space."""
    return _convert(state, adapter, _aloha_state_to_pi)


def encode_actions(actions: np.ndarray, adapter: str) -> np.ndarray:
    """Actions [H, D] in the checkpoint's space -> the robot's."""
    return _convert(actions, adapter, _aloha_actions_from_pi)


def decode_actions(actions: np.ndarray, adapter: str) -> np.ndarray:
    """Actions [T, D] in the robot's space -> the checkpoint's (the inverse of :func:`encode_actions`)."""
    return _convert(actions, adapter, _aloha_actions_to_pi)


def _convert(x: np.ndarray, adapter: str, aloha: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``x`` unchanged (``none``) or through ``aloha`` (``aloha``: 14 dims checked first)."""
    if adapter == "none":
        return x
    if adapter == "aloha":
        _check(x.shape[-1])
        return aloha(x)
    raise ValueError(f"unknown robot adapter {adapter!r}; known: {ADAPTERS}")


def _aloha_state_to_pi(state: np.ndarray) -> np.ndarray:
    state = _FLIP * state
    state[..., _GRIPPERS] = _gripper_to_angular(state[..., _GRIPPERS])
    return state


def _aloha_actions_from_pi(actions: np.ndarray) -> np.ndarray:
    actions = _FLIP * actions
    actions[..., _GRIPPERS] = _gripper_from_angular(actions[..., _GRIPPERS])
    return actions


def _aloha_actions_to_pi(actions: np.ndarray) -> np.ndarray:
    actions = np.array(actions, dtype=np.float64)
    actions[..., _GRIPPERS] = _unnormalize(actions[..., _GRIPPERS], -0.6213, 1.4910) - 0.5476
    return _FLIP * actions


def _check(dim: int) -> None:
    if dim != 14:
        raise ValueError(f"the aloha adapter needs 14 dims (2 x (6 joints + gripper)), got {dim}")
