"""Multi-stream language workload, engines side by side (``oxygen-bench streams``; docs/benchmarks.md).

    oxygen-bench streams --config small --threads 1 --frames 30 --warmup 8 --max-minutes 10.5 --out runs/streams_small

Writes ``results.json``, ``summary.md``, ``frame_times.png`` and ``stream_latency.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from oxygen_ros.bench.models import add_model_args, dtype_name, model_from_args
from oxygen_ros.bench.observation import benchmark_prompt_len, dummy_observation
from oxygen_ros.bench.progress import progress_bar
from oxygen_ros.bench.runner import STALL_FACTOR, machine_info
from oxygen_ros.bench.streams_report import DEADLINE_MODES, write_results
from oxygen_ros.engine import Observation, Pi05Model
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.engine.modes import NODE_MODES
from oxygen_ros.engine.requests import FinishedRequest, Frame, FrameResult, LanguageRequest
from oxygen_ros.util.stats import nearest_rank

ENGINES = ("oxygen", "isolated", "shared_kv")
TARGET_SPEEDUP = 1.5  # oxygen action frequency >= 1.5x isolated's
TARGET_P99_OVER_MEDIAN = 1.3  # oxygen p99 frame time <= 1.3x its median
DEFAULT_DEADLINE_FACTOR = 1.5


@dataclass(frozen=True)
class StreamSpec:
    """One language stream: a request every ``every_n_frames`` frames (from frame ``offset``), or Poisson(``rate``)
    requests per frame; ``prompt_len`` prompt token ids (fixed per stream, or fresh per request: ``fresh_prompt``)."""

    name: str
    max_new_tokens: int
    every_n_frames: int = 0
    rate: float = 0.0
    offset: int = 0
    prompt_len: int = 3
    fresh_prompt: bool = False
    priority: int = 0

    def __post_init__(self) -> None:
        if (self.every_n_frames > 0) == (self.rate > 0):
            raise ValueError(f"stream {self.name!r}: give exactly one of every_n_frames and rate")
        if self.max_new_tokens < 1 or self.prompt_len < 0:
            raise ValueError(f"stream {self.name!r}: max_new_tokens must be >= 1 and prompt_len >= 0")


REFERENCE_STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec("question", 24, rate=0.4, prompt_len=8, fresh_prompt=True, priority=2),
    StreamSpec("memory", 30, every_n_frames=5, prompt_len=3, priority=1),
    StreamSpec("narration", 16, every_n_frames=2, prompt_len=3, priority=0),
)


def stream_schedule(streams: Sequence[StreamSpec], frames: int, vocab_size: int,
                    seed: int = 0) -> list[list[LanguageRequest]]:
    """The requests of frames 0..frames-1, highest priority first within a frame (a fresh, reproducible list:
    call once per engine). Prompt ids are drawn from [3, vocab_size) (no PAD/EOS/BOS)."""
    rng = np.random.default_rng(seed)
    high = max(vocab_size, 4)
    fixed = {s.name: rng.integers(3, high, s.prompt_len).tolist() for s in streams}
    arrivals = {s.name: rng.poisson(s.rate, frames) if s.rate > 0 else None for s in streams}
    order = sorted(streams, key=lambda s: -s.priority)  # stable: ties keep the given order
    schedule = []
    for f in range(frames):
        reqs = []
        for s in order:
            if s.rate > 0:
                count = int(arrivals[s.name][f])
            else:
                count = int(f >= s.offset and (f - s.offset) % s.every_n_frames == 0)
            for _ in range(count):
                prompt = rng.integers(3, high, s.prompt_len).tolist() if s.fresh_prompt else fixed[s.name]
                reqs.append(LanguageRequest(task=s.name, max_new_tokens=s.max_new_tokens, prompt_tokens=list(prompt),
                                            stream=s.name, priority=s.priority))
        schedule.append(reqs)
    return schedule


def observations(model: Pi05Model, count: int = 4) -> list[Observation]:
    """``count`` benchmark observations with different images (same shapes and prompt), cycled by frame index."""
    base = dummy_observation(model, 1, prompt_len=benchmark_prompt_len(model))
    gen = torch.Generator().manual_seed(1)
    out = [base]
    for _ in range(count - 1):
        images = (base.images.cpu() + 0.2 * torch.randn(base.images.shape, generator=gen)).clamp(-1, 1)
        out.append(dataclasses.replace(base, images=images.to(base.images.device, base.images.dtype)))
    return out


class StreamRun:
    """One engine on the stream schedule: warm-up, measured frames (recorded), then drain frames (no requests).

    The finished requests' ``latency_s`` is engine time: the time other engines' interleaved frames took between
    this engine's frames is taken out, so it is the latency of this engine running its frames back to back."""

    def __init__(self, name: str, model: Pi05Model, ec: EngineConfig, schedule: list[list[LanguageRequest]],
                 warmup: int, obs: list[Observation], noise: torch.Tensor, deadline_factor: float | None = None,
                 deadline_window: int = 5) -> None:
        self.name, self.ec, self.schedule, self.warm = name, ec, schedule, warmup
        self.auto = ec.mode == "oxygen" and ec.k == "auto"
        # k=auto: the deadline tracks deadline_factor x the median prefill + denoise of the last frames
        self.deadline_factor = deadline_factor if self.auto else None
        self.deadline_window = deadline_window
        self.action_s: list[float] = []  # prefill + denoise (the no-language work) of each frame so far
        self.deadlines: list[float] = []  # the deadline in force in each measured frame (k=auto)
        self.engine = build_engine(model, ec)
        self.obs, self.noise = obs, noise
        self.frame = 0
        self.records: list[FrameResult] = []  # measured frames
        self.finished: list[FinishedRequest] = []  # every frame's, warm-up and drain included
        self.rejected = 0
        self.drain_frames = 0
        self._outside = 0.0  # seconds spent outside this engine's frames since its first one
        self._outside_at: list[float] = []  # ... at the start of each frame
        self._last_end: float | None = None

    @property
    def done(self) -> bool:
        """Every frame of the schedule has run."""
        return self.frame >= len(self.schedule)

    def step(self) -> FrameResult:
        """Run the next frame of the schedule (after it: a drain frame with no requests)."""
        requests = self.schedule[self.frame] if not self.done else []
        start = time.perf_counter()
        if self._last_end is not None:
            self._outside += start - self._last_end
        self._outside_at.append(self._outside)
        budget = self.engine.budget
        if self.deadline_factor and self.action_s:
            budget.deadline_s = self.deadline_factor * statistics.median(self.action_s[-self.deadline_window:])
        res = self.engine.step(Frame(self.obs[self.frame % len(self.obs)], requests, self.noise))
        self._last_end = time.perf_counter()
        self.action_s.append(res.timings.get("prefill", 0.0) + res.timings.get("denoise", 0.0))
        self.finished += [dataclasses.replace(f, latency_s=f.latency_s - (self._outside - self._outside_at[
            f.frame_index])) for f in res.finished]
        self.rejected += res.rejected
        if self.warm <= self.frame < len(self.schedule):
            self.records.append(res)
            if self.auto:
                self.deadlines.append(budget.deadline_s)
        elif self.frame >= len(self.schedule):
            self.drain_frames += 1
        self.frame += 1
        return res

    def truncate(self) -> None:
        """End the schedule at the current frame (what is in flight still drains)."""
        self.schedule = self.schedule[:self.frame]

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close:
            close()


