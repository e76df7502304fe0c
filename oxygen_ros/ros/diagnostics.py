"""Health bookkeeping for the node and its ``/diagnostics`` message (diagnostic_updater is not used: it is not
installable from PyPI; the DiagnosticArray is built here the same way).

Counters are thread-safe: subscription callbacks count rejected inputs while the control thread counts frames.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

__all__ = ["CameraWatch", "Ema", "NodeStats", "ReasonCounter"]

STAGES = ("prefill", "denoise", "decode", "manager", "frame")


class ReasonCounter:
    """Counts events per reason and logs each reason at most once per ``period_s`` (throttled per reason,
    with the number of occurrences suppressed since the last message)."""

    def __init__(self, log: Callable[[str], None] | None, what: str, period_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log, self._what, self._period, self._clock = log, what, period_s, clock
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._last_log: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._recent: deque[tuple[float, str]] = deque(maxlen=64)

    def add(self, reason: str, detail: str = "") -> None:
        """Count one ``reason`` event; log it unless the same reason was logged within the period."""
        now = self._clock()
        with self._lock:
            self._counts[reason] = self._counts.get(reason, 0) + 1
            self._recent.append((now, reason))
            last = self._last_log.get(reason)
            if last is not None and now - last < self._period:
                self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
                return
            self._last_log[reason] = now
            suppressed = self._suppressed.pop(reason, 0)
        if self._log is not None:
            more = f" (+{suppressed} more in the last {self._period:g} s)" if suppressed else ""
            self._log(f"{self._what} [{reason}]{': ' + detail if detail else ''}{more}")

    def snapshot(self) -> dict[str, int]:
        """Counts per reason so far."""
        with self._lock:
            return dict(self._counts)

    def get(self, reason: str) -> int:
        with self._lock:
            return self._counts.get(reason, 0)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def latest(self, within_s: float) -> str | None:
        """Most frequent reason of the last ``within_s`` seconds."""
        now = self._clock()
        with self._lock:
            recent = [r for t, r in self._recent if now - t <= within_s]
        return max(set(recent), key=recent.count) if recent else None


class Ema:
    """Exponential moving average (the first sample initialises it)."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.value: float | None = None

    def update(self, x: float) -> float:
        self.value = x if self.value is None else (1 - self.alpha) * self.value + self.alpha * x
        return self.value


