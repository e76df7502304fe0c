"""Train the toy pi0.5 on expert demonstrations of the tabletop world (CPU, minutes).

    python -m oxygen_ros.toy.train.train --out oxygen_ros/toy/model [--episodes 2000 --steps 6000 --threads 2]

Writes ``model.safetensors`` + ``config.json`` (the toy config), ``tokenizer.model``, ``norm_stats.json``,
``train_log.json`` and ``train_curves.png`` into ``--out``: the directory the engine, the evaluation and the ROS node
load.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from oxygen_ros.engine.checkpoint import save_checkpoint
from oxygen_ros.engine.tokenizer import PromptTokenizer

from .curves import plot_training
from .data import Demonstrations, collect, make_batch
from .losses import training_losses
from .object_maps import OBJECT_CLASSES
from .policy import NormStats
from .recipe import ACTION_HORIZON, N_ACTION_STEPS, init_toy_model, make_world_tokenizer, toy_config
from .validation import validate

__all__ = ["VAL_FIRST_SEED", "TrainConfig", "train"]

VAL_FIRST_SEED = 900_000


@dataclass
class TrainConfig:
    """Hyper-parameters of one training run (the defaults are the committed model's recipe)."""

    out: Path
    episodes: int = 2000  # expert demonstrations (seeds 0 .. episodes - 1; evaluation uses seeds >= 1_000_000)
    steps: int = 6000  # about 0.3 s a step on 2 cores (16 px patches); max_minutes shortens it if needed
    batch_size: int = 32
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 1e-4
    num_noise: int = 4  # flow-matching noise samples per example (share one prefix forward)
    lang_weight: float = 1.0  # weight of each language loss (memory, subtask, narration, answer)
    subtask_prob: float = 0.5  # samples whose action prompt is conditioned on a subtask ("Subtask: ...;\n")
    stale_prob: float = 0.2  # of those, conditioned on the episode's previous subtask (staged inference lags)
    questions_per_sample: int = 1  # distinct questions (answer streams) per sample and step
    object_weight: float = 1.0  # weight of the auxiliary per-patch object loss (0: off; see object_maps.py)
    seed: int = 0
    threads: int = 2
    max_minutes: float = 27.0  # stop (and save) early when the wall-clock budget runs out
    log_every: int = 50
    val_every: int = 500  # open-loop validation on held-out demonstrations (seeds from VAL_FIRST_SEED)
    val_episodes: int = 12
    data: Path | None = None  # .npz cache of the demonstrations (written if missing)
    init: Path | None = None  # warm start: a trained toy model directory (weights; token embeddings by piece)
    horizon: int = ACTION_HORIZON  # actions per chunk (the expert's plan; any warm start's horizon fits)
    n_action_steps: int = N_ACTION_STEPS  # actions executed per frame, written into config.json


def _lr(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to 5% of the peak."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac))))


def _demonstrations(cfg: TrainConfig, patch_px: int) -> Demonstrations:
    if cfg.data is not None and Path(cfg.data).exists():
        demos = Demonstrations.load(cfg.data)
        if demos.actions.shape[1] != cfg.horizon:
            raise ValueError(f"{cfg.data}: chunks of {demos.actions.shape[1]} actions, but horizon is {cfg.horizon}")
        return demos
    demos = collect(cfg.episodes, horizon=cfg.horizon, patch_px=patch_px)
    if cfg.data is not None:
        demos.save(cfg.data)
    return demos


def _optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; no weight decay on norms, biases and embeddings."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))


def _fit_schedule(cfg: TrainConfig, step: int, loop_s: float, elapsed_s: float,
                  target: int | None = None) -> int | None:
    """The total step count that the measured pace fits into ``max_minutes``, at most ``target`` (the requested
    steps; default ``cfg.steps``), when it differs from ``cfg.steps`` (else None): shorter when the pace would overrun,
    longer again (up to ``target``) when a shortened schedule's pace improved."""
    per_step = loop_s / step
    fitted = min(target or cfg.steps, step + max(1, int((cfg.max_minutes * 60 - elapsed_s - 10.0) / per_step)))
    return fitted if fitted != cfg.steps else None


def warm_start(model: torch.nn.Module, tok: PromptTokenizer, init: Path) -> dict[str, int]:
    """Copy the weights of the trained model in ``init`` into ``model``; token embeddings (and the tied LM head) row
    by row through the SentencePiece pieces both tokenizers share (new pieces keep their fresh init)."""
    import sentencepiece as spm

    from oxygen_ros.engine.checkpoint import load_checkpoint

    old = load_checkpoint(init).state_dict()
    old_sp = spm.SentencePieceProcessor(model_file=str(Path(init) / "tokenizer.model"))
    new_sp = tok._sp
    old_ids = {old_sp.id_to_piece(i): i for i in range(old_sp.get_piece_size())}
    rows = [(i, old_ids[new_sp.id_to_piece(i)]) for i in range(new_sp.get_piece_size())
            if new_sp.id_to_piece(i) in old_ids]
    new, old_rows = torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows])
    copied = 0
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if name not in old:
                continue
            if "embed_tokens" in name or "lm_head" in name:
                value[new] = old[name][old_rows].to(value.dtype)
            elif value.shape == old[name].shape:
                value.copy_(old[name])
            else:
                continue
            copied += 1
    return {"tensors": copied, "shared_pieces": len(rows), "pieces": new_sp.get_piece_size()}


