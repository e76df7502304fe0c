"""Demonstrations from the scripted expert, collected DART-style, and training batches for pi0.5.

Each sample is one control step: both camera images, the joint state, the instruction, the expert's next action
chunk from that state and the ground-truth texts (memory, subtask, narration, every question's answer; see
:mod:`oxygen_ros.toy.world.language`). The executed actions are the expert's with noise (and rare gripper slips), so the
data covers the states a learned policy drifts into, always labelled by the clean expert.

Batches condition the action prompt on a subtask for a fraction of the samples (``subtask_prob``): mostly the true
current one, sometimes (``stale_prob``) the episode's previous one, as a staged-inference loop has it for a frame or
two after the subtask changed; actions and language targets are always the truth of the observation, so the model
learns both prompt variants and never to copy a stale subtask.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from oxygen_ros.engine import Observation
from oxygen_ros.engine.tokenizer import PromptTokenizer
from oxygen_ros.toy.world import (
    CAMERAS,
    TabletopWorld,
    WorldConfig,
    answers,
    expert_chunk,
    expert_subtask,
    narration_text,
)

from .object_maps import object_maps
from .policy import NormStats, images_to_model, prompt_batch

__all__ = ["ANSWER_TASK", "LANGUAGE_TASKS", "Batch", "Demonstrations", "collect", "condition_subtasks", "make_batch"]


@dataclass
class Demonstrations:
    """N samples as parallel arrays (images stored as uint8)."""

    images: np.ndarray  # uint8 [N, C, S, S, 3]
    states: np.ndarray  # float32 [N, D]
    actions: np.ndarray  # float32 [N, H, D] absolute world targets
    instructions: np.ndarray  # str [N]
    memories: np.ndarray  # str [N]
    subtasks: np.ndarray  # str [N] expert's subtask with goal coordinates (co-training text, action condition)
    prev_subtasks: np.ndarray  # str [N] the episode's previous subtask ("" before the first change)
    narrations: np.ndarray  # str [N] the task's phase
    questions: np.ndarray  # str [N, Q] every valid question about the scene
    answers: np.ndarray  # str [N, Q] their true answers
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
    current, previous = "", ""
    while world.steps < world.config.max_steps and after <= steps_after_success:
        obs = world.observation()
        chunk = expert_chunk(world, horizon)
        subtask = expert_subtask(world)
        if subtask != current:
            current, previous = subtask, current
        qa = answers(world)
        rows.append((np.stack([obs.images[c] for c in CAMERAS]), obs.state, chunk, obs.instruction,
                     world.memory_text(), subtask, previous, narration_text(world), list(qa), list(qa.values()),
                     object_maps(world, patch_px)))
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
    (images, states, actions, instructions, memories, subtasks, previous, narrations, questions, answers_,
     maps) = zip(*rows, strict=True)
    return Demonstrations(np.stack(images), np.stack(states).astype(np.float32), np.stack(actions),
                          np.array(instructions), np.array(memories), np.array(subtasks), np.array(previous),
                          np.array(narrations), np.array(questions), np.array(answers_),
                          np.array(episodes, dtype=np.int64), np.stack(maps))


@dataclass
class Batch:
    """A training batch: model observations, normalised action chunks and language token streams."""

    observation: Observation
    actions: torch.Tensor  # float32 [B, H, A]
    # task -> (int64 [B, T] request prompt + text + EOS zero-padded, bool [B, T] True where the token is a target)
    language: dict[str, tuple[torch.Tensor, torch.Tensor]]
    object_maps: torch.Tensor | None = None  # float32 [B, C * patches, classes] (auxiliary loss target)


def _token_stream(texts: list[str], prompt: list[int] | list[list[int]], tok: PromptTokenizer,
                  cache: dict[str, list[int]]):
    """Prompt + text + EOS per sample, zero-padded, with the target mask (``prompt``: one for all, or one each)."""
    prompts = prompt if prompt and isinstance(prompt[0], list) else [prompt] * len(texts)
    seqs = []
    for text, p in zip(texts, prompts, strict=True):
        if text not in cache:
            cache[text] = tok.encode(text) + [tok.eos_id]
        seqs.append((len(p), p + cache[text]))
    t = max(len(s) for _, s in seqs)
    tokens = torch.zeros(len(seqs), t, dtype=torch.long)
    targets = torch.zeros(len(seqs), t, dtype=torch.bool)
    for i, (n, s) in enumerate(seqs):
        tokens[i, :len(s)] = torch.tensor(s)
        targets[i, n:len(s)] = True
    return tokens, targets


# request task -> Demonstrations text field; "answer" (a question prompt per sample) is built separately
LANGUAGE_TASKS = {"memory": "memories", "subtask": "subtasks", "narration": "narrations"}
ANSWER_TASK = "answer"


def condition_subtasks(demos: Demonstrations, index: np.ndarray, rng: np.random.Generator | None,
                       subtask_prob: float, stale_prob: float) -> list[str | None]:
    """The subtask each sample's action prompt is conditioned on (None: the unconditioned prompt)."""
    if rng is None or subtask_prob <= 0:
        return [None] * len(index)
    out: list[str | None] = []
    for i in index:
        u = rng.random()
        if u >= subtask_prob:
            out.append(None)
        elif u < subtask_prob * stale_prob and demos.prev_subtasks[i]:
            out.append(str(demos.prev_subtasks[i]))
        else:
            out.append(str(demos.subtasks[i]))
    return out


