"""How an offline evaluation times its frames: on the bag's clock (the default, deterministic) or on the wall clock.

On the robot three things follow the measured time of the computation: the real-time chunking delay with
``rtc.delay: auto`` (a p90 of the measured chunk ages), the actions a chunk starts after (those whose time passed
while it was computed), and ``k_auto`` (the decode steps that fit the rest of the control period); ``kernels: auto``
also picks oneDNN's packed or MKL's plain matrix products by timing both. In a replay that would make a bag's
actions, texts and scores depend on how busy the evaluating host was. With ``clock="bag"`` none of them reads a
clock of the host:

- **RTC delay model**: a frame starts at its tick ``t`` on the bag's clock and its chunk is ready ``latency_s``
  later (default: half the control period). The chunk's age is ``t + latency_s - stamp`` (``stamp``: the newest
  camera image it used); it counts the committed actions and feeds the ``auto`` delay estimator exactly as a
  measured age does on the robot. A fixed ``rtc.delay: N`` keeps its model: ready N actions after the stamp.
- **k_auto** is replaced by the parameter ``k`` (the preset's fixed tokens per request per frame).
- **kernels: auto** is replaced by ``plain`` (the reference kernel; ``packed`` stays when asked for).

The measured latency is still measured and written to the report (per frame ``timings_ms``, ``summary``), but it
never reaches an action, a text or a score. ``clock="wall"`` is the robot's behaviour (for studying it offline):
the measured latency drives all of the above, and results change with the host's load.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oxygen_ros.runtime.params import NodeParams

__all__ = ["CLOCKS", "ReplayTiming"]

CLOCKS = ("bag", "wall")


@dataclass(frozen=True)
class ReplayTiming:
    """The evaluation's clock: ``bag`` (deterministic, default) or ``wall`` (the measured timing feeds back).

    clock: bag | wall.
    latency_s: under ``bag``, seconds from a frame's tick to its chunk being ready, on the bag's clock (None: half
        the control period, ``0.5 / control_rate_hz``). Only ``rtc.delay: auto`` uses it.
    """

    clock: str = "bag"
    latency_s: float | None = None

    def __post_init__(self) -> None:
        if self.clock not in CLOCKS:
            raise ValueError(f"timing clock must be one of {CLOCKS}, got {self.clock!r}")
        if self.latency_s is not None and not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ValueError(f"modeled latency must be a finite number of seconds >= 0, got {self.latency_s!r}")

    @property
    def deterministic(self) -> bool:
        """Whether actions, texts and scores are independent of the host's speed and load."""
        return self.clock == "bag"

    def latency(self, p: NodeParams) -> float:
        """The modeled tick -> chunk-ready latency (s) for the parameters ``p``."""
        return self.latency_s if self.latency_s is not None else 0.5 * p.period_s

    def adopt(self, p: NodeParams) -> tuple[NodeParams, dict[str, list[Any]]]:
        """The parameters the run uses, and what was replaced ``{name: [given, used]}``: under ``bag``, ``k_auto``
        off (the fixed ``k``) and ``kernels: auto`` as ``plain``; under ``wall``, ``p`` unchanged."""
        if not self.deterministic:
            return p, {}
        changes: dict[str, Any] = {}
        if p.k_auto:
            changes["k_auto"] = False
        if p.kernels == "auto":
            changes["kernels"] = "plain"
        replaced = {name: [getattr(p, name), value] for name, value in changes.items()}
        return (dataclasses.replace(p, **changes) if changes else p), replaced

    def chunk_clock(self, p: NodeParams, rtc_delay: int | None, tick_ns: int, stamp_ns: int,
                    dt_s: float) -> Callable[[], int] | None:
        """The clock the frame runner reads when a chunk is ready (``FrameRunner.step(clock_ns=...)``), or None
        for the measured latency. A fixed ``rtc_delay`` N: ready N actions after ``stamp_ns`` (either clock);
        ``auto`` (None): under ``bag`` ready :meth:`latency` after ``tick_ns`` (or after ``stamp_ns`` were that
        later), under ``wall`` measured."""
        if rtc_delay is not None:
            ready = stamp_ns + round(rtc_delay * dt_s * 1e9)
        elif self.deterministic:  # a header stamp ahead of the bag's log time (another clock) must not shorten it
            ready = max(tick_ns, stamp_ns) + round(self.latency(p) * 1e9)
        else:
            return None
        return lambda: ready

    def describe(self, p: NodeParams, replaced: dict[str, list[Any]]) -> dict[str, Any]:
        """The report's ``config.timing``: the clock, the delay model in force and the replaced parameters."""
        if p.rtc_delay != "auto":
            model = f"fixed: ready {p.rtc_delay} actions after the observation stamp"
        elif self.deterministic:
            model = "auto over modeled ages: ready latency_s after the tick, on the bag clock"
        else:
            model = "auto over measured ages (wall clock; depends on the host's load)"
        return {"clock": self.clock, "deterministic": self.deterministic,
                "latency_s": self.latency(p) if self.deterministic else None,
                "rtc_delay_model": model if p.rtc_enabled else "off", "replaced": replaced}
