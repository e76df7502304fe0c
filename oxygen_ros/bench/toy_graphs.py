"""Static-shape steps on the embedded model's closed loop: the toy pi0.5 in the tabletop world, graphs off and on
side by side (``python -m oxygen_ros.bench.toy_graphs --out runs/toy_graphs``; docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from oxygen_ros.bench.frame_overhead import stage_overhead
from oxygen_ros.bench.observation import benchmark_prompt_len
from oxygen_ros.bench.progress import progress_bar
from oxygen_ros.bench.report import save_figure, subplots, write_run
from oxygen_ros.bench.runner import machine_info
from oxygen_ros.engine.engine import EngineConfig, build_engine
from oxygen_ros.policy import RawObservation, load_policy
from oxygen_ros.policy.language import LanguageSchedule
from oxygen_ros.policy.runner import FrameRunner
from oxygen_ros.policy.shipped_model import TOY_MODEL_DIR
from oxygen_ros.toy.world import CAMERAS, TabletopWorld, WorldConfig


def run(graphs: str = "compile", episodes: int = 20, max_steps: int = 60, k: int = 5, max_new_tokens: int = 16,
        max_inflight: int = 8, model_dir: Path = TOY_MODEL_DIR, first_seed: int = 100,
        stage_repeats: int = 9) -> dict:
    """The ``results.json`` dict: eager (``off``) against ``graphs`` on the toy closed loop, then (with
    ``stage_repeats``) the stages of the same model (``bench.frame_overhead.stage_overhead``)."""
    policy = load_policy(model_dir)
    tok = policy.tokenizer
    streams = [LanguageSchedule(0, "memory", "", max_new_tokens, 32, name="memory", trigger="continuous"),
               LanguageSchedule(2, "narration", "", max_new_tokens, 32, name="narration")]
    names = ("off", graphs)
    runners, build_s = {}, {}
    for g in names:
        cfg = EngineConfig(k=k, eos_id=tok.eos_id, max_new_tokens=max_new_tokens, max_inflight=max_inflight,
                           graphs=g, num_steps=policy.model.config.num_steps)
        t0 = time.perf_counter()
        runners[g] = FrameRunner(policy, lambda cfg=cfg: build_engine(policy.model, cfg, detokenize=tok.decode),
                                 streams)
        build_s[g] = time.perf_counter() - t0
    world = TabletopWorld(WorldConfig(image_size=policy.model.config.vision.image_size, max_steps=max_steps))
    times: dict[str, list[float]] = {g: [] for g in names}
    texts: dict[str, list[tuple]] = {g: [] for g in names}
    max_diff = 0.0
    with progress_bar(total=episodes, desc="toy episodes (graphs off / on interleaved)") as bar:
        for e in range(episodes):
            obs = world.reset(first_seed + e)
            for _ in range(max_steps):
                raw = RawObservation({c: obs.images[c] for c in CAMERAS}, obs.state, obs.instruction)
                order = names if len(times["off"]) % 2 == 0 else names[::-1]
                outs = {g: runners[g].step(raw) for g in order}
                for g, o in outs.items():
                    times[g].append(o.result.timings["frame"])
                    texts[g] += [(f.stream, f.frame_index, f.text) for f in o.result.finished]
                max_diff = max(max_diff, float(np.abs(outs["off"].chunk.actions - outs[graphs].chunk.actions).max()))
                if world.done:
                    break
                world.step(outs["off"].chunk.actions)
                obs = world.observation()
            bar.update(1)
    res: dict = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_info(policy.model.device),
                 "config": {"model": "toy", "graphs": graphs, "episodes": episodes, "k": k,
                            "max_new_tokens": max_new_tokens, "max_inflight": max_inflight},
                 "frames": len(times["off"]), "max_action_diff": max_diff,
                 "identical_texts": sorted(texts["off"]) == sorted(texts[graphs]), "outputs": len(texts["off"])}
    for g in names:
        med = statistics.median(times[g])
        res[g] = {"build_s": build_s[g], "frame_ms_median": 1e3 * med,
                  "frame_ms_mean": 1e3 * statistics.fmean(times[g]), "stalls": sum(t > 5 * med for t in times[g]),
                  "frame_ms": [1e3 * t for t in times[g]]}
    res["speedup_median"] = res["off"]["frame_ms_median"] / res[graphs]["frame_ms_median"]
    res["speedup_mean"] = res["off"]["frame_ms_mean"] / res[graphs]["frame_ms_mean"]
    if stage_repeats:  # the same model stage by stage: eager, fused and the graphs step, paired rounds
        model = policy.model
        res["stages"] = stage_overhead(model, [1, 4], stage_repeats, prompt_len=benchmark_prompt_len(model),
                                       graphs=graphs)
    return res


def summary(res: dict) -> str:
    g = res["config"]["graphs"]
    lines = [f"Toy closed loop, {res['frames']} frames, continuous memory + narration every 2nd frame, k="
             f"{res['config']['k']}: identical texts {res['identical_texts']} ({res['outputs']} outputs), "
             f"largest action difference {res['max_action_diff']:.1e}", "",
             "| graphs | engine build s | frame ms median | frame ms mean | stalls | speedup (median / mean) |",
             "|---|---|---|---|---|---|"]
    for name in ("off", g):
        v = res[name]
        x = "1.00x / 1.00x" if name == "off" else f"{res['speedup_median']:.2f}x / {res['speedup_mean']:.2f}x"
        lines.append(f"| {name} | {v['build_s']:.1f} | {v['frame_ms_median']:.1f} | {v['frame_ms_mean']:.1f} | "
                     f"{v['stalls']} | {x} |")
    if "stages" in res:
        lines += ["", f"| stage | eager ms | fused ms | {g} ms | fused speedup | {g} speedup |", "|" + "---|" * 6]
        for name, st in res["stages"].items():
            gms = f"{1e3 * st['graphs_s']:.2f}" if "graphs_s" in st else "-"
            gx = f"{st['graphs_speedup']:.2f}x" if "graphs_speedup" in st else "-"
            lines.append(f"| {name.replace('_B', ' B=')} | {1e3 * st['eager_s']:.2f} | {1e3 * st['fused_s']:.2f} | "
                         f"{gms} | {st['speedup']:.2f}x | {gx} |")
    return "\n".join(lines)


def plot(res: dict, path: Path) -> Path:
    """Frame time per frame, graphs off and on."""
    g = res["config"]["graphs"]
    fig, ax = subplots(figsize=(8, 3.5))
    for name in ("off", g):
        ax.plot(res[name]["frame_ms"], label=f"{name}: median {res[name]['frame_ms_median']:.1f} ms")
    ax.set_xlabel("frame")
    ax.set_ylabel("engine frame ms")
    ax.set_title(f"toy closed loop: graphs off vs {g} ({res['speedup_median']:.2f}x by median)")
    ax.legend()
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default="compile", choices=["static", "compile", "cuda"])
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--stage-repeats", type=int, default=9, help="paired rounds per stage (0: no stages)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    res = run(a.graphs, a.episodes, stage_repeats=a.stage_repeats)
    write_run(a.out, res, summary(res), plot, "toy_graphs.png")


if __name__ == "__main__":
    main()
