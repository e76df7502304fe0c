"""What configure loads: the policy (checkpoint, its I/O contract, tokenizer) checked against the parameters, and
the frame runner around its engine. Every conflict is a ValueError naming the parameter, never a silent override.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from oxygen_ros.engine.config import CAMERA_SLOTS
from oxygen_ros.engine.engine import Engine, EngineConfig, build_engine
from oxygen_ros.engine.lora import LoraAdapter
from oxygen_ros.engine.observation import Observation
from oxygen_ros.engine.requests import Frame, LanguageRequest
from oxygen_ros.engine.rtc import RTCConfig
from oxygen_ros.policy import Policy, SpecOptions, load_policy
from oxygen_ros.policy.configure import engine_config as shared_engine_config
from oxygen_ros.policy.configure import language_schedules
from oxygen_ros.policy.device import resolve_device, resolve_precision
from oxygen_ros.policy.policy import with_action_dims
from oxygen_ros.policy.rtc import PAPER_RTC, RTCSchedule
from oxygen_ros.policy.runner import FrameRunner, seeded_noise
from oxygen_ros.policy.shipped_model import TOY_MODEL_DIR, toy_model_available

from .params import NodeParams

PRECISION_DETAILS = {
    "bfloat16_islands": ": bf16 weights and KV cache; norms, adaRMS dense, SigLIP embeddings, action and time "
                        "projections in float32 (openpi's)",
    "bfloat16_lerobot": ": bf16 Gemma weights and KV cache; SigLIP, projector, norms, adaRMS dense, action and time "
                        "projections in float32 (LeRobot's)"}

__all__ = ["PRECISION_DETAILS", "LoadedPolicy", "action_period_s", "build_runner", "engine_config",
           "instruction_char_cap", "load_node_policy", "resolve_device", "resolve_precision", "rtc_config", "warm_up"]



@dataclass
class LoadedPolicy:
    """The loaded policy and the parameters completed from it; ``temp_dir`` (generated models) is deleted by
    :meth:`release`."""

    policy: Policy
    params: NodeParams  # camera_names, num_steps filled in
    action_names: tuple[str, ...]
    source: str
    notes: list[str] = field(default_factory=list)
    temp_dir: Path | None = None

    def release(self) -> None:
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None


def _generate_random_tiny(p: NodeParams) -> Path:
    """A tiny random pi0.5 (+ matching test tokenizer) in a fresh temporary directory, shaped by the parameters
    (cameras, horizon, enough action dims for the robot). Weights use a wide init (std 0.3) so generated text
    varies instead of repeating one token."""
    from oxygen_ros.policy.synthetic import make_random_checkpoint

    out = Path(tempfile.mkdtemp(prefix="oxygen_random_tiny_"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)  # also when the process ends without a cleanup
    cameras = p.camera_names if p.camera_names and set(p.camera_names) <= set(CAMERA_SLOTS) else CAMERA_SLOTS
    overrides = {"camera_names": tuple(cameras), "max_token_len": 128,
                 "action_dim": max(8, len(p.joint_names), len(p.action_names))}
    if p.action_horizon:
        overrides["action_horizon"] = p.action_horizon
    return make_random_checkpoint(out, "tiny", preset=None, seed=p.seed, tokenizer=True, std=0.3, **overrides)


def _checkpoint_dir(p: NodeParams) -> tuple[Path, str, Path | None]:
    if p.model == "random_tiny":
        out = _generate_random_tiny(p)
        return out, f"random_tiny (generated in {out})", out
    if p.model == "toy":
        if p.checkpoint_path:
            raise ValueError(f"checkpoint_path: {p.checkpoint_path!r} is set but model is 'toy' (which would be "
                             "loaded instead); set model:='' to load checkpoint_path")
        if not toy_model_available():
            raise FileNotFoundError(f"model: toy needs the trained files in {TOY_MODEL_DIR} (python -m "
                                    f"oxygen_ros.toy.train.train --out {TOY_MODEL_DIR})")
        return TOY_MODEL_DIR, f"toy ({TOY_MODEL_DIR})", None
    ckpt = Path(p.checkpoint_path).expanduser()
    if not ckpt.exists():
        raise FileNotFoundError(f"checkpoint_path: {ckpt} does not exist")
    return ckpt, str(ckpt), None


def load_node_policy(p: NodeParams) -> LoadedPolicy:
    """Load the checkpoint the parameters name and check every parameter against its contract.

    Raises:
        ValueError, FileNotFoundError, PolicyConfigError: with a message naming the parameter or file.
    """
    device, dtype = resolve_device(p.device, p.dtype)
    ckpt, source, temp_dir = _checkpoint_dir(p)
    try:
        options = SpecOptions(p.tokenizer_path, p.asset_id, p.openpi_config, p.normalization, p.norm_stats_path)
        policy = load_policy(ckpt, options, dtype=dtype, device=device, generated=temp_dir is not None,
                             precision=p.dtype)
        spec = policy.spec
        if spec.action_norm is None and spec.framework == "oxygen" and p.action_names:
            policy = with_action_dims(policy, len(p.action_names))  # unnormalised: the robot says its dims
            spec = policy.spec
        p, names, notes = _reconcile(p, policy)
    except BaseException:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    math = policy.model.__dict__.get("cuda_math")  # the TF32 flags the precision policy set (precision.py)
    tf32 = "" if math is None or policy.model.device.type != "cuda" else \
        f"; CUDA TF32 matmul {'on' if math['matmul_tf32'] else 'off'}, conv {'on' if math['cudnn_tf32'] else 'off'}"
    notes.append(f"precision {policy.precision.describe()}{PRECISION_DETAILS.get(policy.precision.precision, '')}"
                 f"{tf32}")
    return LoadedPolicy(policy, p, names, source, [spec.summary(), *spec.notes, *notes], temp_dir)


def _reconcile(p: NodeParams, policy: Policy) -> tuple[NodeParams, tuple[str, ...], list[str]]:
    """Parameters completed from the checkpoint's contract; every contradiction raises ValueError."""
    spec, cfg = policy.spec, policy.model.config
    notes: list[str] = []
    if p.action_horizon and p.action_horizon != spec.chunk_size:
        raise ValueError(f"action_horizon: {p.action_horizon} but the checkpoint denoises chunks of "
                         f"{spec.chunk_size} (it decides; use actions_per_chunk to execute fewer)")
    if p.actions_per_chunk > spec.chunk_size:
        raise ValueError(f"actions_per_chunk: {p.actions_per_chunk} > the checkpoint's chunk of {spec.chunk_size}")
    cameras = p.camera_names or spec.default_cameras or spec.camera_slots
    unknown = [c for c in cameras if c not in spec.camera_slots]
    if unknown:
        raise ValueError(f"camera_names: {unknown} are not camera slots of the checkpoint "
                         f"{list(spec.camera_slots)}")
    if len(cameras) > len(spec.camera_slots):
        raise ValueError(f"camera_names: {len(cameras)} cameras but the model has {len(spec.camera_slots)} slots")
    for name in ("camera_topics", "camera_compressed"):
        if getattr(p, name) and len(getattr(p, name)) != len(cameras):
            raise ValueError(f"{name}: {len(getattr(p, name))} entries for the {len(cameras)} cameras "
                             f"{list(cameras)} (camera_names {'as set' if p.camera_names else 'from the checkpoint'})")
    if spec.state_dim is not None and len(p.joint_names) != spec.state_dim:
        raise ValueError(f"joint_names: {len(p.joint_names)} joints but the checkpoint's state has "
                         f"{spec.state_dim} dims")
    if p.action_names and len(p.action_names) != spec.action_dims:
        raise ValueError(f"action_names: {len(p.action_names)} names but the checkpoint outputs "
                         f"{spec.action_dims} action dims")
    if p.delta_action_mask:
        if any(spec.delta_mask):
            raise ValueError("delta_action_mask: the checkpoint defines its own delta dims "
                             f"({list(spec.delta_mask)}); leave the parameter empty")
        if len(p.delta_action_mask) > spec.action_dims:
            raise ValueError(f"delta_action_mask: {len(p.delta_action_mask)} flags for {spec.action_dims} action dims")
        policy.spec = dataclasses.replace(spec, delta_mask=tuple(p.delta_action_mask))
    deltas = [i for i, d in enumerate(policy.spec.delta_mask) if d]
    if deltas and max(deltas) >= len(p.joint_names):
        raise ValueError(f"joint_names: {len(p.joint_names)} joints, but action dim {max(deltas)} is a delta "
                         "relative to the state")
    num_steps = p.num_steps or cfg.num_steps
    names = p.robot_action_names(spec.action_dims)
    if not p.action_names and names != p.joint_names:
        notes.append(f"action_names not set: publishing {spec.action_dims} dims as {names[0]}..")
    return dataclasses.replace(p, camera_names=tuple(cameras), num_steps=num_steps), names, notes


