"""The benchmark model: a random-weight pi0.5 (and extra action heads), optionally on oneDNN or torch.compile'd.

Every benchmark command (``oxygen-bench``, the sweep, ``oxygen-profile``) builds its model here, so the weights
for a (config, preset, seed) and the oneDNN rule are the same everywhere.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

import torch
from torch import nn

from oxygen_ros.engine import Pi05Model, get_config
from oxygen_ros.engine.backends.cpu_kernels import use_onednn
from oxygen_ros.engine.checkpoint import init_random_weights
from oxygen_ros.engine.config import DTYPES
from oxygen_ros.study.heads import make_extra_heads


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """``DTYPES[name]``; without a name bfloat16 on CUDA and float32 elsewhere."""
    return DTYPES[name or ("bfloat16" if device.type == "cuda" else "float32")]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (the spelling the JSON records use)."""
    return str(dtype).replace("torch.", "")


def onednn_applies(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN's small-row linear exists for float32 on CPU only."""
    return device.type == "cpu" and dtype == torch.float32


def build_model(config: str, preset: str | None, device: torch.device, dtype: torch.dtype, seed: int = 0,
                onednn: bool = True, **overrides: object) -> tuple[Pi05Model, bool]:
    """Random-weight pi0.5 in eval mode, and whether its linears run on oneDNN.

    The model is built directly on ``device`` and cast before the (CPU-generated, seeded) init is copied in, so
    a full-size model never has to fit in host memory first. ``onednn`` asks for oneDNN's linear; it is used
    where it applies (float32 on CPU) and is available. ``overrides`` replace config fields (e.g. ``num_steps``).
    """
    cfg = get_config(config, preset, **overrides)
    with torch.device(device):
        model = Pi05Model(cfg)
    model = init_random_weights(model.to(dtype=dtype), seed=seed).eval()
    onednn = onednn and onednn_applies(device, dtype) and use_onednn(model) > 0
    return model, onednn


def add_model_args(ap: argparse.ArgumentParser, seed: bool = True) -> None:
    """The options where the benchmark model runs: ``--device``, ``--dtype``, ``--no-onednn``, ``--threads`` (and
    ``--seed`` of its random weights)."""
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: float32 on CPU, bfloat16 on GPU")
    ap.add_argument("--no-onednn", action="store_true", help="keep plain F.linear on CPU (default: oneDNN)")
    ap.add_argument("--threads", type=int, default=None)
    if seed:
        ap.add_argument("--seed", type=int, default=0)


def model_from_args(a: argparse.Namespace, **overrides: object) -> tuple[Pi05Model, bool]:
    """:func:`build_model` from ``--config``, ``--preset`` and :func:`add_model_args`' options (``--threads`` set
    first); prints what was built."""
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    model, onednn = build_model(a.config, a.preset, device, resolve_dtype(a.dtype, device), seed=a.seed,
                                onednn=not a.no_onednn, **overrides)
    print(f"model {model.config.name}/{a.preset}: {model.num_parameters() / 1e6:.1f}M parameters on {device} "
          f"{dtype_name(model.dtype)}, oneDNN linear: {onednn}")
    return model, onednn


def build_heads(model: Pi05Model, count: int, seed: int = 0, onednn: bool = False) -> nn.ModuleList:
    """``count`` extra action experts for ``model`` (random weights from ``seed + 1``), on its device and dtype;
    ``onednn``: convert their linears too (pass what ``build_model`` returned)."""
    heads = init_random_weights(make_extra_heads(model.config, count), seed=seed + 1)
    heads = heads.to(device=model.device, dtype=model.dtype).eval()
    if onednn:
        use_onednn(heads)
    return heads


def compile_modules(roots: Iterable[nn.Module], mode: str, backend: str = "inductor") -> int:
    """torch.compile, in place, the pieces with static or few shapes; returns how many were compiled."""
    from oxygen_ros.engine.backends.graphs import allow_recompiles
    from oxygen_ros.engine.layers import AdaRMSNorm, GemmaMLP, RMSNorm, SiglipVisionTower

    allow_recompiles(64)  # one entry per distinct (module class, width, shape kind)
    kwargs = {"backend": backend} | ({"mode": mode} if backend == "inductor" else {})
    n = 0
    for root in roots:
        for m in root.modules():
            if isinstance(m, SiglipVisionTower | GemmaMLP | RMSNorm | AdaRMSNorm):
                m.compile(**kwargs)
                n += 1
    return n
