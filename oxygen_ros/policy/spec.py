"""The I/O contract of a checkpoint: what its framework feeds the model and how it reads the actions back.

A :class:`PolicySpec` is read from the checkpoint's own files (:mod:`oxygen_ros.policy.formats`) and is the only
thing pre- and post-processing consult, so the node, the bag evaluation and the toy evaluation cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from oxygen_ros.engine.rtc import RTCConfig

__all__ = ["FRAMEWORKS", "IMAGE_RESIZES", "MISSING_CAMERA_RULES", "NORM_MODES", "FeatureNorm", "PolicySpec"]

FRAMEWORKS = ("oxygen", "openpi", "lerobot")
NORM_MODES = ("identity", "mean_std", "quantiles", "quantile10", "min_max")
# pil_bilinear: openpi's uint8 PIL resize-with-pad (antialiased, black padding, offset rounded down);
# torch_bilinear: LeRobot's float [0, 1] F.interpolate (no antialias), centred padding 0, remainder bottom/right.
IMAGE_RESIZES = ("pil_bilinear", "torch_bilinear")
# in_place: a missing camera keeps its slot, filled with a zero (-1) image, masked (openpi);
# append: present cameras in slot order, then one -1 placeholder per missing camera, masked (LeRobot).
MISSING_CAMERA_RULES = ("in_place", "append")


@dataclass(frozen=True)
class FeatureNorm:
    """Normalisation of one feature (state or action) with its framework's exact formula.

    ``convention`` openpi: float64 numpy, ``+1e-6`` on ranges and std both ways. lerobot: float32 torch,
    MEAN_STD ``(x - mean) / (std + eps)`` and back ``x * std + mean``; ranges use ``eps`` only where they are 0.
    """

    mode: str
    stats: dict[str, np.ndarray] = field(default_factory=dict)
    convention: str = "openpi"
    eps: float = 1e-6

    @property
    def dim(self) -> int | None:
        return int(next(iter(self.stats.values())).shape[-1]) if self.stats else None

    def describe(self) -> str:
        return f"{self.mode} ({self.convention}, dims {self.dim})" if self.mode != "identity" else "identity"


@dataclass(frozen=True)
class PolicySpec:
    """Everything between raw robot data and the model, for one checkpoint.

    Attributes:
        framework: which framework's semantics apply (oxygen | openpi | lerobot).
        checkpoint: the checkpoint directory.
        camera_slots: the model's image slots in prefix order (LeRobot: its VISUAL features, then
            ``empty_camera_i`` placeholders).
        default_cameras: the slots a robot of this checkpoint normally feeds (the node's default camera_names).
        missing_camera: :data:`MISSING_CAMERA_RULES`.
        image_resize: :data:`IMAGE_RESIZES`.
        image_size: square model image side.
        state_dim: raw state dims the checkpoint expects (None: any).
        action_dims: action dims kept of the model's padded output.
        chunk_size: actions the model denoises per chunk (H).
        n_action_steps: actions of a chunk to execute before the next chunk (LeRobot's n_action_steps).
        state_norm, action_norm: normalisation (None: identity).
        state_in_prompt: pi0.5 prompt with the discretised state; False: the pi0 prompt (openpi's pi05_libero).
        clip_state: clip the normalised state to [-1, 1] before discretising (only our toy checkpoints).
        delta_mask: per action dim, True = the model predicts an offset added to the state (openpi
            AbsoluteActions, LeRobot relative actions).
        robot_adapter: input/output adapter (none | aloha: openpi's joint flips and gripper conversion).
        tokenizer: the SentencePiece model to use (None: must be given).
        max_token_len: padded prompt length.
        time_schedule: Euler times (see :class:`~oxygen_ros.engine.config.Pi05Config`).
        rename_map: raw observation key renames applied first (LeRobot's rename_observations_processor).
        rtc: the checkpoint's real-time-chunking settings (LeRobot's ``rtc_config``; None: it has none).
        notes: what was read from where, for the log.
        openpi_config: openpi checkpoints: the train config whose data transforms apply (pi05_libero, ...).
        checkpoint_dtype: the precision the checkpoint's config asks its framework for (LeRobot's ``config.json``
            ``dtype``: float32 | bfloat16; '' where the framework decides alone). ``dtype: auto`` follows it
            (``oxygen_ros.policy.device.choose_precision``).
    """

    framework: str
    checkpoint: Path
    camera_slots: tuple[str, ...]
    missing_camera: str
    image_resize: str
    image_size: int
    state_dim: int | None
    action_dims: int
    chunk_size: int
    n_action_steps: int
    state_norm: FeatureNorm | None
    action_norm: FeatureNorm | None
    state_in_prompt: bool = True
    clip_state: bool = False
    delta_mask: tuple[bool, ...] = ()
    robot_adapter: str = "none"
    tokenizer: Path | None = None
    max_token_len: int = 200
    time_schedule: str = "accumulate"
    default_cameras: tuple[str, ...] = ()
    rename_map: dict[str, str] = field(default_factory=dict)
    rtc: RTCConfig | None = None
    notes: tuple[str, ...] = ()
    openpi_config: str = ""
    checkpoint_dtype: str = ""

    def summary(self) -> str:
        """One line for the log."""
        sn = self.state_norm.describe() if self.state_norm else "identity"
        an = self.action_norm.describe() if self.action_norm else "identity"
        deltas = sum(self.delta_mask)
        return (f"{self.framework} checkpoint: cameras {list(self.camera_slots)} (missing: {self.missing_camera}), "
                f"resize {self.image_resize} to {self.image_size}, state {self.state_dim or 'any'} dims "
                f"({'in' if self.state_in_prompt else 'not in'} prompt, norm {sn}), actions {self.action_dims} dims "
                f"x {self.chunk_size} (execute {self.n_action_steps}, norm {an}, {deltas} delta dims, adapter "
                f"{self.robot_adapter})")
