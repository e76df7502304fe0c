"""``report.json`` of a bag evaluation: what was run, per-frame stage timings, skipped ticks, request latencies,
summary rates and the digest of every output."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from oxygen_ros.engine.requests import FinishedRequest
from oxygen_ros.util.stats import summary

from .outputs import ACTION_TOPIC, LANGUAGE_TOPIC
from .scoring import ChunkRecord

__all__ = ["REPORT_KEYS", "STAGES", "RunLog", "build_report", "exact_match"]

STAGES = ("prefill", "language_prefill", "denoise", "decode", "manager")
REPORT_KEYS = ("version", "inputs", "config", "model", "ticks", "frames", "skipped", "skip_reasons",
               "skipped_frames", "rejected_inputs", "per_frame", "summary", "requests", "scores", "digest",
               "outputs", "wall_s")


@dataclass
class RunLog:
    """What one evaluation recorded: a record per processed frame, per skipped tick and per finished request, and
    every whole chunk (for the scores; not in the report)."""

    ticks: int = 0
    per_frame: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    issued: int = 0
    chunks: list[ChunkRecord] = field(default_factory=list)

    def skip(self, tick: int, tick_ns: int, reason: str, detail: str) -> None:
        """A tick without an observation."""
        self.skipped.append({"tick": tick, "tick_ns": tick_ns, "reason": reason, "detail": detail})

    def request(self, f: FinishedRequest, finished_frame: int) -> None:
        """A request that finished (or was dropped) in frame ``finished_frame``."""
        self.requests.append({"request_id": f.request_id, "task": f.task, "stream": f.stream or f.task,
                              "frame_index": f.frame_index,
                              "stamp_ns": int(f.stamp), "finished_frame": finished_frame,
                              "latency_s": f.latency_s, "latency_frames": f.frames, "num_tokens": len(f.tokens),
                              "eos": f.eos, "dropped": f.dropped, "text": f.text or ""})


def _summary(per_frame: list[dict], horizon: int, period: float) -> dict[str, Any]:
    """Action frequency, frame time percentiles, mean stage times, deadline misses, language throughput."""
    frame_s = [f["timings_ms"]["frame"] / 1e3 for f in per_frame]
    total_s = sum(frame_s)
    tokens = sum(f["tokens"] for f in per_frame)
    return {
        "action_hz": horizon * len(per_frame) / total_s if total_s > 0 else None,
        "action_hz_end_to_end": (horizon * len(per_frame) / sum(f["timings_ms"]["tick"] / 1e3 for f in per_frame)
                                 if per_frame else None),
        "control_rate_hz": 1.0 / period,
        "frame_ms": summary([1e3 * s for s in frame_s]),
        # measured newest input -> chunk ready; reported only: the bag clock's delay model does not read it
        "latency_ms": summary([f["timings_ms"]["latency"] for f in per_frame if "latency" in f["timings_ms"]]),
        "stage_ms_mean": {s: statistics.fmean(f["timings_ms"][s] for f in per_frame) if per_frame else None
                          for s in (*STAGES, "preprocess", "frame", "tick")},
        "deadline_misses": sum(s > period for s in frame_s),
        "tokens_total": tokens,
        "tokens_per_s": tokens / total_s if total_s > 0 else None,
        "decode_steps_per_frame": statistics.fmean(f["decode_steps"] for f in per_frame) if per_frame else None,
    }


def _requests(log: RunLog, totals: Mapping[str, int], backlog: int) -> dict[str, Any]:
    """Issued / finished / rejected / dropped counts, latency percentiles and every request."""
    done = [r for r in log.requests if not r["dropped"]]
    return {"issued": log.issued, "finished": len(done), "eos": sum(bool(r["eos"]) for r in done),
            "rejected": totals["rejected"], "dropped": totals["dropped"], "unfinished": backlog,
            "latency_s": summary([r["latency_s"] for r in done]),
            "latency_frames": summary([r["latency_frames"] for r in done]),
            "per_stream": {stream: {"finished": len(rs), "latency_s": summary([r["latency_s"] for r in rs]),
                                    "latency_frames": summary([r["latency_frames"] for r in rs])}
                           for stream in sorted({r["stream"] for r in done})
                           for rs in [[r for r in done if r["stream"] == stream]]},
            "items": log.requests}


def exact_match(items: Sequence[Mapping[str, Any]], reference: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per stream: how many of this run's finished requests a reference run (another engine mode, or a labelled
    run) also finished from the same observation (``stream`` + ``stamp_ns``), and how many texts equal it
    (stripped). ``items`` / ``reference``: ``report["requests"]["items"]`` of each."""
    ref = {(r["stream"], r["stamp_ns"]): r["text"].strip() for r in reference if not r["dropped"]}
    out: dict[str, Any] = {}
    for stream in sorted({r["stream"] for r in items}):
        mine = [r for r in items if r["stream"] == stream and not r["dropped"]]
        pairs = [(r["text"].strip(), ref[(stream, r["stamp_ns"])]) for r in mine if (stream, r["stamp_ns"]) in ref]
        same = sum(a == b for a, b in pairs)
        out[stream] = {"finished": len(mine), "matched": len(pairs), "exact": same,
                       "exact_match": same / len(pairs) if pairs else None}
    return out


def build_report(*, log: RunLog, inputs: dict[str, Any], config: dict[str, Any], model: dict[str, Any],
                 rejected: Mapping[str, int], engine_totals: Mapping[str, int], backlog: int, period: float,
                 digest: dict[str, Any], out: str) -> dict[str, Any]:
    """The JSON report (keys :data:`REPORT_KEYS`; ``scores``, ``wall_s`` and ``outputs.plots`` are filled in by the
    caller).

    Args:
        log: the run's records. inputs, config, model: the report's sections of the same names.
        rejected: rejected input messages per reason. engine_totals: the engine's ``rejected`` / ``dropped``
            request counts; backlog: requests unfinished at the end. period: the control period (s).
        digest: :meth:`~oxygen_ros.evaluation.outputs.OutputBag.digest`. out: the output directory.
    """
    reasons = Counter(s["reason"] for s in log.skipped)
    return {
        "version": 1,
        "inputs": inputs,
        "config": config,
        "model": model,
        "ticks": log.ticks,
        "frames": len(log.per_frame),
        "skipped": len(log.skipped),
        "skip_reasons": dict(sorted(reasons.items())),
        "skipped_frames": log.skipped,
        "rejected_inputs": dict(sorted(rejected.items())),
        "per_frame": log.per_frame,
        "summary": _summary(log.per_frame, model["action_horizon"], period),
        "requests": _requests(log, engine_totals, backlog),
        "scores": None,
        "digest": digest,
        "outputs": {"dir": out, "report": "report.json", "bag": "out_bag", "action_topic": ACTION_TOPIC,
                    "language_topic": LANGUAGE_TOPIC, "plots": []},
        "wall_s": None,
    }
