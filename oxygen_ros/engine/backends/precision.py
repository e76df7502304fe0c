"""Precision policies: which parameters run in which dtype.

``float32`` / ``bfloat16`` / ``float16``: the whole model in that dtype. ``bfloat16_islands``: openpi's mixed
precision as its PyTorch ``Policy.infer`` runs it (``create_trained_policy`` applies
``PaliGemmaWithExpertModel.to_bfloat16_for_selected_params("bfloat16")`` even to fp32 checkpoints), reproduced op
by op:

- bfloat16: every transformer weight (SigLIP encoder and its LayerNorms, projector, token embedding, Gemma
  projections and MLPs of both experts), the hidden states between them and the KV cache;
- float32 holding bfloat16-rounded values: every Gemma RMSNorm weight, the adaRMS ``dense`` layers, SigLIP's
  patch and position embeddings (openpi casts the whole model to bfloat16 and then these back to float32);
- float32, exact: the action projections (``action_in_proj``, ``action_out_proj``) and the time MLP
  (``time_mlp_in/out``): openpi never casts them, so the flow-matching state and the time condition stay float32;
- computed as openpi does (``Pi05Model.openpi_rounding``): images enter the patch embedding in float32; the
  norms in float32, their output rounded to bfloat16; attention scores and probabilities rounded to bfloat16
  around a float32 softmax (HF's eager attention, not SDPA); RoPE frequencies rounded to bfloat16 (HF's
  ``inv_freq`` buffer is cast with the model); every product rounded before its sum (no fused multiply-adds).

``bfloat16_lerobot``: LeRobot 0.6.1's ``PI05Policy`` with ``config.json`` ``dtype: bfloat16``
(``PaliGemmaWithExpertModel.to_bfloat16_for_selected_params``), which differs from openpi's islands:

- float32 holding the checkpoint's **exact** values (LeRobot casts in the constructor and loads the weights after
  it, so ``load_state_dict`` copies them unrounded into the float32 parameters): the whole vision path (SigLIP and
  the projector, ``params_to_keep_float32`` = vision_tower, multi_modal_projector), every Gemma RMSNorm and the
  adaRMS ``dense`` layers (input_layernorm, post_attention_layernorm, model.norm), and the action and time
  projections (they live outside ``PaliGemmaWithExpertModel``, which is the only part cast);
- bfloat16: the token embedding / LM head and the Gemma projections and MLPs of both experts, their hidden states
  and the KV cache; the image features enter the backbone rounded to bfloat16 once (``PiGemmaModel`` casts its
  float32 inputs);
- computed with openpi's roundings otherwise (HF's eager attention, norms in float32 rounded to bfloat16, bf16
  RoPE frequencies: ``model.to(bfloat16)`` cast the ``inv_freq`` buffer, which ``load_state_dict`` never reloads).

``bfloat16`` (plain) keeps SDPA, exact RoPE frequencies and fused multiply-adds: faster, not openpi's numerics.

On CUDA the float32 work also depends on two process-wide torch flags, TF32 in float32 matrix products and in
cuDNN convolutions (the patch embedding). torch's defaults differ (matmul off, cuDNN on), so each policy sets both
(:data:`CUDA_MATH`, :func:`apply_cuda_math`) when the model is cast: openpi's ``PI0Pytorch.__init__`` calls
``torch.set_float32_matmul_precision("high")`` (its fixtures record "high"), LeRobot 0.6.1's ``PI05Policy`` only when
``compile_model`` is set (eager: torch's defaults), ``float32`` is IEEE float32 throughout. The flags do not change
float32 results on the CPU (openpi's fixture README: checked on the AMD EPYC host).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from ..layers import AdaRMSNorm, RMSNorm, SiglipEmbeddings

PRECISIONS: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                                      "float16": torch.float16, "bfloat16_islands": torch.bfloat16,
                                      "bfloat16_lerobot": torch.bfloat16}
ROUNDED = ("bfloat16_islands", "bfloat16_lerobot")  # the precisions computed with openpi's roundings
ISLAND_NAMES = ("action_in_proj", "action_out_proj", "time_mlp_in", "time_mlp_out")
# per policy: TF32 in CUDA float32 matrix products (torch.backends.cuda.matmul.allow_tf32) and in cuDNN convolutions
# (torch.backends.cudnn.allow_tf32), as the framework whose numerics the policy reproduces leaves them
CUDA_MATH: dict[str, dict[str, bool]] = {
    "float32": {"matmul_tf32": False, "cudnn_tf32": False},  # IEEE float32 everywhere (the CPU reference's)
    "bfloat16_islands": {"matmul_tf32": True, "cudnn_tf32": True},  # openpi: matmul precision "high"
    "bfloat16_lerobot": {"matmul_tf32": False, "cudnn_tf32": True},  # LeRobot eager: torch's defaults
    "bfloat16": {"matmul_tf32": True, "cudnn_tf32": True},  # speed: only small float32 ops are left
    "float16": {"matmul_tf32": True, "cudnn_tf32": True},
}
log = logging.getLogger(__name__)


def apply_cuda_math(precision: str) -> dict[str, bool]:
    """Set the process-wide CUDA TF32 flags for ``precision`` (:data:`CUDA_MATH`); returns what was set, for the
    configure log. Process-wide: the last model cast decides for every model of the process."""
    if precision not in CUDA_MATH:
        raise ValueError(f"precision must be one of {tuple(CUDA_MATH)}, got {precision!r}")
    math = dict(CUDA_MATH[precision])
    torch.backends.cuda.matmul.allow_tf32 = math["matmul_tf32"]
    torch.backends.cudnn.allow_tf32 = math["cudnn_tf32"]
    return math


def cuda_math_state() -> dict[str, bool]:
    """The CUDA TF32 flags as they are now."""
    return {"matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32)}


def exact_islands(model: nn.Module) -> list[nn.Linear]:
    """The action and time projections (of a ``Pi05Model``, extra ``ActionHead`` s, ...): float32, never rounded."""
    return [getattr(m, n) for m in model.modules() for n in ISLAND_NAMES if isinstance(getattr(m, n, None), nn.Linear)]


def float32_islands(model: nn.Module) -> list[nn.Module]:
    """The modules ``bfloat16_islands`` keeps in float32: the norms and SigLIP embeddings (bfloat16-rounded values)
    and :func:`exact_islands`."""
    out = [m for m in model.modules() if isinstance(m, RMSNorm | AdaRMSNorm | SiglipEmbeddings)]
    return out + exact_islands(model)


def lerobot_float32_modules(model: nn.Module) -> list[nn.Module]:
    """The modules ``bfloat16_lerobot`` keeps in float32 with exact values: the vision tower and projector, every
    RMSNorm / adaRMS norm (its ``dense`` layer included) and :func:`exact_islands`."""
    vision = [m for name, m in model.named_modules()
              if name.rsplit(".", 1)[-1] in ("vision_tower", "multi_modal_projector")]
    norms = [m for m in model.modules() if isinstance(m, RMSNorm | AdaRMSNorm)]
    return vision + norms + exact_islands(model)


def float32_modules(model: nn.Module, precision: str) -> list[nn.Module]:
    """The modules ``precision`` keeps in float32 (none for the plain dtypes)."""
    if precision == "bfloat16_islands":
        return float32_islands(model)
    if precision == "bfloat16_lerobot":
        return lerobot_float32_modules(model)
    return []


def apply_precision(model: nn.Module, precision: str) -> nn.Module:
    """Cast ``model`` (and keep its float32 islands) per ``precision``, in place; returns it."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, got {precision!r}")
    keep = float32_modules(model, precision)
    exact_modules = exact_islands(model) if precision == "bfloat16_islands" else keep
    exact = [(p, p.detach().clone()) for m in exact_modules for p in m.parameters()] if keep else []
    model.to(PRECISIONS[precision])
    for m in keep:
        m.float()  # islands: the norms and embeddings hold bfloat16-rounded values in float32, as openpi leaves them
    with torch.no_grad():
        for p, value in exact:
            p.copy_(value)
    for m in model.modules():
        if hasattr(m, "openpi_rounding"):  # Pi05Model and the norms and embeddings of layers.py
            m.openpi_rounding = precision in ROUNDED
    math = apply_cuda_math(precision)
    model.__dict__["cuda_math"] = math  # what the configure log reports (Policy.precision_line)
    log.info("precision %s: CUDA TF32 matmul %s, cuDNN conv TF32 %s", precision,
             "on" if math["matmul_tf32"] else "off", "on" if math["cudnn_tf32"] else "off")
    return model