class NodeStats:
    """Everything ``/diagnostics`` reports, fed by the node (rates on the monotonic clock)."""

    def __init__(self, log: Callable[[str], None] | None = None, log_period_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.skipped = ReasonCounter(log, "skipping frame", log_period_s, clock)
        self.rejected_inputs = ReasonCounter(log, "rejected input", log_period_s, clock)
        self.errors = ReasonCounter(log, "error", log_period_s, clock)
        self.dropped_outputs = ReasonCounter(log, "output not published", log_period_s, clock)
        self.warnings = ReasonCounter(log, "warning", 2 * log_period_s, clock)  # transport and QoS problems
        self.stage_ms = {s: Ema() for s in STAGES}
        self.latency_ms = Ema()
        self.frames = 0
        self.deadline_misses = 0
        self.tokens = 0
        self.language_outputs = 0
        self.requests_rejected = 0
        self.requests_dropped = 0
        self.last_text = ""
        self.stream_outputs: dict[str, int] = {}  # finished outputs per language stream
        self._frame_times: deque[float] = deque(maxlen=512)
        self._token_times: deque[tuple[float, int]] = deque(maxlen=512)
        self._reported = {"errors": 0, "misses": 0}

    def record_frame(self, timings: Mapping[str, float], period_s: float, tokens: int, rejected: int,
                     dropped: int, latency_s: float | None = None, overrun_s: float | None = None) -> None:
        """One processed frame: stage times in seconds; a deadline miss when it ended ``overrun_s`` > 0 after its
        control tick's deadline, or (not given) when it took longer than ``period_s``."""
        now = self._clock()
        with self._lock:
            self.frames += 1
            self._frame_times.append(now)
            for stage, ema in self.stage_ms.items():
                if stage in timings:
                    ema.update(timings[stage] * 1e3)
            if (overrun_s > 0) if overrun_s is not None else timings.get("frame", 0.0) > period_s:
                self.deadline_misses += 1
            if latency_s is not None:
                self.latency_ms.update(latency_s * 1e3)
            self.tokens += tokens
            self._token_times.append((now, tokens))
            self.requests_rejected += rejected
            self.requests_dropped += dropped

    def record_language(self, text: str, stream: str = "") -> None:
        with self._lock:
            self.language_outputs += 1
            self.last_text = text
            if stream:
                self.stream_outputs[stream] = self.stream_outputs.get(stream, 0) + 1

    def frame_rate(self, window_s: float = 2.0) -> float:
        """Processed frames per second over the last ``window_s`` seconds."""
        now = self._clock()
        with self._lock:
            return sum(1 for t in self._frame_times if now - t <= window_s) / window_s

    def token_rate(self, window_s: float = 2.0) -> float:
        now = self._clock()
        with self._lock:
            return sum(n for t, n in self._token_times if now - t <= window_s) / window_s

    def status(self, name: str, hardware_id: str, state: str, backlog: int, horizon: int,
               extra: Mapping[str, object] | None = None, warnings: Sequence[str] = ()) -> DiagnosticStatus:
        """The DiagnosticStatus for this moment. Level: ERROR after new engine errors, WARN while ``warnings``
        (current transport / QoS problems) exist, when active but not producing frames or after new deadline
        misses, OK otherwise."""
        rate, token_rate = self.frame_rate(), self.token_rate()
        with self._lock:
            values: dict[str, object] = {
                "state": state,
                "frames": self.frames,
                "frame_rate_hz": f"{rate:.2f}",
                "action_rate_hz": f"{rate * horizon:.1f}",
                "tokens_per_s": f"{token_rate:.1f}",
                "deadline_misses": self.deadline_misses,
                "language_backlog": backlog,
                "language_outputs": self.language_outputs,
                **{f"stream.{name}.outputs": n for name, n in sorted(self.stream_outputs.items())},
                "tokens_generated": self.tokens,
                "requests_rejected": self.requests_rejected,
                "requests_dropped": self.requests_dropped,
                "errors": self.errors.total,
                "latency_ms": _fmt(self.latency_ms.value),
            }
            for stage, ema in self.stage_ms.items():
                values[f"{stage}_ms"] = _fmt(ema.value)
            new_errors = self.errors.total - self._reported["errors"]
            new_misses = self.deadline_misses - self._reported["misses"]
            self._reported = {"errors": self.errors.total, "misses": self.deadline_misses}
        values["skipped_frames"] = self.skipped.total
        for reason, n in sorted(self.skipped.snapshot().items()):
            values[f"skipped.{reason}"] = n
        for reason, n in sorted(self.errors.snapshot().items()):
            values[f"error.{reason}"] = n
        for reason, n in sorted(self.dropped_outputs.snapshot().items()):
            values[f"dropped.{reason}"] = n
        values["rejected_inputs"] = self.rejected_inputs.total
        for reason, n in sorted(self.rejected_inputs.snapshot().items()):
            values[f"rejected.{reason}"] = n
        for reason, n in sorted(self.warnings.snapshot().items()):
            values[f"warning.{reason}"] = n
        values.update(extra or {})

        level, message = DiagnosticStatus.OK, f"{state}, {rate:.1f} frames/s"
        if new_errors:
            level = DiagnosticStatus.ERROR
            message = f"{new_errors} error(s) since the last report: {self.errors.latest(5.0)}"
        elif warnings:
            more = f" (+{len(warnings) - 1} more)" if len(warnings) > 1 else ""
            level, message = DiagnosticStatus.WARN, warnings[0] + more
        elif state == "active" and rate == 0.0:
            why = self.skipped.latest(2.0) or "waiting for the first frame"
            level, message = DiagnosticStatus.WARN, f"active but no frames: {why}"
        elif new_misses:
            level, message = DiagnosticStatus.WARN, f"{rate:.1f} frames/s, {new_misses} deadline miss(es)"
        return DiagnosticStatus(level=level, name=name, message=message, hardware_id=hardware_id,
                                values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])


