"""Open-loop validation on held-out demonstrations: sampled chunks against the expert's, greedy language text (memory,
subtask, narration, answers) against the ground truth (both through the model's own cached inference paths)."""

from __future__ import annotations

import numpy as np
import torch

from oxygen_ros.engine import Pi05Model
from oxygen_ros.engine.tokenizer import PromptTokenizer

from .data import Batch, Demonstrations
from .policy import NormStats

__all__ = ["validate"]


@torch.no_grad()
def validate(model: Pi05Model, batch: Batch, demos: Demonstrations, index: np.ndarray, tok: PromptTokenizer,
             stats: NormStats, seed: int = 0, language: bool = True) -> dict[str, float]:
    """Mean x-y error of sampled chunks (world units, over all steps), gripper agreement and, with ``language``, the
    greedy exact match of every language stream of ``batch`` (its request prompt, its target text)."""
    was_training = model.training
    model.eval()
    obs = batch.observation
    noise = torch.randn(batch.actions.shape, generator=torch.Generator().manual_seed(seed))
    chunks = model.sample_actions(obs, noise).numpy()
    states = demos.states[index]
    pred = np.stack([stats.actions_from_model(c, s) for c, s in zip(chunks, states, strict=True)])
    true = demos.actions[index]
    out = {
        "val_xy_error": float(np.linalg.norm(pred[..., :2] - true[..., :2], axis=-1).mean()),
        "val_gripper_agree": float(((pred[..., 3] > 0.5) == (true[..., 3] > 0.5)).mean()),
    }
    for task, (tokens, is_target) in batch.language.items() if language else ():
        prompts, truths = [], []
        for row, tgt in zip(tokens.tolist(), is_target.tolist(), strict=True):
            first = tgt.index(True)
            prompts.append(row[:first])
            truths.append(tok.decode(t for t, m in zip(row, tgt, strict=True) if m))
        gen = model.generate(obs, 24, prompts, eos_id=tok.eos_id)
        out[f"val_{task}_exact"] = float(np.mean([tok.decode(g) == t for g, t in zip(gen, truths, strict=True)]))
    model.train(was_training)
    return out
