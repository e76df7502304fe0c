"""Real-time chunking at run time: which part of the published chunk the next one must continue, and how many of
its actions execute while the next one is computed.

Action timing, everywhere: action i of a chunk computed from the observation stamped t0 is the target for
``t0 + (i + 1) * dt``. When a frame starts from an observation stamped t1, the robot is executing the last
published chunk; its actions from ``t1`` on are ``prev[s:]`` with ``s = round((t1 - t0) / dt)``. That remainder
(the model's normalised space, delta dims re-referenced to the new state) is what the new chunk's denoise is
guided toward (:mod:`oxygen_ros.engine.rtc`). The delay d, the new chunk's actions that execute before it is ready,
is estimated online: a high percentile (default p90, the ``higher`` sample) of the recent chunk ages at ready
(observation stamp -> chunk ready) over a window, in action steps, rounded up. A window, not the maximum ever seen:
one slow call (the first, a GC pause) ages out. A fixed delay replaces the estimate when configured.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from oxygen_ros.engine.rtc import RTCConfig, RTCPrefix

__all__ = ["PAPER_RTC", "ChunkMemory", "DelayEstimator", "RTCSchedule"]

# The paper's and PI's reference defaults (Kinetix: exp schedule, beta 5), guided over the whole remainder; for
# checkpoints whose framework has no RTC settings of its own (openpi, ours).
PAPER_RTC = RTCConfig(enabled=True, guidance="identity", schedule="exp", max_guidance_weight=5.0,
                      execution_horizon=1 << 16)


@dataclass(frozen=True)
class RTCSchedule:
    """Real-time chunking in a :class:`~oxygen_ros.policy.runner.FrameRunner`.

    config: the guidance (the engine must be built with the same ``EngineConfig.rtc``).
    dt_s: seconds between consecutive actions of a chunk.
    delay: fixed delay d in actions (None: estimated online by :class:`DelayEstimator`).
    window, quantile: the estimator's window of chunk ages and the percentile it takes.
    """

    config: RTCConfig
    dt_s: float
    delay: int | None = None
    window: int = 30
    quantile: float = 0.9

    def __post_init__(self) -> None:
        if not self.dt_s > 0:
            raise ValueError(f"rtc needs the action period dt_s > 0, got {self.dt_s}")
        if self.delay is not None and self.delay < 0:
            raise ValueError(f"rtc delay must be >= 0 or None (auto), got {self.delay}")
        if self.window < 1 or not 0 < self.quantile <= 1:
            raise ValueError("rtc window must be >= 1 and quantile in (0, 1]")


class DelayEstimator:
    """The inference delay in action steps from measured chunk ages (seconds from the observation stamp to the
    chunk being ready): ``ceil(percentile / dt)`` over the last ``window`` measurements; 0 before the first."""

    def __init__(self, dt_s: float, window: int = 30, quantile: float = 0.9) -> None:
        self.dt_s, self.quantile = dt_s, quantile
        self.ages: deque[float] = deque(maxlen=window)

    def observe(self, age_s: float) -> None:
        """Record one chunk's age at ready (non-finite or negative values are ignored)."""
        if math.isfinite(age_s) and age_s >= 0:
            self.ages.append(age_s)

    @property
    def age_s(self) -> float | None:
        """The percentile age (None before the first measurement)."""
        if not self.ages:
            return None
        return float(np.quantile(np.fromiter(self.ages, float), self.quantile, method="higher"))

    @property
    def delay(self) -> int:
        """The delay in actions (rounded up; a hair over a whole step is not a step more)."""
        age = self.age_s
        return 0 if age is None else max(0, math.ceil(age / self.dt_s - 1e-6))


@dataclass
class _Published:
    stamp_ns: int
    chunk: np.ndarray  # [H, action_dims] the model's normalised output
    reference: np.ndarray  # the checkpoint-space state the delta dims were relative to


class ChunkMemory:
    """The last published chunk, and the remainder of it that a new observation's chunk continues."""

    def __init__(self, dt_s: float) -> None:
        self.dt_ns = round(dt_s * 1e9)
        self.last: _Published | None = None

    def clear(self) -> None:
        """Forget the chunk (a new instruction, an engine reset, a disabled robot): the next chunk starts free."""
        self.last = None

    def record(self, stamp_ns: int, chunk: np.ndarray, reference: np.ndarray) -> None:
        """The chunk now driving the robot: its observation stamp, normalised actions and delta reference."""
        self.last = _Published(int(stamp_ns), np.array(chunk, dtype=np.float32), np.array(reference))

    def offset(self, stamp_ns: int) -> int | None:
        """Index of the last chunk's action for the step after ``stamp_ns`` (None: no chunk, or it is not before
        ``stamp_ns`` on the time line, or it ended already)."""
        last = self.last
        if last is None or not stamp_ns or stamp_ns <= last.stamp_ns:
            return None
        s = round((stamp_ns - last.stamp_ns) / self.dt_ns)
        return s if s < last.chunk.shape[0] else None

    def remainder(self, stamp_ns: int, delay: int,
                  rereference: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None) -> RTCPrefix | None:
        """The previous chunk's actions from ``stamp_ns`` on, as the guidance target with ``delay``;
        ``rereference(actions, old_reference)`` re-expresses delta dims relative to the new state."""
        s = self.offset(stamp_ns)
        if s is None:
            return None
        rest = self.last.chunk[s:]
        if rereference is not None:
            rest = rereference(rest, self.last.reference)
        return RTCPrefix(np.asarray(rest, dtype=np.float32), delay)