class CameraWatch:
    """Transport and QoS health of the camera subscriptions, for ``/diagnostics`` and the log.

    A camera is *silent* when its topic has publishers but no image arrived for ``silent_after_s`` seconds, and
    *lossy* when the middleware reports more than ``max_loss`` of its recent images lost (rclpy's
    ``message_lost`` event): the typical causes are images larger than the DDS transport carries (raw 640x480 and
    up with Fast DDS's default shared-memory segment) and QoS mismatches. Incompatible-QoS events (rclpy's
    ``incompatible_qos`` event) are counted per camera. Pure bookkeeping: the node feeds publisher counts, receive
    statistics and the events.

    Args:
        names, topics: the cameras and their (resolved) topics.
        reliability: the subscriptions' camera_reliability (named in the warnings).
        warnings: counts and logs (throttled) each warning reason: camera_silent, camera_lossy,
            camera_qos_incompatible.
        silent_after_s: how long a camera with publishers may stay without images.
        max_loss: the largest tolerated fraction of lost images over the receive-rate window.
    """

    def __init__(self, names: Sequence[str], topics: Sequence[str], reliability: str, warnings: ReasonCounter,
                 silent_after_s: float = 3.0, max_loss: float = 0.2, window_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.names, self.topics, self.reliability = list(names), list(topics), reliability
        self.warnings, self.silent_after_s, self._clock = warnings, silent_after_s, clock
        self.max_loss, self.window_s = max_loss, window_s
        self._lock = threading.Lock()
        self._publishers_since: list[float | None] = [None] * len(self.names)
        self.qos_incompatible = [0] * len(self.names)
        self.qos_policy = [""] * len(self.names)
        self.lost = [0] * len(self.names)
        self._lost_recent: list[deque[tuple[float, int]]] = [deque(maxlen=1024) for _ in self.names]

    def on_message_lost(self, index: int, count_change: int) -> None:
        """rclpy's message-lost event for camera ``index`` (images the middleware knows it dropped)."""
        with self._lock:
            self.lost[index] += int(count_change)
            self._lost_recent[index].append((self._clock(), int(count_change)))

    def _causes(self, index: int) -> str:
        with self._lock:
            incompatible, policy = self.qos_incompatible[index], self.qos_policy[index]
        qos = f"{incompatible} incompatible-QoS event(s), policy {policy}" if incompatible else \
            "no incompatible-QoS event"
        return ("Likely causes: images larger than the DDS transport carries (raw 640x480 rgb8 is 0.9 MB, over "
                "Fast DDS's default 512 KB shared-memory segment: best-effort images then go as fragmented UDP and "
                "are lost; apply config/fastdds.xml to the node and every camera process, see oxygen_ros.ros.dds), "
                f"or a QoS mismatch (camera_reliability={self.reliability}; {qos})")

    def check_loss(self, index: int, rate_hz: float) -> str | None:
        """The lossy-camera warning for camera ``index`` (counted and logged), or None."""
        now = self._clock()
        with self._lock:
            lost = sum(n for t, n in self._lost_recent[index] if now - t <= self.window_s)
        received = rate_hz * self.window_s
        if lost < 5 or lost <= self.max_loss * (lost + received):
            return None
        text = (f"camera {self.names[index]} ({self.topics[index]}): the middleware lost {lost} of "
                f"{lost + round(received)} images in the last {self.window_s:g} s. {self._causes(index)}")
        self.warnings.add("camera_lossy", text)
        return text

    def on_incompatible_qos(self, index: int, count_change: int, policy: str) -> None:
        """rclpy's incompatible-QoS event for camera ``index`` (``policy``: the last incompatible policy kind)."""
        with self._lock:
            self.qos_incompatible[index] += max(1, int(count_change))
            self.qos_policy[index] = policy
        self.warnings.add("camera_qos_incompatible", f"camera {self.names[index]} ({self.topics[index]}): a "
                          f"publisher's QoS is incompatible with this subscription (policy {policy}, "
                          f"camera_reliability={self.reliability}): its images are never delivered")

    def check(self, index: int, publishers: int, last_arrival: float | None) -> str | None:
        """The silent-camera warning for camera ``index`` (counted and logged), or None when it is fine."""
        now = self._clock()
        with self._lock:
            if publishers <= 0:
                self._publishers_since[index] = None
                return None
            if self._publishers_since[index] is None:
                self._publishers_since[index] = now
            quiet_since = max(self._publishers_since[index], last_arrival if last_arrival is not None else -1e18)
        quiet = now - quiet_since
        if quiet < self.silent_after_s:
            return None
        text = (f"camera {self.names[index]} ({self.topics[index]}): {publishers} publisher(s) but no image for "
                f"{quiet:.0f} s. {self._causes(index)}")
        self.warnings.add("camera_silent", text)
        return text

    def report(self, statuses: Sequence[Any], publishers: Sequence[int], now_ns: int) -> tuple[dict[str, object],
                                                                                              list[str]]:
        """Per camera diagnostics values (receive rate, newest-image age, counts) and the current warnings.

        ``statuses``: the InputStore's camera statuses (name, received, rate_hz, last_arrival, newest_stamp_ns).
        """
        values: dict[str, object] = {}
        warnings = []
        for i, (st, pubs) in enumerate(zip(statuses, publishers, strict=True)):
            key = f"camera.{st.name}"
            values[f"{key}.rate_hz"] = f"{st.rate_hz:.1f}"
            values[f"{key}.age_s"] = "nan" if st.newest_stamp_ns is None else \
                f"{(now_ns - st.newest_stamp_ns) / 1e9:.3f}"
            values[f"{key}.received"] = st.received
            values[f"{key}.publishers"] = pubs
            values[f"{key}.qos_incompatible"] = self.qos_incompatible[i]
            values[f"{key}.lost"] = self.lost[i]
            silent = self.check(i, pubs, st.last_arrival)
            lossy = None if silent else self.check_loss(i, st.rate_hz)
            values[f"{key}.silent"], values[f"{key}.lossy"] = silent is not None, lossy is not None
            warnings += [w for w in (silent, lossy) if w is not None]
        return values, warnings


def _fmt(x: float | None) -> str:
    return "nan" if x is None else f"{x:.2f}"