def instruction_char_cap(p: NodeParams, policy: Policy) -> int:
    """Characters an instruction keeps on arrival: ``max_instruction_chars``, or 8 per prompt token (no text that
    long fits the prompt; the exact cut happens when a frame's prompt would overflow, keeping the state)."""
    return p.max_instruction_chars or 8 * policy.spec.max_token_len


def engine_config(p: NodeParams, eos_id: int, max_inflight: int | None = None,
                  rtc: RTCConfig | None = None) -> EngineConfig:
    """The engine configuration the parameters describe (``rtc``: :func:`rtc_config`): the shared
    :func:`oxygen_ros.policy.configure.engine_config`, with k_auto's deadline and the questions' prompt budget."""
    return shared_engine_config(p, eos_id, k="auto" if p.k_auto else p.k, deadline_s=p.period_s,
                                max_inflight=max_inflight, rtc=rtc, questions=p.ask_enabled)


def rtc_config(p: NodeParams, policy: Policy) -> RTCConfig | None:
    """The real-time chunking the ``rtc.*`` parameters describe (None: off); unset values come from the
    checkpoint's own settings (LeRobot's ``rtc_config``), else the paper's."""
    if not p.rtc_enabled:
        return None
    base = policy.spec.rtc or PAPER_RTC
    return RTCConfig(True, p.rtc_guidance, p.rtc_schedule or base.schedule,
                     p.rtc_max_guidance_weight or base.max_guidance_weight,
                     p.rtc_execution_horizon or base.execution_horizon)


