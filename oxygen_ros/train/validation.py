"""Open-loop validation on held-out demonstrations: sampled chunks against the expert's, greedy memory text
against the ground truth (both through the model's own cached inference paths)."""

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
             stats: NormStats, seed: int = 0) -> dict[str, float]:
    """Mean x-y error of sampled chunks (world units, over all steps), gripper agreement, memory exact match."""
    was_training = model.training
    model.eval()
    obs = batch.observation
    noise = torch.randn(batch.actions.shape, generator=torch.Generator().manual_seed(seed))
    chunks = model.sample_actions(obs, noise).numpy()
    states = demos.states[index]
    pred = np.stack([stats.actions_from_model(c, s) for c, s in zip(chunks, states, strict=True)])
    true = demos.actions[index]
    outs = model.generate(obs, 16, [tok.tokenize_request("memory")] * len(index), eos_id=tok.eos_id)
    texts = [tok.decode(o) for o in outs]
    model.train(was_training)
    return {
        "val_xy_error": float(np.linalg.norm(pred[..., :2] - true[..., :2], axis=-1).mean()),
        "val_gripper_agree": float(((pred[..., 3] > 0.5) == (true[..., 3] > 0.5)).mean()),
        "val_memory_exact": float(np.mean([t == m for t, m in zip(texts, demos.memories[index], strict=True)])),
    }