def no_language_frame_s(model: Pi05Model, frames: int, obs: list[Observation], noise: torch.Tensor,
                        num_steps: int, on_frame: Callable[[], None] | None = None) -> list[float]:
    """Frame times with no language at all (prefill + denoise), after one unrecorded frame."""
    engine = build_engine(model, EngineConfig(mode="oxygen", num_steps=num_steps, k=1, eos_id=-1))
    times = []
    for f in range(frames + 1):
        res = engine.step(Frame(obs[f % len(obs)], [], noise))
        if f:
            times.append(res.timings["frame"])
        if on_frame:
            on_frame()
    return times


def request_keys(finished: list[FinishedRequest]) -> dict[tuple[int, str, int], FinishedRequest]:
    """Each request by (originating frame, stream, rank among that frame's requests of the stream): the same key
    in every engine, whatever ids the engine handed out."""
    groups: dict[tuple[int, str], list[FinishedRequest]] = defaultdict(list)
    for f in finished:
        groups[(f.frame_index, f.stream)].append(f)
    return {(fi, st, i): f for (fi, st), fs in groups.items()
            for i, f in enumerate(sorted(fs, key=lambda r: r.request_id))}


def stream_stats(finished: list[FinishedRequest], measured: range, submitted: int) -> dict:
    """Latency (frames and seconds) of one stream's requests that originated in measured frames."""
    fs = [f for f in finished if f.frame_index in measured and not f.dropped]
    frames_ = [f.frames for f in fs]
    secs = [f.latency_s for f in fs]
    out = {"submitted": submitted, "finished": len(fs), "tokens": sum(len(f.tokens) for f in fs)}
    if fs:
        out |= {"latency_frames_p50": statistics.median(frames_), "latency_frames_p99": nearest_rank(frames_, 99),
                "latency_frames_mean": statistics.fmean(frames_),
                "latency_s_p50": statistics.median(secs), "latency_s_p99": nearest_rank(secs, 99),
                "latency_s_mean": statistics.fmean(secs), "latency_frames": frames_, "latency_s": secs}
    return out


