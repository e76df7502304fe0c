"""Speculative decoding on the toy model's closed loop (memory stream), on and off side by side; workloads
``continuous`` and ``every_frame`` (docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

import torch

from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.policy import RawObservation, load_policy
from oxygen_ros.policy.language import LanguageSchedule
from oxygen_ros.policy.runner import FrameRunner
from oxygen_ros.policy.shipped_model import TOY_MODEL_DIR
from oxygen_ros.toy.train.policy import episode_noise
from oxygen_ros.toy.world import CAMERAS, TabletopWorld, WorldConfig

FIRST_SEED = 2_000_000


WORKLOADS = ("continuous", "every_frame")


def _stream(workload: str, max_new_tokens: int) -> LanguageSchedule:
    if workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}, got {workload!r}")
    if workload == "continuous":
        return LanguageSchedule(0, "memory", "", max_new_tokens, 32, trigger="continuous")
    return LanguageSchedule(1, "memory", "", max_new_tokens, 32)


def _runner(policy, k: int, max_new_tokens: int, speculate: int, noise,
            stream: LanguageSchedule | None) -> FrameRunner:
    tok = policy.tokenizer
    cfg = EngineConfig(mode="oxygen", k=k, eos_id=tok.eos_id, max_new_tokens=max_new_tokens, speculate=speculate,
                       num_steps=policy.model.config.num_steps)
    return FrameRunner(policy, lambda: build_engine(policy.model, cfg, detokenize=tok.decode), stream, noise=noise)


def toy_memory_stream(episodes: int = 4, k: int = 5, max_new_tokens: int = 16, speculate: int = 8,
                      model_dir: Path = TOY_MODEL_DIR, first_seed: int = FIRST_SEED, max_steps: int = 200,
                      workload: str = "continuous") -> dict:
    """Run ``episodes`` toy episodes with a memory stream (``workload``) through two engines (speculate 0 and
    ``speculate``); the record of each and whether their texts and chunks agree."""
    policy = load_policy(model_dir)
    stream = _stream(workload, max_new_tokens)
    state = {"seed": 0, "frame": 0}

    def noise(_i: int, h: int, a: int) -> torch.Tensor:
        return episode_noise(state["seed"], state["frame"], h, a)

    names = ("off", "on")
    runners = {n: _runner(policy, k, max_new_tokens, speculate if n == "on" else 0, noise, stream) for n in names}
    # continuous: the requests of "on", replayed without speculation on the same frames (the texts' reference)
    check = _runner(policy, k, max_new_tokens, 0, noise, None) if workload == "continuous" else None
    checked: dict[int, str] = {}
    engine_s = dict.fromkeys(names, 0.0)
    decode_s = dict.fromkeys(names, 0.0)
    forwards = dict.fromkeys(names, 0)
    finished: dict[str, dict[int, tuple[str, int, float]]] = {n: {} for n in names}
    world = TabletopWorld(WorldConfig(image_size=policy.model.config.vision.image_size, max_steps=max_steps))
    frames = 0
    same_chunks = True

    def step(name: str, raw, language: bool = True):
        out = runners[name].step(raw, start_language=language)
        engine_s[name] += out.result.timings["frame"]
        decode_s[name] += out.result.timings.get("decode", 0.0)
        forwards[name] += out.result.decode_steps
        for f in out.result.finished:
            finished[name][f.request_id] = (f.text, f.frames, f.latency_s)
        return out

    for e in range(episodes):
        obs = world.reset(first_seed + e)
        state["seed"] = first_seed + e
        for t in range(max_steps):
            state["frame"] = t
            raw = RawObservation({c: obs.images[c] for c in CAMERAS}, obs.state, obs.instruction)
            order = names if (frames % 2 == 0) else names[::-1]
            outs = {n: step(n, raw) for n in order}
            if check is not None:
                for r in outs["on"].requests:  # the same requests on the same frame, without speculation
                    check.submit(dataclasses.replace(r, tag=None))
                checked.update(_texts_of(check.step(raw, start_language=False)))
            frames += 1
            same_chunks &= bool((outs["off"].chunk.actions == outs["on"].chunk.actions).all())
            if world.done:
                break
            world.step(outs["off"].chunk.actions)
            obs = world.observation()
    for n in names:  # finish what is in flight
        while runners[n].backlog:
            step(n, outs[n].prepared, language=False)
    if check is not None:
        while check.backlog:
            checked.update(_texts_of(check.step(outs["on"].prepared, start_language=False)))
        on = {i: v[0] for i, v in finished["on"].items()}
        identical = bool(on) and checked == on  # request ids count alike: the same requests in the same order
    else:
        identical = _texts(finished)
    res = {"episodes": episodes, "frames": frames, "k": k, "max_new_tokens": max_new_tokens, "speculate": speculate,
           "workload": workload, "same_chunks": same_chunks, "identical_texts": identical}
    for n in names:
        eng = runners[n].engine
        done = finished[n].values()
        res[n] = {
            "requests": len(done), "tokens": eng.totals["tokens"], "engine_s": engine_s[n],
            "tokens_per_s": eng.totals["tokens"] / engine_s[n],
            "decode_s": decode_s[n], "tokens_per_decode_s": eng.totals["tokens"] / decode_s[n],
            "decode_forwards": forwards[n],
            "action_hz": policy.model.config.action_horizon * frames / engine_s[n],
            "latency_frames_mean": statistics.fmean(f for _, f, _ in done),
            "latency_ms_mean": 1e3 * statistics.fmean(s for _, _, s in done),
            "drafted": eng.totals["drafted"], "draft_accepted": eng.totals["draft_accepted"],
            "acceptance_rate": eng.acceptance_rate,
        }
    res["tokens_per_s_ratio"] = res["on"]["tokens_per_s"] / res["off"]["tokens_per_s"]
    res["tokens_per_decode_s_ratio"] = res["on"]["tokens_per_decode_s"] / res["off"]["tokens_per_decode_s"]
    res["latency_frames_ratio"] = res["on"]["latency_frames_mean"] / res["off"]["latency_frames_mean"]
    res["created"] = time.strftime("%Y-%m-%d %H:%M:%S")
    return res


def _texts_of(out) -> dict[int, str]:
    return {f.request_id: f.text for f in out.result.finished}


def _texts(finished: dict[str, dict[int, tuple[str, int, float]]]) -> bool:
    """Same request ids and the same text for each."""
    a, b = finished["off"], finished["on"]
    return a.keys() == b.keys() and all(a[i][0] == b[i][0] for i in a)
