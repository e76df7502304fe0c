"""Options to engine: the one place where the shared options (:class:`~oxygen_ros.policy.options.RunnerParams`'s
fields: the node's ``NodeParams`` and ``oxygen-serve``'s parsed flags both carry them) become the engine's
:class:`EngineConfig` and the frame runner's :class:`LanguageSchedule` s. The node (``runtime/model_loader.py``), bag
evaluation (through the node's loader) and ``oxygen-serve`` all call these.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from oxygen_ros.engine.engine import EngineConfig
from oxygen_ros.engine.rtc import RTCConfig

from .language import LanguageSchedule
from .options import StreamParams

__all__ = ["engine_config", "language_schedules"]


def engine_config(p: Any, eos_id: int, *, num_steps: int | None = None, k: int | str | None = None,
                  deadline_s: float | None = None, max_inflight: int | None = None, rtc: RTCConfig | None = None,
                  questions: bool = True) -> EngineConfig:
    """The engine configuration of the shared options ``p`` (any object with RunnerParams' fields).

    ``num_steps``: the denoise steps when ``p.num_steps`` is 0 (the checkpoint's); ``k``: instead of ``p.k``
    (``"auto"``); ``deadline_s``: the frame deadline of ``k="auto"``; ``max_inflight``: instead of
    ``p.max_inflight``; ``questions``: the prompt budget also fits a question (``ask_max_prompt_tokens``).
    """
    prompt_tokens = max(p.max_prompt_tokens, p.ask_max_prompt_tokens if questions else 0)
    return EngineConfig(mode=p.mode, num_steps=p.num_steps or num_steps or 0, k=p.k if k is None else k,
                        deadline_s=deadline_s, max_inflight=max_inflight or p.max_inflight, overflow=p.overflow,
                        max_new_tokens=p.max_new_tokens, max_prompt_tokens=prompt_tokens, eos_id=eos_id,
                        speculate=p.speculate, graphs=p.graphs, rtc=rtc,
                        compile_cache_dir=p.compile_cache_dir or None, kernels=p.kernels,
                        prefill_layout=p.prefill_layout)


def language_schedules(p: Any, streams: Iterable[StreamParams]) -> list[LanguageSchedule]:
    """The frame runner's schedules of the language streams (``p``: the shared options, for the token budgets; a
    stream with an adapter decodes with the engine adapter of its own name)."""
    return [LanguageSchedule(every_n_frames=s.every_n_frames, task=s.task, prompt=s.prompt,
                             max_new_tokens=s.max_new_tokens or p.max_new_tokens,
                             max_prompt_tokens=p.max_prompt_tokens, name=s.name, period_s=s.period_s,
                             trigger=s.trigger, priority=s.priority, adapter=s.name if s.adapter else "")
            for s in streams]