def summarize_engine(run: StreamRun, horizon: int, streams: Sequence[StreamSpec]) -> dict:
    """Frame-time and per-stream statistics of one engine's measured frames."""
    times = [r.timings["frame"] for r in run.records]
    total = sum(times)
    median = statistics.median(times)
    stalls = [i for i, t in enumerate(times) if t > STALL_FACTOR * median]
    calm = [t for t in times if t <= STALL_FACTOR * median]
    p99_calm = nearest_rank(calm, 99)
    measured = range(run.warm, len(run.schedule))
    submitted: dict[str, int] = defaultdict(int)
    for f in measured:
        for r in run.schedule[f]:
            submitted[r.stream] += 1
    batches = [b for r in run.records for b in r.batch_sizes]
    stages = ("prefill", "language_prefill", "denoise", "decode", "manager")
    action = [r.timings.get("prefill", 0.0) + r.timings.get("denoise", 0.0) for r in run.records]
    dl = run.deadlines  # k=auto only
    over = [t / d for t, d in zip(times, dl, strict=True)] if dl else None
    return {
        "engine": run.ec.mode, "k": run.ec.k if run.ec.mode == "oxygen" else None,
        "deadline_ms": 1e3 * statistics.median(dl) if dl else None,  # median of frames'
        "deadline_ms_all": [1e3 * d for d in dl] if dl else None,
        "frames": len(times),
        "action_hz": horizon * len(times) / total,  # the paper's: H x frames / total frame time
        "action_hz_median": horizon / median,
        "action_hz_without_stalls": horizon * len(calm) / sum(calm),
        "frame_ms_mean": 1e3 * total / len(times),
        "frame_ms_median": 1e3 * median,
        "frame_ms_p99": 1e3 * nearest_rank(times, 99),
        "frame_ms_p99_without_stalls": 1e3 * p99_calm,
        "p99_over_median": p99_calm / median,  # host stalls excluded (they are reported beside)
        "p99_over_median_with_stalls": nearest_rank(times, 99) / median,
        "host_stalls": len(stalls),
        "host_stall_ms": [1e3 * times[i] for i in stalls],
        "deadline_misses": sum(t > d for t, d in zip(times, dl, strict=True)) if dl else None,
        "deadline_overrun_ms_max": 1e3 * max(t - d for t, d in zip(times, dl, strict=True)) if dl else None,
        "frame_over_deadline_median": statistics.median(over) if over else None,
        "frame_over_deadline_p99": nearest_rank(over, 99) if over else None,
        # the host's share of the spread: prefill + denoise is the same work in every frame of every engine
        "action_part_ms_median": 1e3 * statistics.median(action),
        "action_part_p99_over_median": nearest_rank(action, 99) / statistics.median(action),
        "action_part_ms_all": [1e3 * t for t in action],
        "tokens_per_s": sum(r.tokens_generated for r in run.records) / total,
        "tokens_per_frame": sum(r.tokens_generated for r in run.records) / len(times),
        "stage_ms": {s: 1e3 * sum(r.timings.get(s, 0.0) for r in run.records) / len(times) for s in stages},
        "decode_steps_per_frame": statistics.fmean(r.decode_steps for r in run.records),
        "batch_mean": statistics.fmean(batches) if batches else 0.0,
        "batch_max": max(batches, default=0),
        "inflight_mean": statistics.fmean(r.inflight for r in run.records),
        "inflight_max": max(r.inflight for r in run.records),
        "inflight_end": run.records[-1].inflight,  # the backlog after the last measured frame
        "rejected": run.rejected,
        "drain_frames": run.drain_frames,
        "memory_bytes": run.engine.memory_bytes(),
        "streams": {s.name: stream_stats([f for f in run.finished if f.stream == s.name], measured,
                                         submitted[s.name]) for s in streams},
        "frame_ms_all": [1e3 * t for t in times],
    }


