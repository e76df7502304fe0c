"""Load (or generate) the model, tokenizer and norm stats the node runs with; build its engine."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from oxygen_ros.engine import Pi05Model
from oxygen_ros.engine.checkpoint import load_checkpoint, read_config
from oxygen_ros.engine.config import CAMERA_SLOTS
from oxygen_ros.engine.engine import Engine, EngineConfig, build_engine
from oxygen_ros.engine.observation import Observation
from oxygen_ros.engine.requests import Frame, LanguageRequest
from oxygen_ros.engine.tokenizer import MODEL_FILENAMES, PromptTokenizer
from oxygen_ros.models import TOY_MODEL_DIR, toy_model_available

from .norm_stats import Normalizer, load_norm_stats
from .params import NodeParams

__all__ = ["LoadedModel", "build_node_engine", "engine_config", "load_model", "resolve_device", "warm_up"]

NORM_STATS_NAME = "norm_stats.json"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    """What configure loads; ``temp_dir`` (generated models) is deleted by :meth:`release`."""

    model: Pi05Model
    tokenizer: PromptTokenizer
    normalizer: Normalizer
    source: str
    notes: list[str] = field(default_factory=list)  # warnings for the node's log
    temp_dir: Path | None = None

    def release(self) -> None:
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None


def resolve_device(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """'auto' -> cuda when available; dtype 'auto' -> bfloat16 on cuda, float32 elsewhere.

    Raises:
        ValueError: an unknown dtype, or a CUDA/MPS device that is not available.
    """
    if dtype != "auto" and dtype not in _DTYPES:
        raise ValueError(f"dtype must be auto or one of {sorted(_DTYPES)}, got {dtype!r}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device} requested but CUDA is not available (use device:=cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device: {device} does not exist ({torch.cuda.device_count()} CUDA device(s))")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device: mps requested but not available")
    if dtype == "auto":
        return dev, torch.bfloat16 if dev.type == "cuda" else torch.float32
    return dev, _DTYPES[dtype]


def _generate_random_tiny(p: NodeParams) -> Path:
    """A tiny random pi0.5 (+ matching test tokenizer) in a fresh temporary directory, shaped by the parameters
    (cameras, horizon, enough action dims for the robot). Weights use a wide init (std 0.3) so generated text
    varies instead of repeating one token."""
    from oxygen_ros.tools.make_checkpoint import make_random_checkpoint

    out = Path(tempfile.mkdtemp(prefix="oxygen_random_tiny_"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)  # also when the process ends without a cleanup
    cameras = p.camera_names if p.camera_names and set(p.camera_names) <= set(CAMERA_SLOTS) else CAMERA_SLOTS
    overrides = {"camera_names": tuple(cameras), "max_token_len": 128,
                 "action_dim": max(8, len(p.joint_names), len(p.robot_action_names))}
    if p.action_horizon:
        overrides["action_horizon"] = p.action_horizon
    return make_random_checkpoint(out, "tiny", preset=None, seed=p.seed, tokenizer=True, std=0.3, **overrides)


def load_model(p: NodeParams) -> LoadedModel:
    """Load checkpoint, tokenizer and norm stats as the parameters say.

    Raises:
        ValueError, FileNotFoundError, CheckpointError, NormStatsError: with a message naming the parameter.
    """
    device, dtype = resolve_device(p.device, p.dtype)
    temp_dir = None
    notes: list[str] = []
    if p.model == "random_tiny":
        temp_dir = _generate_random_tiny(p)
        ckpt = temp_dir
        source = f"random_tiny (generated in {temp_dir})"
    elif p.model == "toy":
        if not toy_model_available():
            raise FileNotFoundError(f"model: toy needs the trained files in {TOY_MODEL_DIR} (python -m "
                                    f"oxygen_ros.train.train --out {TOY_MODEL_DIR})")
        ckpt = TOY_MODEL_DIR
        source = f"toy ({TOY_MODEL_DIR})"
    else:
        ckpt = Path(p.checkpoint_path).expanduser()
        if not ckpt.exists():
            raise FileNotFoundError(f"checkpoint_path: {ckpt} does not exist")
        source = str(ckpt)
    try:
        ckpt_dir = ckpt if ckpt.is_dir() else ckpt.parent
        config = read_config(ckpt_dir)
        if p.action_horizon:
            config = config.replace(action_horizon=p.action_horizon)
        model = load_checkpoint(ckpt, config=config, dtype=dtype, device=device)

        tok_path = Path(p.tokenizer_path).expanduser() if p.tokenizer_path else ckpt_dir
        if not p.tokenizer_path and not any((ckpt_dir / n).is_file() for n in MODEL_FILENAMES):
            raise FileNotFoundError(f"tokenizer_path: not set and no {' / '.join(MODEL_FILENAMES)} in {ckpt_dir}")
        tokenizer = PromptTokenizer(tok_path, max_token_len=model.config.max_token_len)
        if tokenizer.vocab_size > model.config.vocab_size:
            raise ValueError(f"tokenizer_path: {tokenizer.vocab_size} pieces but the model has only "
                             f"{model.config.vocab_size} embeddings")

        stats_path = Path(p.norm_stats_path).expanduser() if p.norm_stats_path else ckpt_dir / NORM_STATS_NAME
        if p.normalization == "none":
            stats = None
        elif p.norm_stats_path or stats_path.is_file():
            stats = load_norm_stats(stats_path)
        else:
            stats = None
            notes.append(f"no norm stats ({stats_path} missing, norm_stats_path unset): state and actions are "
                         "used as they are (normalization disabled)")
        normalizer = Normalizer(stats, p.normalization if stats is not None else "none")
    except BaseException:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    return LoadedModel(model, tokenizer, normalizer, source, notes, temp_dir)


def engine_config(p: NodeParams, eos_id: int, max_inflight: int | None = None) -> EngineConfig:
    return EngineConfig(mode=p.mode, num_steps=p.num_steps, k="auto" if p.k_auto else p.k,
                        deadline_s=p.period_s, max_inflight=max_inflight or p.max_inflight, overflow=p.overflow,
                        max_new_tokens=p.max_new_tokens, max_prompt_tokens=p.max_prompt_tokens, eos_id=eos_id)


def build_node_engine(p: NodeParams, loaded: LoadedModel) -> Engine:
    """The engine for the node's parameters."""
    return build_engine(loaded.model, engine_config(p, loaded.tokenizer.eos_id), detokenize=loaded.tokenizer.decode)