def make_batch(demos: Demonstrations, index: np.ndarray, tok: PromptTokenizer, stats: NormStats, action_dim: int,
               cache: dict[str, list[int]] | None = None,
               tasks: tuple[str, ...] = (*LANGUAGE_TASKS, ANSWER_TASK), rng: np.random.Generator | None = None,
               subtask_prob: float = 0.0, stale_prob: float = 0.0,
               subtasks: list[str | None] | None = None, questions_per_sample: int = 1) -> Batch:
    """Samples ``index`` of ``demos`` as a :class:`Batch` (``cache`` memoises text tokenisation; ``rng`` draws the
    subtask conditioning (see :func:`condition_subtasks`) and each sample's questions, or give ``subtasks``; without
    ``rng`` no sample is conditioned and every sample asks its first questions). ``questions_per_sample`` distinct
    questions each make a stream ("answer", "answer_2", ...)."""
    cache = {} if cache is None else cache
    states = demos.states[index]
    norm_states = stats.normalize_state(states)
    if subtasks is None:
        subtasks = condition_subtasks(demos, index, rng, subtask_prob, stale_prob)
    ids, mask = prompt_batch(tok, demos.instructions[index].tolist(), norm_states, subtasks)
    width = int(mask.sum(1).max())  # padding past the longest prompt is masked out anyway: skip computing it
    ids, mask = ids[:, :width], mask[:, :width]
    obs = Observation(images_to_model(demos.images[index]), torch.ones(len(index), len(CAMERAS), dtype=torch.bool),
                      ids, mask, torch.from_numpy(norm_states))
    actions = stats.actions_to_model(demos.actions[index], states)
    actions = np.pad(actions, ((0, 0), (0, 0), (0, action_dim - actions.shape[-1])))
    language = {task: _token_stream(getattr(demos, LANGUAGE_TASKS[task])[index].tolist(),
                                    tok.tokenize_request(task), tok, cache) for task in tasks if task != ANSWER_TASK}
    if ANSWER_TASK in tasks:
        n_q = demos.questions.shape[1]
        order = (np.argsort(rng.random((len(index), n_q)), axis=1) if rng is not None
                 else np.tile(np.arange(n_q), (len(index), 1)))
        for j in range(min(questions_per_sample, n_q)):
            q = order[:, j]
            language[ANSWER_TASK if j == 0 else f"{ANSWER_TASK}_{j + 1}"] = _token_stream(
                demos.answers[index, q].tolist(),
                [_question_tokens(tok, str(x), cache) for x in demos.questions[index, q]], tok, cache)
    maps = torch.from_numpy(demos.object_maps[index]).float().flatten(1, 2)
    return Batch(obs, torch.from_numpy(actions).float(), language, maps)


def _question_tokens(tok: PromptTokenizer, question: str, cache: dict[str, list[int]]) -> list[int]:
    key = "\0question\0" + question
    if key not in cache:
        cache[key] = tok.tokenize_question(question)
    return list(cache[key])