def action_period_s(p: NodeParams, n_execute: int) -> float:
    """Seconds between consecutive actions of a chunk (ActionChunk.dt)."""
    return 1.0 / (p.action_rate_hz or n_execute * p.control_rate_hz)


def build_runner(loaded: LoadedPolicy) -> FrameRunner:
    """The frame runner for the loaded policy and its parameters (noise seeded per frame by ``seed``)."""
    p, policy = loaded.params, loaded.policy
    tok = policy.tokenizer

    model = policy.model
    adapters = {s.name: load_adapter(s.adapter, f"{s.name}.adapter", model) for s in p.streams if s.adapter}
    rtc = rtc_config(p, policy)

    def factory() -> Engine:
        return build_engine(model, engine_config(p, tok.eos_id, rtc=rtc), detokenize=tok.decode, adapters=adapters)

    language = language_schedules(p, p.streams)
    n_execute = p.actions_per_chunk or policy.spec.n_action_steps
    schedule = None if rtc is None else RTCSchedule(rtc, action_period_s(p, n_execute),
                                                    None if p.rtc_delay == "auto" else int(p.rtc_delay))
    return FrameRunner(policy, factory, language, seeded_noise(p.seed), n_execute,
                       condition_on=p.subtask_conditioning, rtc=schedule)


def load_adapter(path: str, param_name: str, model) -> LoraAdapter:
    """A stream's PEFT adapter on the model's device and dtype, checked against the backbone's shapes.

    Raises:
        ValueError: a missing or malformed adapter directory, or one that does not fit the model.
    """
    directory = Path(path).expanduser()
    if not (directory / "adapter_config.json").is_file() or not (directory / "adapter_model.safetensors").is_file():
        raise ValueError(f"{param_name}: {path!r} is not a PEFT adapter directory (adapter_config.json + "
                         "adapter_model.safetensors)")
    try:
        adapter = LoraAdapter.load(directory, dtype=model.dtype, device=model.device)
    except (KeyError, ValueError, OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{param_name}: cannot read the adapter in {path!r}: {e}") from e
    layers = model.backbone.layers
    for (i, module), (a, b) in adapter.weights.items():
        if i >= len(layers):
            raise ValueError(f"{param_name}: adapter layer {i} but the backbone has {len(layers)} layers")
        lin = getattr(layers[i].self_attn if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj"))
                      else layers[i].mlp, module)
        if a.shape[1] != lin.in_features or b.shape[0] != lin.out_features or a.shape[0] != b.shape[1]:
            raise ValueError(f"{param_name}: adapter {module} of layer {i} has A {tuple(a.shape)}, B "
                             f"{tuple(b.shape)}; the model's projection is {lin.in_features} -> {lin.out_features}")
    return adapter


def warm_up(loaded: LoadedPolicy, frames: int = 2) -> float:
    """Run a few throw-away frames (prefill, denoise, one short language request) on a small separate engine,
    so the first real frame does not pay one-off costs. Returns the last frame's time in seconds."""
    p, policy = loaded.params, loaded.policy
    cfg, tok = policy.model.config, policy.tokenizer
    engine = build_engine(policy.model, engine_config(p, tok.eos_id, max_inflight=1), detokenize=tok.decode)
    s = cfg.vision.image_size
    ids = [tok.bos_id] + tok.encode("Task: warm up, State: ;\nAction: ")
    n = min(len(ids), cfg.max_token_len)
    obs = Observation(torch.zeros(1, cfg.num_cameras, 3, s, s), torch.ones(1, cfg.num_cameras, dtype=torch.bool),
                      torch.tensor([ids[:n]]), torch.ones(1, n, dtype=torch.bool))
    request = LanguageRequest(task="memory", max_new_tokens=min(2, p.max_new_tokens))
    last = 0.0
    for _ in range(frames):
        result = engine.step(Frame(obs, [request]))
        last = result.timings.get("frame", 0.0)
    return last

