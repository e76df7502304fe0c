"""The engine's modes, overflow policies and scheduling config: one definition of each.

Every mode runs the same frame pipeline (prefill -> denoise -> on_actions -> admit -> decode); a :class:`ModeSpec`
says how its language requests are served:

  mode        language prefix                        decoding per frame
  oxygen      the action prefill's slot (no copy)    every in-flight request, batched, at most k steps each
  shared_kv   the action prefill's slot (no copy)    each new request to completion, alone (ablation)
  isolated    a second prefill of the observation    each new request to completion, alone (openpi style)
  parallel    a second prefill on a 2nd model copy   to completion, concurrently with the action worker
"""

from __future__ import annotations

from dataclasses import dataclass

from .observation import PREFILL_LAYOUTS
from .rtc import RTCConfig


@dataclass(frozen=True)
class ModeSpec:
    """How a mode serves language requests.

    batched:    requests stay in flight across frames, each in a slot of its own, and decode together under the
                per-frame budget ``k``; otherwise each request decodes to completion, alone, on the frame's slot.
    reprefill:  the language prefix is a second prefill of the observation (not the action prefill's slot).
    concurrent: language runs on a second model copy, concurrently with the actions (see ``baselines.py``).
    """

    batched: bool
    reprefill: bool = False
    concurrent: bool = False


MODE_SPECS: dict[str, ModeSpec] = {
    "oxygen": ModeSpec(batched=True),
    "shared_kv": ModeSpec(batched=False),
    "isolated": ModeSpec(batched=False, reprefill=True),
    "parallel": ModeSpec(batched=False, reprefill=True, concurrent=True),
}
ENGINE_MODES: tuple[str, ...] = tuple(MODE_SPECS)
NODE_MODES: tuple[str, ...] = ("oxygen", "isolated", "shared_kv")  # the ROS node runs one model copy
OVERFLOW_POLICIES: tuple[str, ...] = ("reject_newest", "drop_oldest")
GRAPH_BACKENDS = ("off", "static", "cuda", "compile", "aot", "auto")  # EngineConfig.graphs (graphs.py)
KERNEL_SETTINGS = ("auto", "plain", "packed", "keep")  # EngineConfig.kernels (kernel_choice.py)
UNBOUNDED = 1 << 30  # decode budget of the modes that run each request to completion


@dataclass
class EngineConfig:
    """How the engine schedules work. ``k`` is the per-frame decode budget (oxygen only) or ``"auto"``."""

    mode: str = "oxygen"
    num_steps: int = 10  # S: flow-matching denoise steps
    k: int | str = 5
    deadline_s: float | None = None  # frame deadline for k="auto" (e.g. the control period)
    max_inflight: int = 32  # bound on unfinished language requests (KV pool = max_inflight + 1 slots)
    overflow: str = "reject_newest"  # or "drop_oldest"
    max_new_tokens: int = 64  # longest request the pool is sized for
    max_prompt_tokens: int = 16
    eos_id: int = 1
    # d: speculative draft tokens a row may carry per decode forward (exact, greedy verification; 0 = off). The
    # drafts come from the engine's DraftSource (default: each stream's last finished output, speculative.py).
    speculate: int = 0
    # static shapes / captured graphs for the denoise loop and the decode step (graphs.py): off (eager, the
    # reference) | static | cuda | compile | aot (compiled ahead of time, loaded from compile_cache_dir) | auto
    # (cuda on a CUDA device, else off)
    graphs: str = "off"
    # where graphs='aot' keeps its compiled steps (None: $XDG_CACHE_HOME/oxygen_ros/compiled) and the Inductor
    # options it compiles them with (part of each step's cache key)
    compile_cache_dir: str | None = None
    compile_options: dict | None = None
    # CPU float32 matrix products per stage (kernel_choice.py): auto (oneDNN's packed weights where a measurement
    # on this host says they are faster, stored in compile_cache_dir) | plain (MKL's GEMM) | packed (everywhere) |
    # keep (as the model's stacks are set, e.g. by cpu_kernels.use_onednn)
    kernels: str = "auto"
    # with graphs on CPU, which action stages (prefill, denoise) run their graph step: auto (each where a measurement
    # at build says it is not slower than the fused eager path, which skips masked work) | all
    graph_stages: str = "auto"
    # real-time chunking (rtc.py): how a frame that carries the previous chunk's remainder (Frame.rtc) guides its
    # first action head's denoise toward it; None or disabled: every chunk from plain noise
    rtc: RTCConfig | None = None
    # the fused prefill's layout (observation.PREFILL_LAYOUTS): auto (padded in openpi's bf16 roundings, where it is
    # bit-identical to openpi; compact otherwise) | padded | compact (masked cameras and prompt padding skipped)
    prefill_layout: str = "auto"

    def validate(self) -> None:
        """Raise ``ValueError`` on an unknown mode or overflow policy or a non-positive size."""
        if self.mode not in ENGINE_MODES:
            raise ValueError(f"mode must be one of {ENGINE_MODES}, got {self.mode!r}")
        if self.overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {OVERFLOW_POLICIES}, got {self.overflow!r}")
        if self.num_steps < 1 or self.max_inflight < 1 or self.max_new_tokens < 1:
            raise ValueError("num_steps, max_inflight and max_new_tokens must be >= 1")
        if self.speculate < 0:
            raise ValueError(f"speculate must be >= 0, got {self.speculate}")
        if self.graphs not in GRAPH_BACKENDS:
            raise ValueError(f"graphs must be one of {GRAPH_BACKENDS}, got {self.graphs!r}")
        if self.graph_stages not in ("auto", "all"):
            raise ValueError(f"graph_stages must be auto or all, got {self.graph_stages!r}")
        if self.prefill_layout not in PREFILL_LAYOUTS:
            raise ValueError(f"prefill_layout must be one of {PREFILL_LAYOUTS}, got {self.prefill_layout!r}")
        if self.kernels not in KERNEL_SETTINGS:
            raise ValueError(f"kernels must be one of {KERNEL_SETTINGS}, got {self.kernels!r}")

    @property
    def spec(self) -> ModeSpec:
        """The :class:`ModeSpec` of ``mode``."""
        return MODE_SPECS[self.mode]
