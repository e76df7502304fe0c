"""Suffix-only LoRA for language requests (PEFT format), e.g. the authors' textual-memory adapter.

The adapter changes the backbone's projections for the tokens a language request appends, and nothing else:
the shared prefix and the action path never see it, so actions stay bit-identical with an adapter loaded.
Rows of a batched decode step that belong to requests without the adapter are masked out of the update; rows of
different adapters share one forward through :class:`LoraSet` (each adapter's update masked to its own rows, as
multi-LoRA servers batch them), so a request decodes the same tokens batched with others as alone.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .layers import apply_rope, gated_residual

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# the fused path's projections (fast_path.layer_forward) and the modules each concatenates
FUSED_GROUPS = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
                "down": ("down_proj",)}
_KEY = re.compile(r"language_model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


class _AdaptedLayers:
    """The eager path's adapted attention and MLP of one backbone layer, built on ``_apply`` (one projection plus
    the update(s))."""

    def _apply(self, layer_idx: int, module: str, linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def qkv(self, model, i: int, layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        g = model.config.backbone
        b, t, _ = x.shape
        a = layer.self_attn
        q = self._apply(i, "q_proj", a.q_proj, x).view(b, t, g.num_heads, g.head_dim).transpose(1, 2)
        k = self._apply(i, "k_proj", a.k_proj, x).view(b, t, g.num_kv_heads, g.head_dim).transpose(1, 2)
        v = self._apply(i, "v_proj", a.v_proj, x).view(b, t, g.num_kv_heads, g.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attn_out_mlp(self, model, i: int, layer, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        h = gated_residual(h, self._apply(i, "o_proj", layer.self_attn.o_proj, attn), None)
        x, _ = layer.post_attention_layernorm(h)
        mlp = layer.mlp
        inner = torch.nn.functional.gelu(self._apply(i, "gate_proj", mlp.gate_proj, x), approximate="tanh")
        inner = inner * self._apply(i, "up_proj", mlp.up_proj, x)
        return gated_residual(h, self._apply(i, "down_proj", mlp.down_proj, inner), None)


class LoraAdapter(_AdaptedLayers):
    """Low-rank updates W + scale * B @ A for backbone layers, loaded from a PEFT adapter directory."""

    def __init__(self, weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]], scale: float,
                 name: str = "adapter") -> None:
        self.weights = weights  # (layer, module) -> (A [r, in], B [out, r])
        self.scale = scale
        self.name = name
        self.row_mask: torch.Tensor | None = None  # [B, 1, 1] set per decode step by the engine
        self._fused: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor] | None] = {}

    @staticmethod
    def load(directory: str | Path, dtype: torch.dtype = torch.float32, device="cpu") -> LoraAdapter:
        """Read ``adapter_config.json`` + ``adapter_model.safetensors`` (PEFT)."""
        directory = Path(directory)
        cfg = json.loads((directory / "adapter_config.json").read_text())
        tensors = load_file(str(directory / "adapter_model.safetensors"))
        pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
        for key, t in tensors.items():
            m = _KEY.search(key)
            if m is None:
                if "gemma_expert" in key or "vision" in key:
                    raise ValueError(f"{directory}: adapter touches {key}; only backbone (suffix) LoRA is allowed")
                raise ValueError(f"{directory}: unrecognised adapter key {key}")
            layer, _, module, ab = int(m[1]), m[2], m[3], m[4]
            pairs.setdefault((layer, module), {})[ab] = t.to(device=device, dtype=dtype)
        weights = {k: (v["A"], v["B"]) for k, v in pairs.items()}
        return LoraAdapter(weights, cfg.get("lora_alpha", cfg["r"]) / cfg["r"], directory.name)

    @staticmethod
    def save(directory: str | Path, weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]], r: int,
             alpha: float) -> Path:
        """Write a PEFT-format adapter (used by tests and training)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for (layer, module), (a, b) in weights.items():
            group = "self_attn" if module in TARGETS[:4] else "mlp"
            base = f"base_model.model.paligemma_with_expert.paligemma.model.language_model.layers.{layer}.{group}"
            tensors[f"{base}.{module}.lora_A.weight"] = a.contiguous()
            tensors[f"{base}.{module}.lora_B.weight"] = b.contiguous()
        save_file(tensors, str(directory / "adapter_model.safetensors"))
        modules = sorted({m for _, m in weights})
        (directory / "adapter_config.json").write_text(json.dumps(
            {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": modules, "bias": "none"}, indent=2))
        return directory

    # ------------------------------------------------------------------------------------- forward hooks
    def _apply(self, layer_idx: int, module: str, linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return self.add_delta(layer_idx, module, x, linear(x))

    def add_delta(self, layer_idx: int, module: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` (module's projection of ``x``) plus this adapter's update, on its rows (``row_mask``)."""
        ab = self.weights.get((layer_idx, module))
        if ab is None:
            return y
        delta = (x @ ab[0].T) @ ab[1].T * self.scale
        return y + delta if self.row_mask is None else y + delta * self.row_mask

    def _fused_ab(self, i: int, group: str, splits: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A [sum r, in] and block-diagonal B [out, sum r] of fused projection ``group`` of layer i, whose outputs
        are split ``splits`` among its modules (None: none of them adapted). Built once per layer and group."""
        key = (i, group)
        if key not in self._fused:
            present = [(j, self.weights[(i, m)]) for j, m in enumerate(FUSED_GROUPS[group]) if (i, m) in self.weights]
            fused = None
            if present:
                a = torch.cat([ab[0] for _, ab in present])
                b = torch.zeros(sum(splits), a.shape[0], dtype=a.dtype, device=a.device)
                col = 0
                for j, (_, bm) in present:
                    row = sum(splits[:j])
                    b[row:row + bm.shape[0], col:col + bm.shape[1]] = bm
                    col += bm.shape[1]
                fused = (a, b)
            self._fused[key] = fused
        return self._fused[key]

    def fused_delta(self, i: int, group: str, x: torch.Tensor, y: torch.Tensor,
                    splits: list[int] | None = None) -> torch.Tensor:
        """``y`` = fused projection ``group`` of layer i applied to ``x``, plus this adapter's update (one pair of
        small matrix products for the whole group)."""
        ab = self._fused_ab(i, group, splits or [y.shape[-1]])
        if ab is None:
            return y
        delta = (x @ ab[0].T) @ ab[1].T * self.scale
        return y + delta if self.row_mask is None else y + delta * self.row_mask


class LoraSet(_AdaptedLayers):
    """Several adapters in one batched forward: each adds its update to the rows its ``row_mask`` selects (the
    per-row adapter index of multi-LoRA serving, as masks). Same interface as :class:`LoraAdapter`."""

    def __init__(self, adapters: list[LoraAdapter]) -> None:
        self.adapters = adapters

    def _apply(self, layer_idx: int, module: str, linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        y = linear(x)
        for a in self.adapters:
            y = a.add_delta(layer_idx, module, x, y)
        return y

    def fused_delta(self, i: int, group: str, x: torch.Tensor, y: torch.Tensor,
                    splits: list[int] | None = None) -> torch.Tensor:
        for a in self.adapters:
            y = a.fused_delta(i, group, x, y, splits)
        return y


def batch_lora(row_adapters: list[LoraAdapter | None], dtype: torch.dtype,
               device: torch.device | str) -> LoraAdapter | LoraSet | None:
    """The adapter object of one decode forward whose row i uses ``row_adapters[i]`` (None: the base model):
    each adapter's ``row_mask`` set to its rows; one adapter alone, several as a :class:`LoraSet`."""
    used: list[LoraAdapter] = []
    for a in row_adapters:
        if a is not None and all(a is not u for u in used):
            used.append(a)
    for a in used:
        mask = [float(r is a) for r in row_adapters]
        a.row_mask = torch.tensor(mask, dtype=dtype, device=device)[:, None, None]
    if not used:
        return None
    return used[0] if len(used) == 1 else LoraSet(used)


def random_lora_weights(model, r: int = 4, std: float = 0.05, zero: bool = False, seed: int = 0,
                        modules: tuple[str, ...] = ("q_proj", "v_proj")):
    """LoRA weights for every backbone layer (PEFT initialises B = 0: ``zero=True`` gives that adapter)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for i, layer in enumerate(model.backbone.layers):
        for m in modules:
            lin = getattr(layer.self_attn if m in TARGETS[:4] else layer.mlp, m)
            a = torch.randn(r, lin.in_features, generator=gen) * std
            b = torch.zeros(lin.out_features, r) if zero else torch.randn(lin.out_features, r, generator=gen) * std
            out[(i, m)] = (a, b)
    return out
