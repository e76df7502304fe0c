"""Load and write pi0.5 weights: openpi PyTorch (``model.safetensors``) and LeRobot pi05 (keys under ``model.``).

Key names are brought to one canonical form first (:func:`canonical_keys`): LeRobot's ``model.`` prefix, the
older transformers layout (``paligemma.language_model.model.*``, ``paligemma.vision_tower.*``) and SigLIP without
its ``vision_model.`` level all map onto the module tree of :class:`Pi05Model`.

Embeddings: openpi writes with safetensors' ``save_model``, which stores tied tensors once (only
``...paligemma.lm_head.weight``). LeRobot >= 0.5 stores ``embed_tokens`` and ``lm_head`` as two tensors; when they
differ the model is built untied, embedding prompts with ``embed_tokens`` (as LeRobot does) and decoding language
with ``lm_head``. ``gemma_expert.lm_head.weight`` is unused by pi0.5 and ignored.

Model sizes come from the tensor shapes (:func:`infer_config`), never from variant names: LeRobot's config.json
says ``gemma_2b`` whatever the tensors are.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import GemmaConfig, Pi05Config, VisionConfig, get_config
from .layers import RMSNorm
from .model import Pi05Model

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
LEROBOT_PREFIX = "model."
EMBED_KEY = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
LM_HEAD_KEY = "paligemma_with_expert.paligemma.lm_head.weight"
IGNORED_KEYS = ("paligemma_with_expert.gemma_expert.lm_head.weight",)
_VISION = "paligemma_with_expert.paligemma.model.vision_tower.vision_model."
_BACKBONE = "paligemma_with_expert.paligemma.model.language_model."
_EXPERT = "paligemma_with_expert.gemma_expert.model."
# Older transformers (< 4.52) nested the text model one level deeper and kept the tower and projector at the top.
_KEY_RENAMES = (
    (re.compile(r"^paligemma_with_expert\.paligemma\.language_model\.model\."), _BACKBONE),
    (re.compile(r"^paligemma_with_expert\.paligemma\.language_model\.lm_head\."),
     "paligemma_with_expert.paligemma.lm_head."),
    (re.compile(r"^paligemma_with_expert\.paligemma\.(vision_tower|multi_modal_projector)\."),
     r"paligemma_with_expert.paligemma.model.\1."),
    (re.compile(r"^(paligemma_with_expert\.paligemma\.model\.vision_tower\.)(embeddings|encoder|post_layernorm)\."),
     r"\1vision_model.\2."),
)
# SigLIP head counts of the published towers (shapes cannot tell heads from head_dim).
_SIGLIP_HEADS = {1152: 16, 1024: 16, 768: 12, 384: 6}


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded into the model: names the file and every offending key or field."""


def _summarise(title: str, keys: list[str], limit: int = 12) -> str:
    shown = ", ".join(keys[:limit]) + (f", ... (+{len(keys) - limit} more)" if len(keys) > limit else "")
    return f"{title} ({len(keys)}): {shown}"