def compare_texts(runs: dict[str, StreamRun], reference: str = "isolated") -> dict:
    """Per engine: requests whose tokens differ from ``reference``'s (the same request in both), and missing ones."""
    if reference not in runs:
        return {}
    ref = request_keys(runs[reference].finished)
    out = {}
    for name, run in runs.items():
        if name == reference:
            continue
        mine = request_keys(run.finished)
        differ = sum(1 for k, f in mine.items() if k in ref and f.tokens != ref[k].tokens)
        out[name] = {"compared": len(set(mine) & set(ref)), "differ": differ,
                     "missing": len(set(ref) ^ set(mine)), "identical": differ == 0 and set(ref) == set(mine)}
    return out


def targets(engines: dict[str, dict]) -> list[dict]:
    """The issue's targets, where the engines they need were measured."""
    out = []
    oxy, iso = engines.get("oxygen"), engines.get("isolated")
    if oxy and iso:
        v = oxy["action_hz"] / iso["action_hz"]
        out.append({"name": "oxygen action Hz / isolated action Hz", "value": v, "threshold": TARGET_SPEEDUP,
                    "op": ">=", "pass": v >= TARGET_SPEEDUP})
    if oxy:
        v = oxy["p99_over_median"]
        out.append({"name": "oxygen frame time p99 / median (host stalls excluded)", "value": v,
                    "threshold": TARGET_P99_OVER_MEDIAN, "op": "<=", "pass": v <= TARGET_P99_OVER_MEDIAN})
    return out


def engine_config(mode: str, num_steps: int, k: int | str, deadline_s: float | None,
                  streams: Sequence[StreamSpec], max_inflight: int) -> EngineConfig:
    """The engine of ``mode`` for the workload (oxygen: budget ``k``; every mode: eos never, pools sized)."""
    return EngineConfig(mode=mode, num_steps=num_steps, k=k if mode == "oxygen" else 1,
                        deadline_s=deadline_s if mode == "oxygen" else None, max_inflight=max_inflight,
                        max_new_tokens=max(s.max_new_tokens for s in streams),
                        max_prompt_tokens=max(16, max(s.prompt_len for s in streams)), eos_id=-1)


