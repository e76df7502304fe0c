"""Options every shell of the frame runner shares, each defined once: the checkpoint, the engine, the language
streams and the questions. The ROS node declares them as parameters (``oxygen_ros.runtime.params.NodeParams`` takes
its fields from here with :func:`shared`) and ``oxygen-serve`` as command-line flags (``oxygen_ros.serve.options``),
with the same names, defaults, help and checks.

A field's metadata (:func:`oxygen_ros.params.param`, the one schema) carries its help and the checks that apply to
it alone (``choices``, ``minimum``, ``positive``) and, for a group's field, its ROS name (``ask.max_new_tokens``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from oxygen_ros.engine.backends.kernel_choice import KERNEL_CHOICES
from oxygen_ros.engine.modes import GRAPH_BACKENDS, NODE_MODES, OVERFLOW_POLICIES
from oxygen_ros.engine.observation import PREFILL_LAYOUTS
from oxygen_ros.engine.tokenizer import CUSTOM_TASK, LANGUAGE_TEMPLATES
from oxygen_ros.params import param

from .language import TRIGGERS

__all__ = ["DTYPES", "NORMALIZATIONS", "REQUEST_TASKS", "RunnerParams", "StreamParams", "param", "shared"]

NORMALIZATIONS = ("auto", "none", "quantile", "mean_std")
DTYPES = ("auto", "float32", "bfloat16", "bfloat16_islands", "bfloat16_lerobot", "float16")
REQUEST_TASKS = (*LANGUAGE_TEMPLATES, CUSTOM_TASK)


@dataclass(frozen=True)
class StreamParams:
    """One language stream's parameters (``<name>.<field>``); each field is declared per listed stream."""

    name: str = field(default="", metadata={"help": "", "choices": None, "minimum": None, "positive": False})
    task: str = param('',
        "memory | narration | subtask | custom; '' = the stream's name when it names a task, else custom.",
        choices=('', *REQUEST_TASKS))
    prompt: str = param('',
        "Prompt template fed after the shared prefix ({instruction} is replaced); '' = the task's built-in "
        'prompt (required for custom).')
    every_n_frames: int = param(0, 'A request every n-th processed frame (0: not frame-counted).', minimum=0)
    period_s: float = param(0.0,
        "A request when this much observation time passed since the stream's last one (0: not timed).",
        minimum=0.0)
    trigger: str = param('periodic',
        'periodic (every_n_frames and / or period_s) | on_instruction_change (one request per new instruction) | '
        'continuous (the next request on the frame after the last one finished).',
        choices=TRIGGERS)
    max_new_tokens: int = param(0, 'Tokens per request; 0 = max_new_tokens (and at most it).', minimum=0)
    priority: int = param(0,
        'Streams due on the same frame are admitted highest first (a full pool with reject_newest refuses the '
        "lowest); with k_auto the frame's spare decode time goes to higher priorities first (every request "
        'still advances each frame).')
    adapter: str = param('',
        "PEFT LoRA directory (suffix-only, language rows) this stream's requests decode with; '' = none. Rows "
        'of different adapters share one batched forward.')


