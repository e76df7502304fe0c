"""Model configurations (full pi0.5 and small CPU/test sizes) and workload presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

CAMERA_SLOTS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
TIME_SCHEDULES = ("accumulate", "exact")
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class VisionConfig:
    """SigLIP vision tower."""

    width: int = 1152
    """Hidden size of each patch token (SigLIP So400m: 1152)."""
    depth: int = 27
    """Encoder layers."""
    mlp_dim: int = 4304
    """Hidden size of each layer's MLP."""
    num_heads: int = 16
    """Attention heads per layer (head size = width / num_heads)."""
    patch_size: int = 14
    """Side of a square patch, in pixels: one patch is one image token."""
    image_size: int = 224
    """Side of the square input image, in pixels."""
    layer_norm_eps: float = 1e-6
    """LayerNorm epsilon."""

    @property
    def tokens_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True)
class GemmaConfig:
    """One Gemma transformer stack (the backbone or the action expert)."""

    width: int
    """Hidden size (the residual stream's width)."""
    depth: int
    """Transformer layers (the backbone and the action expert must have as many: one joint attention a layer)."""
    mlp_dim: int
    """Hidden size of each layer's gated MLP."""
    num_heads: int = 8
    """Query heads per layer."""
    num_kv_heads: int = 1
    """Key/value heads per layer (1: multi-query attention); num_heads is a multiple of it."""
    head_dim: int = 256
    """Size of one attention head; independent of width (the action expert shares the backbone's heads)."""
    rope_theta: float = 10000.0
    """Base of the rotary position embedding's frequencies."""
    rms_eps: float = 1e-6
    """RMSNorm epsilon."""