def _optimizer_step(model, object_head, opt, batch, cfg: TrainConfig, step: int, gen: torch.Generator) -> dict:
    """One optimisation step at ``step``'s learning rate; returns the unweighted losses."""
    for group in opt.param_groups:
        group["lr"] = _lr(step, cfg)
    losses = training_losses(model, batch, cfg.num_noise, gen, object_head)
    loss = losses["action"] + cfg.object_weight * losses.get("objects", 0.0) + cfg.lang_weight * sum(
        v for k, v in losses.items() if k not in ("action", "objects"))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
    opt.step()
    return losses


def train(cfg: TrainConfig, progress: bool = True) -> dict:
    """Run the whole recipe and save everything into ``cfg.out``; returns the training log."""
    t_start = time.perf_counter()
    cfg = replace(cfg)  # the schedule may be shortened to fit the time budget
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if not 0 < cfg.n_action_steps <= cfg.horizon:
        raise ValueError(f"n_action_steps must be in 1..horizon ({cfg.horizon}), got {cfg.n_action_steps}")
    model_cfg = toy_config(horizon=cfg.horizon)
    tok = PromptTokenizer(make_world_tokenizer(out), model_cfg.max_token_len)
    demos = _demonstrations(cfg, model_cfg.vision.patch_size)
    # a warm start keeps its norm stats (the state tokens in its prompts and its action scale stay what it learned)
    stats = NormStats.load(cfg.init) if cfg.init is not None else NormStats.fit(demos.states, demos.actions)
    stats.save(out)
    model = init_toy_model(model_cfg, cfg.seed).train()
    warm = warm_start(model, tok, cfg.init) if cfg.init is not None else None
    # Training-only probe on the image tokens (not saved): see object_maps.py.
    object_head = torch.nn.Linear(model_cfg.backbone.width, len(OBJECT_CLASSES)) if cfg.object_weight else None
    opt = _optimizer(model, cfg)
    if object_head is not None:
        opt.add_param_group({"params": list(object_head.parameters()), "weight_decay": 0.0})
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    token_cache: dict[str, list[int]] = {}
    val = collect(cfg.val_episodes, VAL_FIRST_SEED, cfg.horizon, progress=False,
                  patch_px=model_cfg.vision.patch_size)
    val_index = np.linspace(0, len(val) - 1, min(64, len(val))).round().astype(int)
    val_rng = np.random.default_rng(cfg.seed + 1)  # fixed questions; half the prompts conditioned (true subtask)
    val_batch = make_batch(val, val_index, tok, stats, model_cfg.action_dim, token_cache, rng=val_rng,
                           subtask_prob=cfg.subtask_prob, questions_per_sample=3)
    val_plain = make_batch(val, val_index, tok, stats, model_cfg.action_dim, token_cache, tasks=())
    val_cond = make_batch(val, val_index, tok, stats, model_cfg.action_dim, token_cache, tasks=(),
                          subtasks=val.subtasks[val_index].tolist())
    history: list[dict] = []
    running: dict[str, float] = {}
    metrics: dict[str, float] = {}
    t_loop = time.perf_counter()
    bar = tqdm(total=cfg.steps, desc="train", disable=not progress)
    target = cfg.steps
    step = 0
    while step < cfg.steps:
        batch = make_batch(demos, rng.integers(0, len(demos), cfg.batch_size), tok, stats, model_cfg.action_dim,
                           token_cache, rng=rng, subtask_prob=cfg.subtask_prob, stale_prob=cfg.stale_prob,
                           questions_per_sample=cfg.questions_per_sample)
        losses = _optimizer_step(model, object_head, opt, batch, cfg, step, gen)
        for k, v in losses.items():
            running[k] = 0.9 * running.get(k, v.item()) + 0.1 * v.item()
        last = step == cfg.steps - 1
        if (step + 1) % cfg.val_every == 0 or last:
            metrics = validate(model, val_batch, val, val_index, tok, stats)
            for name, b in (("plain", val_plain), ("cond", val_cond)):
                m = validate(model, b, val, val_index, tok, stats, language=False)
                metrics[f"val_xy_error_{name}"] = m["val_xy_error"]
        bar.set_postfix(**{k: f"{v:.4f}" for k, v in running.items()},
                        **{k[4:]: f"{v:.3f}" for k, v in metrics.items()})
        if step % cfg.log_every == 0 or last or (step + 1) % cfg.val_every == 0:
            history.append({"step": step, "lr": _lr(step, cfg), **{k: v.item() for k, v in losses.items()},
                            **metrics, "elapsed_s": time.perf_counter() - t_start})
        step += 1
        bar.update()
        if step in (20, 100) or step % 250 == 0:  # fit the schedule into the wall-clock budget
            fitted = _fit_schedule(cfg, step, time.perf_counter() - t_loop, time.perf_counter() - t_start, target)
            if fitted is not None:
                bar.write(f"fitting the schedule to {fitted} steps ({cfg.max_minutes} min)")
                cfg.steps = bar.total = fitted
    bar.close()
    save_checkpoint(model.eval(), out, n_action_steps=cfg.n_action_steps)
    log = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
           "samples": len(demos), "parameters": model.num_parameters(), "steps_done": step, "warm_start": warm,
           "wall_s": time.perf_counter() - t_start, "history": history}
    (out / "train_log.json").write_text(json.dumps(log, indent=2))
    plot_training(log, out / "train_curves.png")
    return log


def main(argv: list[str] | None = None) -> None:
    """CLI entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="output model directory")
    for f in TrainConfig.__dataclass_fields__.values():
        if f.name == "out":
            continue
        kind = Path if f.name in ("data", "init") else type(f.default)
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default, help=f"default {f.default}")
    args = vars(ap.parse_args(argv))
    log = train(TrainConfig(**args))
    last = log["history"][-1]
    print(f"saved {args['out']}: {log['steps_done']} steps in {log['wall_s'] / 60:.1f} min, "
          f"action loss {last['action']:.4f}, "
          + ", ".join(f"{k} {last[k]:.4f}" for k in ("memory", "subtask", "narration", "answer") if k in last)
          + ", " + ", ".join(f"{k} {v:.3f}" for k, v in last.items() if k.startswith("val_")))


if __name__ == "__main__":
    main()