def run_streams(model: Pi05Model, engines: Sequence[str] = ENGINES, frames: int = 40, warmup: int = 6,
                streams: Sequence[StreamSpec] = REFERENCE_STREAMS, k: int | str = "auto",
                deadline_factor: float = DEFAULT_DEADLINE_FACTOR, deadline_ms: float | None = None,
                calibration_frames: int = 5, max_inflight: int = 32, max_drain: int = 200, seed: int = 0,
                max_s: float | None = None, deadline_mode: str = "warmup", deadline_window: int = 5) -> dict:
    """Calibrate the no-language frame, then every engine on the same stream schedule, frames interleaved; the
    ``results.json`` dict (without the machine and model description: see ``main``). ``max_s``: stop measuring
    after that many seconds (every engine keeps the same number of measured frames; at least one).

    k=auto: ``deadline_ms`` fixes the deadline; otherwise it is ``deadline_factor`` x the no-language frame time,
    measured as ``deadline_mode`` says (``DEADLINE_MODES``)."""
    engines = list(dict.fromkeys(engines))
    for e in engines:
        if e not in NODE_MODES:
            raise ValueError(f"engine must be one of {NODE_MODES}, got {e!r}")
    if deadline_mode not in DEADLINE_MODES:
        raise ValueError(f"deadline_mode must be one of {tuple(DEADLINE_MODES)}, got {deadline_mode!r}")
    cfg = model.config
    obs = observations(model)
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=gen).to(model.device, model.dtype)
    total = len(engines) * (warmup + frames) + calibration_frames + 1
    t_start = time.perf_counter()
    stopped_early = False
    mode = ("absolute" if deadline_ms else deadline_mode) if k == "auto" else None
    with progress_bar(total=total, desc="stream frames (interleaved)") as bar:
        bar.set_postfix_str("no-language frames")
        base = no_language_frame_s(model, calibration_frames, obs, noise, cfg.num_steps, lambda: bar.update(1))
        base_s = statistics.median(base)
        deadline_s = first_s = deadline_ms / 1e3 if deadline_ms else deadline_factor * base_s
        if mode:
            bar.write(f"no-language frame {1e3 * base_s:.0f} ms (median of {len(base)}): oxygen k=auto, deadline "
                      f"{1e3 * deadline_s:.0f} ms ({mode}: {DEADLINE_MODES.get(mode, 'given')})")
        runs = {e: StreamRun(e, model, engine_config(e, cfg.num_steps, k, deadline_s, streams, max_inflight),
                             stream_schedule(streams, warmup + frames, cfg.vocab_size, seed), warmup, obs, noise,
                             deadline_factor if mode == "tracking" else None, deadline_window)
                for e in engines}
        samples = list(base)  # no-language frame times the deadline derives from
        rounds = 0
        while not all(r.done for r in runs.values()):
            order = engines[rounds % len(engines):] + engines[:rounds % len(engines)]
            bar.set_postfix_str(f"round {rounds + 1}" + (" (warm-up)" if rounds < warmup else ""))
            for e in order:
                runs[e].step()
                bar.update(1)
            rounds += 1
            if rounds == warmup and mode == "warmup" and "oxygen" in runs:
                # every engine's warm-up frames do the no-language work too (prefill + denoise): their times,
                # each engine's first frame left out, join the calibration frames
                samples += [t for r in runs.values() for t in r.action_s[1:]]
                deadline_s = deadline_factor * statistics.median(samples)
                runs["oxygen"].engine.budget.deadline_s = deadline_s
                bar.write(f"no-language frame {1e3 * deadline_s / deadline_factor:.0f} ms (median of calibration "
                          f"and warm-up, {len(samples)} frames): oxygen deadline {1e3 * deadline_s:.0f} ms")
            if max_s and rounds > warmup and time.perf_counter() - t_start > max_s and not stopped_early:
                stopped_early = all(not r.done for r in runs.values())
                for run in runs.values():
                    run.truncate()
                if stopped_early:
                    bar.write(f"time budget of {max_s:.0f} s spent: {rounds - warmup} measured frames per engine")
        for run in runs.values():  # drain: every request started in a measured frame finishes
            while run.engine.backlog and run.drain_frames < max_drain:
                run.step()
            run.close()
    summaries = {e: summarize_engine(runs[e], cfg.action_horizon, streams) for e in engines}
    ratios = {}
    if "isolated" in summaries:
        iso = summaries["isolated"]
        for e, s in summaries.items():
            if e != "isolated":
                ratios[f"{e}_over_isolated_action_hz"] = s["action_hz"] / iso["action_hz"]
                ratios[f"{e}_over_isolated_action_hz_median"] = s["action_hz_median"] / iso["action_hz_median"]
                ratios[f"{e}_over_isolated_tokens_per_s"] = s["tokens_per_s"] / iso["tokens_per_s"]
    return {
        "workload": {"streams": [dataclasses.asdict(s) for s in streams], "frames": rounds - warmup,
                     "frames_planned": frames, "stopped_early": stopped_early, "warmup": warmup, "seed": seed,
                     "priority_field": True,
                     "requests_per_frame": {s.name: s.rate or 1 / s.every_n_frames for s in streams}},
        "oxygen": {"k": k, "deadline": mode, "deadline_ms_first": 1e3 * first_s if mode else None,
                   "deadline_ms": summaries["oxygen"]["deadline_ms"] if "oxygen" in summaries else None,
                   "deadline_factor": deadline_factor if mode and mode != "absolute" else None,
                   "deadline_window": deadline_window if mode == "tracking" else None},
        "no_language_frame_ms": {"median": 1e3 * base_s, "samples": [1e3 * t for t in base],
                                 "median_with_warmup": 1e3 * statistics.median(samples),
                                 "samples_with_warmup": len(samples)},
        "engines": summaries,
        "ratios": ratios,
        "texts_vs_isolated": compare_texts(runs),
        "targets": targets(summaries),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of ``oxygen-bench streams``."""
    ap = argparse.ArgumentParser(prog="oxygen-bench streams", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="small")
    ap.add_argument("--preset", default="libero")
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=NODE_MODES)
    ap.add_argument("--frames", type=int, default=40, help="measured frames per engine (after warm-up)")
    ap.add_argument("--warmup", type=int, default=6, help="frames per engine before measuring (same schedule)")
    ap.add_argument("--k", default="auto", help="oxygen's decode budget per frame: auto (deadline) or an integer")
    ap.add_argument("--deadline-factor", type=float, default=DEFAULT_DEADLINE_FACTOR,
                    help="k=auto: frame deadline as a multiple of the measured no-language frame time")
    ap.add_argument("--deadline-ms", type=float, default=None, help="k=auto: an absolute frame deadline instead")
    ap.add_argument("--deadline-mode", default="warmup", choices=sorted(DEADLINE_MODES),
                    help="k=auto: where the no-language frame time comes from: " + "; ".join(
                        f"{m}: {d}" for m, d in DEADLINE_MODES.items()))
    ap.add_argument("--deadline-window", type=int, default=5,
                    help="k=auto, --deadline-mode tracking: the median over oxygen's last W frames")
    ap.add_argument("--calibration-frames", type=int, default=5, help="no-language frames timed for the deadline")
    ap.add_argument("--question-rate", type=float, default=0.4, help="mean questions per frame (Poisson)")
    ap.add_argument("--S", type=int, default=10, help="denoise steps")
    add_model_args(ap)
    ap.add_argument("--max-minutes", type=float, default=None,
                    help="stop measuring after this long (a shared host: every engine keeps the same frame count)")
    ap.add_argument("--out", type=Path, default=Path("runs/streams"))
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """``oxygen-bench streams``: build the model, run the workload on every engine, write JSON, tables, plots."""
    a = parse_args(argv)
    model, onednn = model_from_args(a, num_steps=a.S)
    streams = tuple(dataclasses.replace(s, rate=a.question_rate) if s.rate else s for s in REFERENCE_STREAMS)
    k: int | str = a.k if a.k == "auto" else int(a.k)
    t0 = time.perf_counter()
    res = run_streams(model, a.engines, a.frames, a.warmup, streams, k, a.deadline_factor, a.deadline_ms,
                      a.calibration_frames, seed=a.seed, max_s=60 * a.max_minutes if a.max_minutes else None,
                      deadline_mode=a.deadline_mode, deadline_window=a.deadline_window)
    cfg = model.config
    res = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_info(torch.device(a.device)),
           "config": {"model": cfg.name, "preset": a.preset, "parameters": model.num_parameters(),
                      "dtype": dtype_name(model.dtype), "onednn_linear": onednn, "S": cfg.num_steps,
                      "H": cfg.action_horizon},
           "command": "oxygen-bench streams " + " ".join(sys.argv[1:] if argv is None else argv),
           "wall_s": time.perf_counter() - t0, **res}
    table = write_results(res, a.out)
    print(table)
    print(f"\nwrote {a.out / 'results.json'}, summary.md, frame_times.png and stream_latency.png")
    return res