def warm_up(p: NodeParams, loaded: LoadedModel, frames: int = 2) -> float:
    """Run a few throw-away frames (prefill, denoise, one short language request) on a small separate engine,
    so the first real frame does not pay one-off costs. Returns the last frame's time in seconds."""
    cfg = loaded.model.config
    engine = build_engine(loaded.model, engine_config(p, loaded.tokenizer.eos_id, max_inflight=1),
                          detokenize=loaded.tokenizer.decode)
    s = cfg.vision.image_size
    ids = [loaded.tokenizer.bos_id] + loaded.tokenizer.encode("Task: warm up, State: ;\nAction: ")
    obs = Observation(torch.zeros(1, cfg.num_cameras, 3, s, s), torch.ones(1, cfg.num_cameras, dtype=torch.bool),
                      torch.tensor([ids[: cfg.max_token_len]]), torch.ones(1, min(len(ids), cfg.max_token_len),
                                                                           dtype=torch.bool))
    request = LanguageRequest(task="memory", max_new_tokens=min(2, p.max_new_tokens))
    last = 0.0
    for _ in range(frames):
        result = engine.step(Frame(obs, [request]))
        last = result.timings.get("frame", 0.0)
    return last


class RequestPrompt:
    """The prompt tokens of a language request for an instruction: ``request_prompt`` formatted with the
    instruction when set, else the task's built-in prompt; cut to ``max_prompt_tokens``, cached per instruction."""

    def __init__(self, params: NodeParams, tokenizer: PromptTokenizer) -> None:
        self._params, self._tok = params, tokenizer
        self._cache: tuple[str, list[int]] | None = None

    def tokens(self, instruction: str) -> list[int]:
        if self._cache is not None and self._cache[0] == instruction:
            return self._cache[1]
        p = self._params
        if p.request_prompt:
            tokens = self._tok.encode(p.request_prompt.format(instruction=instruction))[: p.max_prompt_tokens]
        else:
            tokens = self._tok.tokenize_request(p.request_task, None, max_len=p.max_prompt_tokens)
        self._cache = (instruction, tokens)
        return tokens
