"""Demonstrations from the scripted expert, collected DART-style, and training batches for pi0.5.

Each sample is one control step: both camera images, the joint state, the instruction, the expert's next action
chunk from that state and the ground-truth memory text. The executed actions are the expert's with noise (and rare
gripper slips), so the data covers the states a learned policy drifts into, always labelled by the clean expert.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from oxygen_ros.engine import Observation
from oxygen_ros.engine.tokenizer import PromptTokenizer
from oxygen_ros.world import CAMERAS, TabletopWorld, WorldConfig, expert_chunk, expert_subtask

from .object_maps import object_maps
from .policy import NormStats, images_to_model, prompt_batch

__all__ = ["LANGUAGE_TASKS", "Batch", "Demonstrations", "collect", "make_batch"]


@dataclass
class Demonstrations:
    """N samples as parallel arrays (images stored as uint8)."""

    images: np.ndarray  # uint8 [N, C, S, S, 3]
    states: np.ndarray  # float32 [N, D]
    actions: np.ndarray  # float32 [N, H, D] absolute world targets
    instructions: np.ndarray  # str [N]
    memories: np.ndarray  # str [N]
    subtasks: np.ndarray  # str [N] expert's subtask with goal coordinates (co-training text)
    episodes: np.ndarray  # int64 [N] episode seed
    object_maps: np.ndarray  # uint8 [N, C, patches, classes] objects per image patch (auxiliary loss target)

    def __len__(self) -> int:
        return int(self.states.shape[0])

    def save(self, path: Path) -> None:
        np.savez_compressed(path, **{f.name: getattr(self, f.name) for f in fields(self)})

    @staticmethod
    def load(path: Path) -> Demonstrations:
        with np.load(path) as z:
            return Demonstrations(**{f.name: z[f.name] for f in fields(Demonstrations)})


def _episode(world: TabletopWorld, seed: int, horizon: int, rng: np.random.Generator, noise_xy: float,
             slip_prob: float, steps_after_success: int, patch_px: int) -> list[tuple]:
    world.reset(seed)
    sigma = rng.uniform(0.0, noise_xy)
    slip = slip_prob if rng.random() < 0.5 else 0.0
    rows, after = [], 0
    while world.steps < world.config.max_steps and after <= steps_after_success:
        obs = world.observation()
        chunk = expert_chunk(world, horizon)
        rows.append((np.stack([obs.images[c] for c in CAMERAS]), obs.state, chunk, obs.instruction,
                     world.memory_text(), expert_subtask(world), object_maps(world, patch_px)))
        a = chunk[0].astype(np.float64)
        a[:2] += rng.normal(0.0, sigma, 2)
        a[2] += rng.normal(0.0, sigma * 2.0)
        if rng.random() < slip:
            a[3] = 1.0 - a[3]
        world.apply(a)
        after += int(world.success)
    return rows


def collect(num_episodes: int, first_seed: int = 0, horizon: int = 8, config: WorldConfig | None = None,
            noise_xy: float = 0.03, slip_prob: float = 0.02, steps_after_success: int = 4,
            progress: bool = True, patch_px: int = 16) -> Demonstrations:
    """Run the noisy expert on seeds first_seed .. first_seed + num_episodes - 1 and record every step
    (``patch_px``: the model's patch size, for the object maps)."""
    world = TabletopWorld(config)
    rows: list[tuple] = []
    episodes: list[int] = []
    for seed in tqdm(range(first_seed, first_seed + num_episodes), desc="demonstrations", disable=not progress):
        ep = _episode(world, seed, horizon, np.random.default_rng([seed, 17]), noise_xy, slip_prob,
                      steps_after_success, patch_px)
        rows += ep
        episodes += [seed] * len(ep)
    images, states, actions, instructions, memories, subtasks, maps = zip(*rows, strict=True)
    return Demonstrations(np.stack(images), np.stack(states).astype(np.float32), np.stack(actions),
                          np.array(instructions), np.array(memories), np.array(subtasks),
                          np.array(episodes, dtype=np.int64), np.stack(maps))


@dataclass
class Batch:
    """A training batch: model observations, normalised action chunks and language token streams."""

    observation: Observation
    actions: torch.Tensor  # float32 [B, H, A]
    # task -> (int64 [B, T] request prompt + text + EOS zero-padded, bool [B, T] True where the token is a target)
    language: dict[str, tuple[torch.Tensor, torch.Tensor]]
    object_maps: torch.Tensor | None = None  # float32 [B, C * patches, classes] (auxiliary loss target)


def _token_stream(texts: list[str], prompt: list[int], tok: PromptTokenizer, cache: dict[str, list[int]]):
    seqs = []
    for text in texts:
        if text not in cache:
            cache[text] = tok.encode(text) + [tok.eos_id]
        seqs.append(prompt + cache[text])
    t = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), t, dtype=torch.long)
    targets = torch.zeros(len(seqs), t, dtype=torch.bool)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = torch.tensor(s)
        targets[i, len(prompt):len(s)] = True
    return tokens, targets


LANGUAGE_TASKS = {"memory": "memories", "subtask": "subtasks"}  # request task -> Demonstrations text field


def make_batch(demos: Demonstrations, index: np.ndarray, tok: PromptTokenizer, stats: NormStats, action_dim: int,
               cache: dict[str, list[int]] | None = None, tasks: tuple[str, ...] = tuple(LANGUAGE_TASKS)) -> Batch:
    """Samples ``index`` of ``demos`` as a :class:`Batch` (``cache`` memoises text tokenisation)."""
    cache = {} if cache is None else cache
    states = demos.states[index]
    norm_states = stats.normalize_state(states)
    ids, mask = prompt_batch(tok, demos.instructions[index].tolist(), norm_states)
    width = int(mask.sum(1).max())  # padding past the longest prompt is masked out anyway: skip computing it
    ids, mask = ids[:, :width], mask[:, :width]
    obs = Observation(images_to_model(demos.images[index]), torch.ones(len(index), len(CAMERAS), dtype=torch.bool),
                      ids, mask, torch.from_numpy(norm_states))
    actions = stats.actions_to_model(demos.actions[index], states)
    actions = np.pad(actions, ((0, 0), (0, 0), (0, action_dim - actions.shape[-1])))
    language = {task: _token_stream(getattr(demos, LANGUAGE_TASKS[task])[index].tolist(),
                                    tok.tokenize_request(task), tok, cache) for task in tasks}
    maps = torch.from_numpy(demos.object_maps[index]).float().flatten(1, 2)
    return Batch(obs, torch.from_numpy(actions).float(), language, maps)
