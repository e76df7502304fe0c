"""A loaded checkpoint with its I/O contract: raw robot data in, robot-unit action chunks out.

    policy = load_policy("path/to/checkpoint")                       # LeRobot, openpi or our layout
    chunk = policy.infer(RawObservation({"base_0_rgb": rgb}, state, "pick up the cup"), noise)

:meth:`Policy.prepare` and :meth:`Policy.postprocess` are the two halves the engine-driven
:class:`~oxygen_ros.policy.runner.FrameRunner` uses around ``engine.step``; :meth:`Policy.infer` runs them around
the model's plain ``sample_actions`` (the reference the tests compare with the frameworks' own pipelines).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from oxygen_ros.engine.backends.precision import apply_precision
from oxygen_ros.engine.checkpoint import CheckpointError, infer_config, load_state_dict_into, read_tensors
from oxygen_ros.engine.checkpoint import read_config as read_oxygen_config
from oxygen_ros.engine.config import get_config
from oxygen_ros.engine.model import Pi05Model
from oxygen_ros.engine.observation import Observation
from oxygen_ros.engine.rtc import RTCConfig, RTCGuide, RTCPrefix
from oxygen_ros.engine.tokenizer import PromptTokenizer

from .adapters import decode_actions, decode_state, encode_actions
from .device import PrecisionChoice, choose_precision
from .errors import PolicyConfigError
from .formats import SpecOptions, detect_layout
from .formats.common import read_json
from .formats.lerobot import IMAGE_PREFIX, read_lerobot
from .formats.openpi import read_openpi
from .formats.oxygen import read_oxygen
from .images import as_hwc_uint8, assemble_slots, image_to_model
from .normalize import normalize, unnormalize
from .rtc import PAPER_RTC
from .spec import PolicySpec

__all__ = ["Policy", "PreparedObservation", "RawObservation", "load_policy"]

SIZES_SIDECAR = "tiny_dims.json"  # model sizes beside a test checkpoint (LeRobot fixtures); optional


@dataclass
class RawObservation:
    """One robot observation as the robot has it.

    images: camera slot name (or LeRobot key ``observation.images.<slot>``) -> RGB [H, W, 3] or [3, H, W] at the
        camera's native size, uint8 or float in [0, 1]; a missing slot is simply absent.
    state: raw state in robot units (the checkpoint's state order).
    task: the instruction text, uncleaned.
    subtask: a subtask to condition the actions on ('' = none: exactly upstream's prompt); see
        :meth:`oxygen_ros.engine.tokenizer.PromptTokenizer.tokenize_action_prompt`.
    """

    images: Mapping[str, np.ndarray]
    state: np.ndarray
    task: str
    subtask: str = ""


@dataclass
class PreparedObservation:
    """Model input of one observation plus what post-processing needs from it."""

    observation: Observation
    reference_state: np.ndarray  # state in the checkpoint's action space, for delta dims
    prompt_tokens: int
    prompt_truncated: bool  # the prompt's end was cut (the state alone overflows max_token_len)
    normalized_state: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    instruction_cut: bool = False  # the instruction was cut so that the state fits
    subtask: str = ""  # the subtask the action prompt holds ('' = none)


class Policy:
    """A pi0.5 model, its tokenizer and its checkpoint's :class:`PolicySpec`."""

    def __init__(self, spec: PolicySpec, model: Pi05Model, tokenizer: PromptTokenizer,
                 precision: PrecisionChoice | None = None) -> None:
        self.spec, self.model, self.tokenizer = spec, model, tokenizer
        # the precision the model was cast to, and why (``dtype: auto`` follows the checkpoint)
        self.precision = precision or PrecisionChoice(_dtype_name(model.dtype), "as built")
        # An instruction too long for the prompt is cut so that the state stays (upstream cuts the prompt's end,
        # the state and "Action:"); prompts that fit are tokenised exactly as upstream either way.
        self.keep_state_in_prompt = True

    # ------------------------------------------------------------------------------------------ inputs
    def slot_of(self, key: str) -> str:
        """The model slot a raw image key names (renames applied, LeRobot's ``observation.images.`` dropped)."""
        key = self.spec.rename_map.get(key, key)
        return key.removeprefix(IMAGE_PREFIX)

    def convert_image(self, image: np.ndarray, name: str = "image") -> np.ndarray:
        """One raw camera image -> float32 [3, S, S] in [-1, 1] with the checkpoint's resize convention."""
        keep_float = self.spec.image_resize == "torch_bilinear"
        return image_to_model(as_hwc_uint8(image, name, keep_float), self.spec.image_size, self.spec.image_resize)

    def prepare(self, raw: RawObservation, converted: Mapping[str, np.ndarray] | None = None) -> PreparedObservation:
        """Raw observation -> model input, exactly as the checkpoint's framework prepares it.

        ``converted`` may hold images already passed through :meth:`convert_image`, by slot (the node caches them).

        Raises:
            ValueError: wrong state size, non-finite state, unknown camera, no camera at all.
        """
        spec = self.spec
        pixels = {self.slot_of(k): (converted[k] if converted is not None and k in converted
                                    else self.convert_image(v, k)) for k, v in raw.images.items()}
        images, masks = assemble_slots(pixels, spec.camera_slots, spec.image_size, spec.missing_camera)

        state = np.asarray(raw.state)
        if state.ndim != 1:
            raise ValueError(f"state must be 1-D, got shape {state.shape}")
        if spec.state_dim is not None and state.shape[0] != spec.state_dim:
            raise ValueError(f"state has {state.shape[0]} dims; the checkpoint expects {spec.state_dim}")
        if not np.all(np.isfinite(state)):
            raise ValueError("state contains NaN or Inf")
        if spec.framework == "lerobot":
            state = state.astype(np.float32)  # LeRobot robots and datasets give float32; its maths follows
        else:
            state = decode_state(state.astype(np.float64), spec.robot_adapter)
        norm_state = normalize(state, spec.state_norm)
        if spec.framework == "oxygen":
            norm_state = np.asarray(norm_state, dtype=np.float32)  # our checkpoints are trained on float32 states
        subtask = raw.subtask.strip()
        prompt = self.tokenizer.tokenize_action_prompt(raw.task, norm_state if spec.state_in_prompt else None,
                                                       clip_state=spec.clip_state,
                                                       keep_state=self.keep_state_in_prompt,
                                                       **({"subtask": subtask} if subtask else {}))
        n = prompt.num_tokens
        # padding only costs compute, except in openpi's numerics (bfloat16_islands): there the padded length is
        # part of the rounding (it sets the attention's reduction lengths), so the prompt keeps openpi's padding
        keep = len(prompt.ids) if self.model.rounded else n
        obs = Observation(
            images=torch.from_numpy(images)[None], image_masks=torch.from_numpy(masks)[None],
            tokens=torch.from_numpy(prompt.ids[:keep].copy())[None],
            token_mask=torch.from_numpy(prompt.mask[:keep].copy())[None],
            state=torch.from_numpy(np.asarray(norm_state, dtype=np.float32))[None])
        return PreparedObservation(obs, state, n, prompt.truncated, np.asarray(norm_state), prompt.instruction_cut,
                                   subtask)

    # ------------------------------------------------------------------------------------------ outputs
    def postprocess(self, chunk: np.ndarray | torch.Tensor, prepared: PreparedObservation) -> np.ndarray:
        """Model chunk [H, A] -> robot-unit actions [H, action_dims]: dims kept, unnormalised, deltas made absolute,
        robot adapter applied; in the framework's arithmetic (LeRobot float32; openpi its numpy order on the model's
        float32 output, returning float64; ours float64)."""
        spec = self.spec
        if isinstance(chunk, torch.Tensor):
            chunk = chunk.detach().float().cpu().numpy()
        actions = np.asarray(chunk)[..., : spec.action_dims]
        if spec.framework not in ("lerobot", "openpi"):
            actions = actions.astype(np.float64)  # ours: float64 throughout; LeRobot: float32 throughout
        # openpi unnormalises the model's float32 output as it comes: numpy keeps ``(x + 1) / 2`` in float32 before
        # the float64 statistics promote it (casting first would move its actions by ~1e-7); it returns float64
        actions = unnormalize(actions, spec.action_norm)
        if spec.framework == "openpi":
            actions = np.asarray(actions, dtype=np.float64)
        if any(spec.delta_mask):
            mask = np.zeros(spec.action_dims, dtype=bool)
            mask[: len(spec.delta_mask)] = spec.delta_mask[: spec.action_dims]
            ref = np.zeros(spec.action_dims, dtype=actions.dtype)
            state = prepared.reference_state
            if spec.framework == "openpi":  # openpi adds the state its output transforms unnormalised back
                state = np.asarray(unnormalize(prepared.normalized_state, spec.state_norm))
            n = min(spec.action_dims, state.shape[0])
            ref[:n] = state[:n]
            actions = actions + np.where(mask, ref, 0).astype(actions.dtype)
        return encode_actions(np.array(actions), spec.robot_adapter)

    def model_actions(self, actions: np.ndarray, prepared: PreparedObservation) -> np.ndarray:
        """Robot-unit actions [T, action_dims] -> the model's normalised space, delta dims relative to
        ``prepared``'s state (the inverse of :meth:`postprocess`, float32): how actions the robot executes become a
        real-time chunking remainder."""
        spec = self.spec
        actions = decode_actions(np.asarray(actions, dtype=np.float64)[..., : spec.action_dims], spec.robot_adapter)
        if any(spec.delta_mask):
            mask = np.zeros(spec.action_dims, dtype=bool)
            mask[: len(spec.delta_mask)] = spec.delta_mask[: spec.action_dims]
            ref = np.zeros(spec.action_dims)
            n = min(spec.action_dims, prepared.reference_state.shape[0])
            ref[:n] = prepared.reference_state[:n]
            actions = actions - np.where(mask, ref, 0.0)
        return np.asarray(normalize(actions, spec.action_norm), dtype=np.float32)

    def rereference(self, actions: np.ndarray, old_reference: np.ndarray, prepared: PreparedObservation) -> np.ndarray:
        """Normalised actions [T, action_dims] whose delta dims were relative to ``old_reference`` -> relative to
        ``prepared``'s state (unchanged without delta dims): how a previous chunk's remainder is expressed for the
        next observation's denoise (real-time chunking)."""
        spec = self.spec
        if not any(spec.delta_mask):
            return actions
        n = actions.shape[-1]
        mask = np.zeros(n, dtype=bool)
        mask[: len(spec.delta_mask)] = spec.delta_mask[:n]
        shift = np.zeros(n)
        m = min(n, old_reference.shape[0], prepared.reference_state.shape[0])
        shift[:m] = old_reference[:m] - prepared.reference_state[:m]
        robot = unnormalize(np.asarray(actions, dtype=np.float64), spec.action_norm)
        moved = normalize(robot + np.where(mask, shift, 0.0), spec.action_norm)
        return np.where(mask, moved, actions).astype(np.float32)

    # ------------------------------------------------------------------------------------------ reference
    def rtc_guide(self, rtc: RTCPrefix | None, rtc_config: RTCConfig | None = None,
                  num_steps: int | None = None) -> RTCGuide | None:
        """The denoise guide for a previous chunk's remainder ``rtc`` under ``rtc_config`` (default: the
        checkpoint's own, else the paper's; a LeRobot checkpoint without ``rtc_config`` ignores the remainder, as
        LeRobot's ``predict_action_chunk`` does); None without a remainder or with RTC disabled."""
        config = rtc_config or self.spec.rtc or (None if self.spec.framework == "lerobot" else PAPER_RTC)
        if rtc is None or config is None or not config.enabled:
            return None
        cfg = self.model.config
        return RTCGuide.build(rtc, config, cfg.action_horizon, cfg.action_dim, num_steps or cfg.num_steps,
                              self.model.device)

    @torch.no_grad()
    def _sample(self, raw: RawObservation, noise, num_steps: int | None, rtc: RTCPrefix | None,
                rtc_config: RTCConfig | None) -> tuple[torch.Tensor, PreparedObservation]:
        prepared = self.prepare(raw)
        obs = prepared.observation.to(self.model.device, self.model.input_dtype)
        if noise is not None:
            noise = torch.as_tensor(np.asarray(noise) if not isinstance(noise, torch.Tensor) else noise)
            noise = noise.reshape(1, self.spec.chunk_size, -1).to(self.model.device, torch.float32)
        guide = self.rtc_guide(rtc, rtc_config, num_steps)
        return self.model.sample_actions(obs, noise, num_steps, guide=guide)[0], prepared

    def infer(self, raw: RawObservation, noise: np.ndarray | torch.Tensor | None = None,
              num_steps: int | None = None, *, rtc: RTCPrefix | None = None,
              rtc_config: RTCConfig | None = None) -> np.ndarray:
        """The robot-unit chunk [H, D] for one observation (prefill + denoise, no language). ``rtc``: the previous
        chunk's remainder to continue (real-time chunking, as LeRobot's ``predict_action_chunk(...,
        inference_delay, prev_chunk_left_over, execution_horizon)``), under ``rtc_config`` (see :meth:`rtc_guide`)."""
        chunk, prepared = self._sample(raw, noise, num_steps, rtc, rtc_config)
        return self.postprocess(chunk, prepared)

    def infer_normalized(self, raw: RawObservation, noise: np.ndarray | torch.Tensor | None = None,
                         num_steps: int | None = None, *, rtc: RTCPrefix | None = None,
                         rtc_config: RTCConfig | None = None) -> np.ndarray:
        """:meth:`infer` before post-processing: the model's normalised chunk [H, action_dims] (float32)."""
        chunk, _ = self._sample(raw, noise, num_steps, rtc, rtc_config)
        return chunk[:, : self.spec.action_dims].float().cpu().numpy()


def _sizes_sidecar(directory: Path) -> dict | None:
    for candidate in (directory / SIZES_SIDECAR, directory.parent / SIZES_SIDECAR):
        if candidate.is_file():
            data = read_json(candidate)
            return data if isinstance(data, dict) else None
    return None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def load_policy(checkpoint: str | Path, options: SpecOptions | None = None, *, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu", generated: bool = False, precision: str | None = None) -> Policy:
    """Read a checkpoint directory of any supported layout into a :class:`Policy`.

    ``precision`` (a key of ``oxygen_ros.engine.backends.precision.PRECISIONS``, e.g. ``bfloat16_islands``, or ``auto``:
    the checkpoint's framework decides, :func:`oxygen_ros.policy.device.choose_precision`) casts the model by that
    policy instead of wholly to ``dtype``; ``Policy.precision`` says which and why.

    Raises:
        PolicyConfigError: an unusable file or option, naming the file and field (weights included).
    """
    options = options or SpecOptions()
    directory = Path(checkpoint).expanduser()
    layout = detect_layout(directory)
    try:
        tensors = read_tensors(directory / "model.safetensors")
        if layout == "oxygen":
            config = read_oxygen_config(directory)
            spec, overrides = read_oxygen(directory, options, config, generated)
        else:
            base = infer_config(tensors, get_config("pi05").replace(name=directory.name or layout),
                                _sizes_sidecar(directory), str(directory / "model.safetensors"))
            reader = read_lerobot if layout == "lerobot" else read_openpi
            spec, overrides = reader(directory, options, base.vision.image_size)
            config = base.replace(**overrides)
        if len(spec.camera_slots) != config.num_cameras:
            raise PolicyConfigError(f"{directory}: {len(spec.camera_slots)} camera slots but the model config has "
                                    f"{config.num_cameras}")
        model = Pi05Model(config)
        load_state_dict_into(model, tensors, source=str(directory / "model.safetensors"))
    except CheckpointError as e:
        raise PolicyConfigError(str(e)) from e
    if spec.action_dims > config.action_dim:
        raise PolicyConfigError(f"{directory}: {spec.action_dims} action dims kept but the model outputs "
                                f"{config.action_dim}")
    try:
        tokenizer = PromptTokenizer(spec.tokenizer, max_token_len=spec.max_token_len)
    except (OSError, ValueError) as e:
        raise PolicyConfigError(f"tokenizer {spec.tokenizer}: {e}") from e
    if tokenizer.vocab_size > config.vocab_size:
        raise PolicyConfigError(f"tokenizer {spec.tokenizer}: {tokenizer.vocab_size} pieces but the model has "
                                f"only {config.vocab_size} embeddings")
    # cast on the host, then move: the float32 model never goes to the device whole (14 GB for pi0.5)
    if precision is None:
        model = model.to(dtype=dtype).to(device)
        choice = PrecisionChoice(_dtype_name(dtype), "dtype argument")
    else:
        try:
            choice = choose_precision(torch.device(device), precision, spec.framework, spec.checkpoint_dtype)
        except ValueError as e:
            raise PolicyConfigError(str(e)) from e
        model = apply_precision(model, choice.precision).to(device)
    return Policy(spec, model.eval(), tokenizer, choice)


def with_action_dims(policy: Policy, dims: int) -> Policy:
    """The same policy publishing ``dims`` action dims (only for checkpoints without action statistics)."""
    policy.spec = dataclasses.replace(policy.spec, action_dims=dims)
    return policy