@dataclass(frozen=True)
class RunnerParams:
    """The shared options (see the module docstring); ``NodeParams`` and ``oxygen-serve`` both take these fields."""

    checkpoint_path: str = param('',
        'Checkpoint directory as LeRobot (config.json + policy_*processor.json) or openpi (model.safetensors '
        "+ assets/<asset_id>/) save it, or this package's layout.")
    tokenizer_path: str = param('',
        "SentencePiece model file or directory; '' = the checkpoint's own (ours), its recorded tokenizer name"
        ' (LeRobot), required for openpi.')
    asset_id: str = param('', "openpi: which assets/<asset_id>/norm_stats.json; '' = the only one present.")
    openpi_config: str = param('',
        'openpi: the train config whose data transforms apply (pi05_libero | pi05_droid | pi05_aloha | '
        "generic); '' = known from the asset id, else generic.")
    norm_stats_path: str = param('',
        "openpi / ours: an openpi-format norm_stats.json to use instead of the checkpoint's (not for LeRobot "
        'checkpoints, whose processor files are read).')
    normalization: str = param('auto',
        "auto (the checkpoint's normalisation) | none (run unnormalised on purpose) | quantile | mean_std "
        '(override, openpi / ours only).', choices=NORMALIZATIONS)
    device: str = param('auto', 'auto (cuda if available) | cpu | cuda | cuda:N | mps.')
    dtype: str = param('auto',
        "auto (the checkpoint's framework decides: openpi -> bfloat16_islands on every device; LeRobot -> its "
        "config.json dtype; ours -> bfloat16_islands on cuda, float32 otherwise) | float32 | bfloat16 | "
        "bfloat16_islands (openpi's mixed precision: bf16 weights and KV, norms / adaRMS dense / SigLIP embeddings / "
        "action and time projections in fp32) | bfloat16_lerobot (LeRobot's: SigLIP, projector, norms, adaRMS "
        "dense, action and time projections in fp32) | float16.", choices=DTYPES)
    torch_threads: int = param(0, "torch CPU threads; 0 keeps torch's default.", minimum=0)
    seed: int = param(0, 'torch seed for the flow-matching noise (reproducible runs).', minimum=0)
    mode: str = param('oxygen',
        'Engine: oxygen (shared prefill + cross-frame batched decoding) | shared_kv (shared prefill, decode '
        'to completion) | isolated (openpi-style second prefill).', choices=NODE_MODES)
    num_steps: int = param(0,
        "S: flow-matching denoise steps per action chunk; 0 = the checkpoint's (LeRobot num_inference_steps, "
        'else 10).', minimum=0)
    actions_per_chunk: int = param(0,
        "Actions of each chunk to publish for execution (LeRobot's n_action_steps); 0 = the checkpoint's "
        'n_action_steps (openpi / ours: the whole chunk). Under rtc.enabled the node publishes the whole chunk '
        '(the next chunk replaces the rest); this then only sets the action period where action_rate_hz is 0.',
        minimum=0)
    max_new_tokens: int = param(30,
        'N: tokens generated per language request (the longest a stream may ask for: the KV pool is sized '
        'for it).', minimum=1)
    k: int = param(5, 'Per-frame decode budget (tokens per request per frame, oxygen mode).', minimum=1)
    language_streams: tuple[str, ...] = param((),
        'Language streams (plugin-list style: each is configured by <name>.task, .prompt, .every_n_frames, '
        ".period_s, .trigger, .max_new_tokens, .priority); [] = one stream from request_task, "
        'request_every_n_frames and request_prompt.')
    request_every_n_frames: int = param(1,
        'Start a language request every n-th processed frame; 0 disables language (the one-stream shorthand, '
        'like request_task and request_prompt: ignored when language_streams is set).',
        minimum=0)
    request_task: str = param('memory', 'Language task: memory | narration | subtask | custom.', choices=REQUEST_TASKS)
    request_prompt: str = param('',
        "Prompt template fed after the shared prefix ({instruction} is replaced); '' uses the task's built-in"
        ' prompt (required for custom).')
    max_prompt_tokens: int = param(16, 'Longest request prompt in tokens (longer prompts are cut).', minimum=1)
    max_inflight: int = param(32, 'Bound on unfinished language requests (KV slots).', minimum=1)
    subtask_conditioning: str = param('',
        "Name of a language stream (normally task subtask) whose latest finished output enters the action "
        "prompt of later frames (pi0.5 two-stage form: '...;\\nSubtask: <text>;\\nAction: '); '' = off.")
    speculate: int = param(0,
        "d: exact speculative decoding, up to d draft tokens per request and decode forward from its stream's "
        'last finished output (outputs identical to plain decoding); 0 = off.', minimum=0)
    overflow: str = param('reject_newest',
        'When max_inflight is reached: reject_newest | drop_oldest.', choices=OVERFLOW_POLICIES)
    graphs: str = param('auto',
        'Static-shape prefill, denoise loop and decode steps: auto (captured CUDA graphs on cuda; on CPU the steps '
        'compiled ahead of time when compile_cache_dir holds them all, else eager) | off (eager, the reference) | '
        'cuda | compile (torch.compile: minutes of warm-up on a CPU) | static | aot (compiled ahead of time, loaded '
        'from compile_cache_dir in seconds; built there once, or by oxygen-compile). On CPU each action stage runs '
        'its graph step only where a measurement at configure says it is not slower than eager. LoRA and '
        'speculative forwards stay eager.', choices=GRAPH_BACKENDS)
    compile_cache_dir: str = param('',
        "Where graphs=aot keeps its compiled steps and kernels=auto its measured choice (keyed by model sizes, "
        "dtype, device, threads and torch version); '' = $XDG_CACHE_HOME/oxygen_ros/compiled "
        "(~/.cache/oxygen_ros/compiled).")
    kernels: str = param('auto',
        "CPU float32 / bfloat16 matrix products per stage (prefill, decode, denoise): auto (oneDNN's packed "
        "weights where a measurement on this host at configure says they are faster and, under "
        "bfloat16_islands / bfloat16_lerobot, give the plain kernel's bits; else ATen's GEMM; stored in "
        "compile_cache_dir) | plain (ATen's GEMM everywhere) | packed (oneDNN everywhere).", choices=KERNEL_CHOICES)
    prefill_layout: str = param('auto',
        "The fused prefill's layout: auto (padded under bfloat16_islands / bfloat16_lerobot, where it gives "
        "openpi's numbers bit for bit; compact otherwise) | padded (every camera slot and the padded prompt, as "
        "openpi) | compact (masked cameras and prompt padding skipped: faster, moves bf16 results by rounding).",
        choices=PREFILL_LAYOUTS)
    ask_max_new_tokens: int = param(0,
        'Tokens of an answer whose goal asks for 0; 0 = max_new_tokens. A goal asking for more than '
        'max_new_tokens is aborted.', minimum=0, ros_name='ask.max_new_tokens')
    ask_max_question_chars: int = param(1000,
        'Goals with a longer question or prompt are rejected. The question template must also fit '
        'ask.max_prompt_tokens, else the goal is aborted (prompt too long).', minimum=1,
        ros_name='ask.max_question_chars')
    ask_max_prompt_tokens: int = param(48,
        'Longest question prompt in tokens ("Question: <question>\\nAnswer: "); with ask.enabled the KV pool is '
        'sized for max(max_prompt_tokens, this). Longer questions are aborted with the reason.', minimum=1,
        ros_name='ask.max_prompt_tokens')
    ask_priority: int = param(10,
        'Admission priority of a question among the stream requests due on the same frame (streams: their '
        '<name>.priority, 0 by default; ties: streams first); with k_auto its rows get spare decode steps first.',
        ros_name='ask.priority')


def shared(name: str) -> Any:
    """A fresh dataclass field with the default and metadata of :class:`RunnerParams`' field ``name`` (how
    ``NodeParams`` declares a shared option: ``seed: int = shared("seed")``)."""
    f = _FIELDS[name]
    return field(default=f.default, metadata=f.metadata)


_FIELDS = {f.name: f for f in dataclasses.fields(RunnerParams)}