@dataclass(frozen=True)
class Pi05Config:
    """pi0.5: PaliGemma (SigLIP + Gemma) backbone + Gemma action expert with adaRMSNorm time conditioning."""

    name: str
    """The size's name (a key of :data:`MODEL_CONFIGS` for the built-in ones)."""
    vision: VisionConfig
    backbone: GemmaConfig
    """PaliGemma's Gemma: the image and prompt tokens (and the language outputs)."""
    expert: GemmaConfig
    """The action expert: the action tokens, attending jointly with the backbone layer by layer."""
    vocab_size: int = 257152
    """Token vocabulary (PaliGemma's tokenizer: 257152)."""
    action_dim: int = 32
    """Width of one action (and of the state) inside the model; a robot's fewer dimensions are zero-padded."""
    action_horizon: int = 10
    """Actions per chunk (H)."""
    max_token_len: int = 200
    """Prompt tokens (the language part of the prefix, padded to this length)."""
    camera_names: tuple[str, ...] = CAMERA_SLOTS
    """The camera slots the model sees, in prefix order."""
    num_steps: int = 10
    """Euler steps of the flow-matching denoise per chunk."""
    tie_word_embeddings: bool = True
    """LM head shares the token embedding (openpi); LeRobot >= 0.5 fine-tunes may store two different tensors."""
    time_schedule: str = "accumulate"
    """Euler times: "accumulate" = openpi (t += dt in float32); "exact" = LeRobot (t_k = float32(1 + k * dt))."""
    extra: dict = field(default_factory=dict, compare=False)
    """Anything else a caller keeps with the config: not compared, not in :meth:`to_dict`."""

    def __post_init__(self) -> None:
        b, e = self.backbone, self.expert
        if (b.num_heads, b.num_kv_heads, b.head_dim) != (e.num_heads, e.num_kv_heads, e.head_dim):
            raise ValueError("backbone and action expert must share heads / kv heads / head_dim (joint attention)")
        if b.depth != e.depth:
            raise ValueError("backbone and action expert must have the same depth (one joint attention per layer)")
        if b.num_heads % b.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.time_schedule not in TIME_SCHEDULES:
            raise ValueError(f"time_schedule must be one of {TIME_SCHEDULES}, got {self.time_schedule!r}")

    @property
    def num_cameras(self) -> int:
        return len(self.camera_names)

    @property
    def max_prefix_len(self) -> int:
        return self.num_cameras * self.vision.tokens_per_image + self.max_token_len

    def replace(self, **changes) -> Pi05Config:
        """A copy with some fields changed (e.g. ``cfg.replace(action_horizon=50)``)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("extra")
        return d

    @staticmethod
    def from_dict(d: dict) -> Pi05Config:
        d = dict(d)
        return Pi05Config(
            vision=VisionConfig(**d.pop("vision")),
            backbone=GemmaConfig(**d.pop("backbone")),
            expert=GemmaConfig(**d.pop("expert")),
            camera_names=tuple(d.pop("camera_names", CAMERA_SLOTS)),
            **d,
        )


def _pi05() -> Pi05Config:
    return Pi05Config(
        name="pi05",
        vision=VisionConfig(),
        backbone=GemmaConfig(width=2048, depth=18, mlp_dim=16384),
        expert=GemmaConfig(width=1024, depth=18, mlp_dim=4096),
    )


def _tiny() -> Pi05Config:
    """Unit-test size: a few hundred thousand parameters, milliseconds per forward."""
    return Pi05Config(
        name="tiny",
        vision=VisionConfig(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=14, image_size=28),
        backbone=GemmaConfig(width=64, depth=2, mlp_dim=128, num_heads=4, num_kv_heads=1, head_dim=16),
        expert=GemmaConfig(width=32, depth=2, mlp_dim=64, num_heads=4, num_kv_heads=1, head_dim=16),
        vocab_size=512,
        action_dim=8,
        max_token_len=48,
    )


def _small() -> Pi05Config:
    """CPU benchmark size (140M parameters), calibrated on a 2-core CPU so the stage cost ratios come as close to
    pi0.5 on a GPU as a CPU allows: prefill ~2x the 10-step denoise loop; one decode step ~0.1x a prefill (GPU:
    ~0.3x; CPU decode is bandwidth-cheap relative to its compute-bound prefill). See README, Benchmarks."""
    return Pi05Config(
        name="small",
        vision=VisionConfig(width=256, depth=4, mlp_dim=1024, num_heads=4, patch_size=14, image_size=84),
        backbone=GemmaConfig(width=1024, depth=8, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=128),
        expert=GemmaConfig(width=256, depth=8, mlp_dim=1024, num_heads=8, num_kv_heads=1, head_dim=128),
        vocab_size=2048,
        max_token_len=48,
    )


MODEL_CONFIGS = {"pi05": _pi05, "small": _small, "tiny": _tiny}


@dataclass(frozen=True)
class WorkloadPreset:
    """Robot-side shape of a deployment: which cameras feed the model and how long a chunk is."""

    name: str
    camera_names: tuple[str, ...]
    action_horizon: int


WORKLOAD_PRESETS = {
    "libero": WorkloadPreset("libero", CAMERA_SLOTS[:2], 10),
    "droid": WorkloadPreset("droid", CAMERA_SLOTS[:2], 15),
    "aloha": WorkloadPreset("aloha", CAMERA_SLOTS, 50),
}


def get_config(name: str, preset: str | None = None, **overrides) -> Pi05Config:
    """Named model config, optionally shaped by a workload preset and field overrides."""
    if name not in MODEL_CONFIGS:
        raise KeyError(f"unknown model config {name!r}; known: {sorted(MODEL_CONFIGS)}")
    cfg = MODEL_CONFIGS[name]()
    if preset is not None:
        if preset not in WORKLOAD_PRESETS:
            raise KeyError(f"unknown workload preset {preset!r}; known: {sorted(WORKLOAD_PRESETS)}")
        p = WORKLOAD_PRESETS[preset]
        cfg = cfg.replace(camera_names=p.camera_names, action_horizon=p.action_horizon)
    return cfg.replace(**overrides) if overrides else cfg
