"""Between the world and the model for training: fitting and writing the norm stats, delta actions, prompts and
model observations.

Model-space actions are the world's absolute joint targets (``DELTA_MASK`` marks none as deltas; openpi's delta
convention is supported for other recipes), quantile-normalised to about [-1, 1] with ``norm_stats.json`` (openpi's
format). The arithmetic is the policy layer's (:mod:`oxygen_ros.policy.normalize`, openpi convention, and
:func:`oxygen_ros.policy.images.pixels_to_model`), so training and every inference path agree by construction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from oxygen_ros.engine import Observation
from oxygen_ros.engine.tokenizer import PromptTokenizer
from oxygen_ros.policy.images import pixels_to_model
from oxygen_ros.policy.normalize import normalize, unnormalize
from oxygen_ros.policy.spec import FeatureNorm
from oxygen_ros.toy.world.tabletop import CAMERAS, WorldObservation

__all__ = ["DELTA_MASK", "NORM_STATS_NAME", "NormStats", "episode_noise", "images_to_model", "prompt_batch",
           "to_model_observation"]

NORM_STATS_NAME = "norm_stats.json"
DELTA_MASK = np.array([False, False, False, False])  # absolute targets (True: relative to the chunk's start state)


def _quantiles(x: np.ndarray) -> dict[str, list[float]]:
    x = x.reshape(-1, x.shape[-1]).astype(np.float64)
    return {"mean": x.mean(0).tolist(), "std": x.std(0).tolist(), "q01": np.quantile(x, 0.01, axis=0).tolist(),
            "q99": np.quantile(x, 0.99, axis=0).tolist()}


@dataclass(frozen=True)
class NormStats:
    """Quantile statistics of the robot state and of the (delta) actions, as in openpi's norm_stats.json."""

    state: dict[str, list[float]]
    actions: dict[str, list[float]]

    @staticmethod
    def fit(states: np.ndarray, world_actions: np.ndarray) -> NormStats:
        """Statistics of states [N, D] and absolute world action chunks [N, H, D]."""
        return NormStats(_quantiles(states), _quantiles(delta_actions(world_actions, states)))

    def save(self, directory: Path) -> Path:
        path = Path(directory) / NORM_STATS_NAME
        path.write_text(json.dumps({"norm_stats": {"state": self.state, "actions": self.actions}}, indent=2))
        return path

    @staticmethod
    def load(directory: Path) -> NormStats:
        data = json.loads((Path(directory) / NORM_STATS_NAME).read_text())["norm_stats"]
        return NormStats(data["state"], data["actions"])

    @staticmethod
    def _norm(s: dict) -> FeatureNorm:
        return FeatureNorm("quantiles", {"q01": np.asarray(s["q01"], np.float64),
                                         "q99": np.asarray(s["q99"], np.float64)}, "openpi", 1e-6)

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        """Joint state [..., D] -> about [-1, 1]."""
        return normalize(np.asarray(state, np.float64), self._norm(self.state)).astype(np.float32)

    def actions_to_model(self, world_actions: np.ndarray, state: np.ndarray) -> np.ndarray:
        """Absolute world chunks [..., H, D] starting at ``state`` [..., D] -> normalised model actions."""
        return normalize(delta_actions(world_actions, state), self._norm(self.actions)).astype(np.float32)

    def actions_from_model(self, model_actions: np.ndarray, state: np.ndarray) -> np.ndarray:
        """Model actions [H, >=D] (first D used) at ``state`` [D] -> absolute world actions [H, D]."""
        d = len(self.actions["q01"])
        out = unnormalize(np.asarray(model_actions, np.float64)[..., :d], self._norm(self.actions))
        return out + np.where(DELTA_MASK, np.asarray(state, np.float64), 0.0)[..., None, :]


def delta_actions(world_actions: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Absolute chunks [..., H, D] -> openpi delta actions (x, y, z minus the chunk's start state)."""
    return world_actions - np.where(DELTA_MASK, state, 0.0)[..., None, :]


def images_to_model(images: np.ndarray) -> torch.Tensor:
    """uint8 [..., C, S, S, 3] -> float32 [..., C, 3, S, S] in [-1, 1] (the policy layer's conversion)."""
    return pixels_to_model(images)


def prompt_batch(tok: PromptTokenizer, instructions: list[str], norm_states: np.ndarray,
                 subtasks: list[str | None] | None = None):
    """Tokenised pi0.5 action prompts: int64 ids [B, L] and bool mask [B, L] (``subtasks``: each prompt's
    subtask condition, None for the unconditioned prompt)."""
    subtasks = subtasks or [None] * len(instructions)
    prompts = [tok.tokenize_action_prompt(i, s, clip_state=True, subtask=t)
               for i, s, t in zip(instructions, norm_states, subtasks, strict=True)]
    ids = torch.from_numpy(np.stack([p.ids for p in prompts]))
    return ids, torch.from_numpy(np.stack([p.mask for p in prompts]))


def to_model_observation(obs: WorldObservation, tok: PromptTokenizer, stats: NormStats,
                         subtask: str | None = None) -> Observation:
    """One world observation as a model batch of one (cameras in :data:`CAMERAS` order; ``subtask`` conditions the
    action prompt)."""
    images = images_to_model(np.stack([obs.images[c] for c in CAMERAS])[None])
    norm_state = stats.normalize_state(obs.state)[None]
    ids, mask = prompt_batch(tok, [obs.instruction], norm_state, [subtask])
    return Observation(images, torch.ones(1, len(CAMERAS), dtype=torch.bool), ids, mask,
                       torch.from_numpy(norm_state))


def episode_noise(seed: int, frame: int, horizon: int, action_dim: int) -> torch.Tensor:
    """The flow-matching noise x_1 [1, H, A] of one frame, fixed by (episode seed, frame) so every engine mode
    sees the same noise."""
    gen = torch.Generator().manual_seed(seed * 1009 + frame)
    return torch.randn(1, horizon, action_dim, generator=gen)