def canonical_keys(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint tensors under :class:`Pi05Model`'s key names (prefixes and transformers versions unified)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        key = key.removeprefix(LEROBOT_PREFIX)
        for pattern, repl in _KEY_RENAMES:
            key = pattern.sub(repl, key)
        if key not in IGNORED_KEYS:
            out[key] = value
    return out


def tied_embeddings(tensors: dict[str, torch.Tensor]) -> bool:
    """False when both ``embed_tokens`` and ``lm_head`` are stored and differ (LeRobot >= 0.5 fine-tunes)."""
    if EMBED_KEY in tensors and LM_HEAD_KEY in tensors:
        a, b = tensors[EMBED_KEY], tensors[LM_HEAD_KEY]
        return a.shape == b.shape and bool(torch.equal(a, b))
    return True


def _count_layers(tensors: dict[str, torch.Tensor], prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    found = {int(m.group(1)) for k in tensors if (m := pattern.match(k))}
    return max(found) + 1 if found else 0


def infer_config(tensors: dict[str, torch.Tensor], base: Pi05Config, sizes: dict | None = None,
                 source: str = "checkpoint") -> Pi05Config:
    """``base`` with every model size read from canonical-key tensor shapes.

    Shapes give widths, depths, MLP sizes, vocabulary, patch and image size and the action dim. Gemma head counts
    follow from pi0's single KV head (head_dim = k_proj rows); SigLIP's head count is taken from ``sizes``
    (``{"vision": {"num_attention_heads": n}}``, e.g. a fixture's ``tiny_dims.json``), else from the published
    towers' table, else head_dim 16 (the test-size towers).

    Raises:
        CheckpointError: a tensor the model needs is absent (naming it).
    """
    sizes = sizes or {}

    def shape(key: str) -> tuple[int, ...]:
        if key not in tensors:
            raise CheckpointError(f"{source}: missing tensor {key} (is this a pi0.5 checkpoint?)")
        return tuple(tensors[key].shape)

    patch = shape(_VISION + "embeddings.patch_embedding.weight")
    vision_width, _, patch_size, _ = patch
    tokens = shape(_VISION + "embeddings.position_embedding.weight")[0]
    side = round(tokens ** 0.5)
    v_sizes = sizes.get("vision", {})
    heads = v_sizes.get("num_attention_heads") or _SIGLIP_HEADS.get(vision_width) or max(1, vision_width // 16)
    vision = VisionConfig(
        width=vision_width, depth=_count_layers(tensors, _VISION + "encoder.layers."),
        mlp_dim=shape(_VISION + "encoder.layers.0.mlp.fc1.weight")[0], num_heads=int(heads), patch_size=patch_size,
        image_size=side * patch_size, layer_norm_eps=float(v_sizes.get("layer_norm_eps", base.vision.layer_norm_eps)))

    def gemma(prefix: str, old: GemmaConfig, named: dict) -> GemmaConfig:
        q_rows, width = shape(prefix + "layers.0.self_attn.q_proj.weight")
        kv_rows = shape(prefix + "layers.0.self_attn.k_proj.weight")[0]
        kv_heads = int(named.get("num_kv_heads", 1))
        head_dim = int(named.get("head_dim", kv_rows // kv_heads))
        return GemmaConfig(width=width, depth=_count_layers(tensors, prefix + "layers."),
                           mlp_dim=shape(prefix + "layers.0.mlp.gate_proj.weight")[0], num_heads=q_rows // head_dim,
                           num_kv_heads=kv_heads, head_dim=head_dim, rope_theta=old.rope_theta, rms_eps=old.rms_eps)

    named_b = next((v for k, v in sizes.items() if k.startswith("paligemma_variant")), {})
    named_e = next((v for k, v in sizes.items() if k.startswith("action_expert_variant")), {})
    vocab_key = EMBED_KEY if EMBED_KEY in tensors else LM_HEAD_KEY
    return base.replace(
        vision=vision, backbone=gemma(_BACKBONE, base.backbone, named_b), expert=gemma(_EXPERT, base.expert, named_e),
        vocab_size=shape(vocab_key)[0], action_dim=shape("action_in_proj.weight")[1],
        tie_word_embeddings=tied_embeddings(tensors))


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
    """The model's tensors under openpi's (or LeRobot's) key names; a tied embedding is stored once."""
    if layout not in ("openpi", "lerobot"):
        raise ValueError(f"layout must be 'openpi' or 'lerobot', got {layout!r}")
    tied = model.config.tie_word_embeddings
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items() if not (tied and k == EMBED_KEY)}
    prefix = LEROBOT_PREFIX if layout == "lerobot" else ""
    return {prefix + k: v for k, v in sd.items()}


def save_checkpoint(model: Pi05Model, directory: str | Path, layout: str = "openpi",
                    n_action_steps: int | None = None) -> Path:
    """Write ``model.safetensors`` + ``config.json`` (our config under ``oxygen_ros``) into ``directory``;
    ``n_action_steps``: actions of a chunk executed per frame (LeRobot's name; None: the whole chunk)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if n_action_steps is not None and not 0 < n_action_steps <= model.config.action_horizon:
        raise ValueError(f"n_action_steps {n_action_steps} must be in 1..{model.config.action_horizon}")
    save_file(checkpoint_state_dict(model, layout), str(directory / WEIGHTS_NAME), metadata={"format": "pt"})
    meta = {"oxygen_ros": model.config.to_dict(), "layout": layout}
    if n_action_steps is not None:
        meta["n_action_steps"] = int(n_action_steps)
    (directory / CONFIG_NAME).write_text(json.dumps(meta, indent=2))
    return directory


def read_config(directory: str | Path, default: str = "pi05") -> Pi05Config:
    """Our config from ``config.json`` (``oxygen_ros`` key), else the named default (sizes are then taken from
    the tensors by :func:`load_checkpoint`)."""
    path = Path(directory) / CONFIG_NAME
    if not path.exists():
        return get_config(default)
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e
    if isinstance(data, dict) and "oxygen_ros" in data:
        try:
            return Pi05Config.from_dict(data["oxygen_ros"])
        except (TypeError, ValueError, KeyError) as e:
            raise CheckpointError(f"{path}: field 'oxygen_ros' is not a model config ({e})") from e
    return get_config(default)


def read_tensors(weights: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file, under canonical key names.

    Raises:
        CheckpointError: the file is missing or not a readable safetensors file.
    """
    weights = Path(weights)
    if not weights.is_file():
        raise CheckpointError(f"no {WEIGHTS_NAME} at {weights}")
    try:
        return canonical_keys(load_file(str(weights)))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{weights}: cannot read safetensors file ({e})") from e


def load_state_dict_into(model: Pi05Model, tensors: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Map, shape-check and copy checkpoint tensors into ``model``; one CheckpointError names every problem."""
    tensors = canonical_keys(tensors)
    tied = model.config.tie_word_embeddings
    if tied:  # one stored tensor serves both; LeRobot's rule: embed_tokens wins when both are present
        if EMBED_KEY in tensors:
            tensors[LM_HEAD_KEY] = tensors[EMBED_KEY]
        tensors.pop(EMBED_KEY, None)
    expected = {k: v for k, v in model.state_dict().items() if not (tied and k == EMBED_KEY)}
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
    sizes: dict | None = None,
) -> Pi05Model:
    """Build the model for ``directory`` (our, openpi or LeRobot layout) and load every tensor, shape-checked.

    With ``config`` the model is built as given; otherwise from our ``config.json`` when present, else with the
    sizes read from the tensors (:func:`infer_config`, ``sizes`` as there).
    """
    directory = Path(directory)
    weights = directory / WEIGHTS_NAME if directory.is_dir() else directory
    if not weights.is_file():
        raise CheckpointError(f"no {WEIGHTS_NAME} at {weights}")
    ours = config is not None or "oxygen_ros" in _json_keys(weights.parent)
    if config is None and ours:
        config = read_config(weights.parent)
    tensors = read_tensors(weights)
    if config is None:
        config = infer_config(tensors, get_config("pi05").replace(name=weights.parent.name or "checkpoint"), sizes,
                              str(weights))
    model = Pi05Model(config)
    load_state_dict_into(model, tensors, source=str(weights))
    return model.to(device=device, dtype=dtype).eval()


def _json_keys(directory: Path) -> set[str]:
    path = directory / CONFIG_NAME
    if not path.is_file():
        return set()
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e
    return set(data) if isinstance(data, dict) else set()
