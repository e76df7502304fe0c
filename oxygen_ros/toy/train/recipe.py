"""The toy model: a small pi0.5 config sized for CPU training on the tabletop world, and its tokenizer corpus."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import torch

from oxygen_ros.engine import Pi05Model
from oxygen_ros.engine.config import GemmaConfig, Pi05Config, VisionConfig
from oxygen_ros.engine.small_tokenizer import make_test_tokenizer
from oxygen_ros.toy.world.language import LANGUAGE_GRID, cell_text
from oxygen_ros.toy.world.render import COLORS
from oxygen_ros.toy.world.tabletop import CAMERAS, JOINT_NAMES

__all__ = ["ACTION_HORIZON", "N_ACTION_STEPS", "VOCAB_SIZE", "init_toy_model", "make_world_tokenizer", "sincos_2d",
           "toy_config", "world_sentences"]

# 16 actions: at the tabletop preset's 20 Hz (config/tabletop.yaml) a chunk spans 800 ms, 8 control frames of
# 100 ms, so it outlasts a frame plus the node's latency with a wide margin even on a loaded host (the model until
# 2026-12-04 had 8: 400 ms), as a real pi0.5 chunk (50 actions, 10 executed) does by design.
ACTION_HORIZON = 16
# actions of a chunk executed per frame (the checkpoint's n_action_steps): still 8, so where the node derives the
# action rate from it (action_rate_hz 0: 8 x control_rate_hz) a 16-action chunk spans two control periods
N_ACTION_STEPS = 8
VOCAB_SIZE = 512


def toy_config(image_size: int = 64, patch_size: int = 16, horizon: int = ACTION_HORIZON) -> Pi05Config:
    """pi0.5 at toy scale (about 1.8M parameters): the same architecture, two cameras, 4-D actions, chunks of
    ``horizon`` actions (no weight depends on it: the action expert's positions are RoPE, so a checkpoint trained
    at one horizon warm-starts another).

    16 px patches (4 x 4 tokens per 64 px image) train about 4x faster per step than 8 px patches on CPU, which is
    what lets the short budget get past the plateau where the model ignores where the target block is."""
    heads = {"num_heads": 4, "num_kv_heads": 1, "head_dim": 32}
    return Pi05Config(
        name="toy",
        vision=VisionConfig(width=96, depth=3, mlp_dim=384, num_heads=4, patch_size=patch_size,
                            image_size=image_size),
        backbone=GemmaConfig(width=128, depth=3, mlp_dim=512, **heads),
        expert=GemmaConfig(width=96, depth=3, mlp_dim=384, **heads),
        vocab_size=VOCAB_SIZE,
        action_dim=len(JOINT_NAMES),
        action_horizon=horizon,
        max_token_len=64,  # the subtask-conditioned action prompt is up to about 50 tokens (digits are split)
        camera_names=CAMERAS,
        num_steps=10,
    )


def world_sentences(repeats: int = 20, seed: int = 0) -> list[str]:
    """Every instruction, memory, subtask, narration, question and answer text of the world and a spread of action
    prompts, with and without a subtask (tokenizer training text)."""
    rng = np.random.default_rng(seed)
    colors = list(COLORS)
    grid = LANGUAGE_GRID
    cells = [cell_text(((i + 0.5) / grid, (j + 0.5) / grid)) for i in range(grid) for j in range(grid)]

    def cell() -> str:
        return cells[int(rng.integers(len(cells)))]

    lines: list[str] = []
    for block, plate in itertools.product(colors, colors):
        instruction = f"put the {block} block on the {plate} plate"
        subtasks = [f"pick up the {block} block at {cell()}", f"put it on the {plate} plate at {cell()}", "done"]
        for r in range(repeats):
            state = " ".join(str(v) for v in rng.integers(0, 256, len(JOINT_NAMES)))
            lines.append(f"Task: {instruction}, State: {state};\nAction: ")
            lines.append(f"Task: {instruction}, State: {state};\nSubtask: {subtasks[r % 3]};\nAction: ")
        on_plate = f"Question: where is the {block} block?\nAnswer: The {block} block is on the {plate} plate."
        lines += [f"Memory: The {block} block is on the {plate} plate.",
                  f"Narration: Carrying the {block} block to the {plate} plate.", on_plate] * repeats
    for block in colors:
        lines += [f"Memory: The {block} block is {where}." for where in ("in the gripper", "on the table")] * repeats
        lines += [f"Narration: {n} the {block} block." for n in ("Reaching for", "Grasping", "Placing",
                                                                  "Releasing")] * repeats
        lines += [f"Question: what is in the gripper?\nAnswer: The {block} block.",
                  f"Question: which block is the target?\nAnswer: The {block} block.",
                  f"Question: which plate is the target?\nAnswer: The {block} plate.",
                  f"Question: where is the {block} block?\nAnswer: The {block} block is in the gripper.",
                  f"Question: where is the {block} block?\nAnswer: The {block} block is on the table."] * repeats
        for _ in range(repeats):
            lines += [f"Subtask: pick up the {block} block at {cell()}",
                      f"Subtask: put it on the {block} plate at {cell()}"]
    lines += ["Subtask: done", "Narration: Done.", "Question: what is in the gripper?\nAnswer: Nothing."] * repeats
    return lines


def make_world_tokenizer(out_dir: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """Train the SentencePiece tokenizer (PaliGemma special ids) on the built-in corpus plus the world's text."""
    return make_test_tokenizer(out_dir, vocab_size=vocab_size, extra_text=world_sentences())


def init_toy_model(config: Pi05Config, seed: int = 0, fixed_positions: bool = True) -> Pi05Model:
    """A freshly initialised model for training from scratch: PyTorch's default init for linear and conv layers,
    token embeddings at 1 / sqrt(width) (unit scale after Gemma's sqrt(width) multiplier, unit-scale tied logits),
    and openpi's zero-initialised adaRMSNorm (each expert layer starts as the identity).

    Vision position embeddings: with ``fixed_positions`` a 2-D sine-cosine table (:func:`sincos_2d`), frozen
    (``requires_grad`` False; it is still saved in the checkpoint like any learned table), so every patch token
    carries its row and column from step 0; otherwise small random learned ones."""
    torch.manual_seed(seed)
    model = Pi05Model(config)
    with torch.no_grad():
        emb = model.backbone.embed_tokens.weight
        emb.normal_(0.0, emb.shape[1] ** -0.5)
        pos = model.paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.position_embedding
        if fixed_positions:
            grid = config.vision.image_size // config.vision.patch_size
            pos.weight.copy_(sincos_2d(grid, pos.weight.shape[1]))
            pos.weight.requires_grad_(False)
        else:
            pos.weight.normal_(0.0, 0.05)
    return model


def sincos_2d(grid: int, width: int) -> torch.Tensor:
    """Fixed 2-D sine-cosine position table [grid * grid, width] (MAE / ViT style, row-major patches): half the
    channels encode the patch row, half the column, each at geometric frequencies."""
    quarter = width // 4
    omega = 1.0 / 10000.0 ** (torch.arange(quarter, dtype=torch.float32) / quarter)
    pos = torch.arange(grid, dtype=torch.float32)
    rows, cols = torch.meshgrid(pos, pos, indexing="ij")
    parts = []
    for p in (rows.reshape(-1), cols.reshape(-1)):
        angle = p[:, None] * omega[None, :]
        parts += [torch.sin(angle), torch.cos(angle)]
    table = torch.cat(parts, dim=1)
    return torch.nn.functional.pad(table, (0, width - table.shape[1]))
