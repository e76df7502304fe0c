"""Load and write pi0.5 checkpoints: openpi PyTorch (``model.safetensors``) and LeRobot pi05 (keys under ``model.``).

openpi writes with safetensors' ``save_model``, which stores tied tensors once: the token embedding appears only
as ``paligemma_with_expert.paligemma.lm_head.weight``. ``gemma_expert.lm_head.weight`` may be present and is
unused by pi0.5 (ignored on load).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import Pi05Config, get_config
from .layers import RMSNorm
from .model import Pi05Model

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
LEROBOT_PREFIX = "model."
EMBED_KEY = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
LM_HEAD_KEY = "paligemma_with_expert.paligemma.lm_head.weight"
IGNORED_KEYS = ("paligemma_with_expert.gemma_expert.lm_head.weight",)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded into the model: names every offending key."""


def _summarise(title: str, keys: list[str], limit: int = 12) -> str:
    shown = ", ".join(keys[:limit]) + (f", ... (+{len(keys) - limit} more)" if len(keys) > limit else "")
    return f"{title} ({len(keys)}): {shown}"


def init_random_weights(model: Pi05Model, seed: int = 0, std: float = 0.02) -> Pi05Model:
    """Deterministic random init that exercises every path (adaRMS gates non-zero, unlike openpi's zero init)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            for name, p in module.named_parameters(recurse=False):
                if isinstance(module, torch.nn.LayerNorm):
                    p.fill_(1.0 if name == "weight" else 0.0)
                elif isinstance(module, RMSNorm):
                    p.zero_()  # applied as (1 + w)
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model


def checkpoint_state_dict(model: Pi05Model, layout: str = "openpi") -> dict[str, torch.Tensor]:
    """The model's tensors under openpi's (or LeRobot's) key names, tied embedding stored once."""
    if layout not in ("openpi", "lerobot"):
        raise ValueError(f"layout must be 'openpi' or 'lerobot', got {layout!r}")
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k != EMBED_KEY}
    prefix = LEROBOT_PREFIX if layout == "lerobot" else ""
    return {prefix + k: v for k, v in sd.items()}


def save_checkpoint(model: Pi05Model, directory: str | Path, layout: str = "openpi") -> Path:
    """Write ``model.safetensors`` + ``config.json`` (our config under ``oxygen_ros``) into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(checkpoint_state_dict(model, layout), str(directory / WEIGHTS_NAME), metadata={"format": "pt"})
    meta = {"oxygen_ros": model.config.to_dict(), "layout": layout}
    (directory / CONFIG_NAME).write_text(json.dumps(meta, indent=2))
    return directory


def read_config(directory: str | Path, default: str = "pi05") -> Pi05Config:
    """Config from ``config.json`` (ours, or LeRobot's pi05 fields), else the named default."""
    path = Path(directory) / CONFIG_NAME
    if not path.exists():
        return get_config(default)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e
    if "oxygen_ros" in data:
        return Pi05Config.from_dict(data["oxygen_ros"])
    cfg = get_config(default)
    lerobot_fields = {"chunk_size": "action_horizon", "max_action_dim": "action_dim",
                      "tokenizer_max_length": "max_token_len", "num_inference_steps": "num_steps"}
    overrides = {ours: data[theirs] for theirs, ours in lerobot_fields.items() if theirs in data}
    return cfg.replace(**overrides)


def load_state_dict_into(model: Pi05Model, tensors: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Map, shape-check and copy checkpoint tensors into ``model``; one CheckpointError names every problem."""
    if tensors and all(k.startswith(LEROBOT_PREFIX) for k in tensors):
        tensors = {k[len(LEROBOT_PREFIX):]: v for k, v in tensors.items()}
    tensors = {k: v for k, v in tensors.items() if k not in IGNORED_KEYS}
    if LM_HEAD_KEY not in tensors and EMBED_KEY in tensors:
        tensors[LM_HEAD_KEY] = tensors[EMBED_KEY]
    tensors.pop(EMBED_KEY, None)

    expected = {k: v for k, v in model.state_dict().items() if k != EMBED_KEY}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    mismatched = sorted(
        f"{k} {tuple(tensors[k].shape)} != {tuple(expected[k].shape)}"
        for k in set(expected) & set(tensors)
        if tensors[k].shape != expected[k].shape
    )
    problems = [
        _summarise(t, ks) for t, ks in (("missing keys", missing), ("unexpected keys", unexpected),
                                        ("shape mismatches (checkpoint != model)", mismatched)) if ks
    ]
    if problems:
        raise CheckpointError(f"{source} does not match config {model.config.name!r}:\n  " + "\n  ".join(problems))
    with torch.no_grad():
        for k, target in expected.items():
            target.copy_(tensors[k])


def load_checkpoint(
    directory: str | Path,
    config: Pi05Config | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> Pi05Model:
    """Build the model for ``directory`` (openpi or LeRobot layout) and load every tensor, shape-checked."""
    directory = Path(directory)
    weights = directory / WEIGHTS_NAME if directory.is_dir() else directory
    if not weights.exists():
        raise CheckpointError(f"no {WEIGHTS_NAME} at {weights}")
    config = config or read_config(weights.parent)
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{weights}: cannot read safetensors file ({e})") from e
    model = Pi05Model(config)
    load_state_dict_into(model, tensors, source=str(weights))
    return model.to(device=device, dtype=dtype).eval()
