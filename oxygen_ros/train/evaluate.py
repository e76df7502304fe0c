"""Closed-loop evaluation of a trained model in the tabletop world, driven by the inference engine.

    python -m oxygen_ros.train.evaluate --model oxygen_ros/models/toy --episodes 100 --mode oxygen [--out runs/eval_toy]

Every control frame: the world's raw observation -> the policy layer's frame runner (the checkpoint's own
pre-processing, engine.step with a "memory" language request, post-processing to world units; the same runner the
ROS node and the bag evaluation use) -> the chunk is executed in the world. Reports the success rate, the exact
match of every generated memory against the world's ground truth at the request's originating frame, the action
frequency and the language throughput; writes ``eval_<mode>.json`` and ``filmstrip_<mode>.png`` (one episode with
its memory texts). Evaluation seeds start at 1,000,000, disjoint from the training demonstrations (seeds 0 ..
episodes - 1).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from oxygen_ros.engine.engine import Engine, EngineConfig, build_engine
from oxygen_ros.engine.modes import ENGINE_MODES
from oxygen_ros.engine.requests import FinishedRequest, FrameResult
from oxygen_ros.models import TOY_MODEL_DIR
from oxygen_ros.policy import PreparedObservation, RawObservation, load_policy
from oxygen_ros.policy.runner import FrameRunner, LanguageSchedule
from oxygen_ros.world import CAMERAS, TabletopWorld, WorldConfig, WorldObservation

from .filmstrip import FilmFrame, save_filmstrip
from .policy import episode_noise

__all__ = ["EVAL_FIRST_SEED", "ClosedLoop", "EpisodeResult", "actions_digest", "evaluate"]

EVAL_FIRST_SEED = 1_000_000


@dataclass
class EpisodeResult:
    """One episode: outcome, length, memory matches and (optionally) the executed chunks and film frames."""

    seed: int
    instruction: str
    success: bool
    steps: int
    frames: int
    memory_total: int = 0
    memory_exact: int = 0
    chunks: list[np.ndarray] = field(default_factory=list, repr=False)
    film: list[FilmFrame] = field(default_factory=list, repr=False)


class ClosedLoop:
    """A model directory (checkpoint, tokenizer, norm stats) run by the policy layer's frame runner in the world."""

    def __init__(self, model_dir: Path, mode: str = "oxygen", k: int = 5, max_new_tokens: int = 16,
                 num_steps: int | None = None, max_steps: int = WorldConfig.max_steps) -> None:
        self.policy = load_policy(model_dir)
        self.model = self.policy.model
        cfg, tok = self.model.config, self.policy.tokenizer
        self.max_new_tokens = max_new_tokens
        engine_cfg = EngineConfig(mode=mode, k=k, eos_id=tok.eos_id, max_new_tokens=max_new_tokens,
                                  num_steps=num_steps or cfg.num_steps)

        def factory() -> Engine:
            return build_engine(self.model, engine_cfg, detokenize=tok.decode)

        self._seed, self._frame = 0, 0  # noise is fixed by (episode seed, frame in the episode)
        self.runner = FrameRunner(self.policy, factory, LanguageSchedule(1, "memory", "", max_new_tokens, 32),
                                  noise=lambda _i, h, a: episode_noise(self._seed, self._frame, h, a))
        self.engine = self.runner.engine
        self.world = TabletopWorld(WorldConfig(image_size=cfg.vision.image_size, max_steps=max_steps))
        self.frame_s: list[float] = []  # engine time of frames whose chunk was executed
        self.engine_s = 0.0
        self.tokens = 0

    @staticmethod
    def raw(obs: WorldObservation) -> RawObservation:
        """The world's observation as a robot would hand it over (camera slot -> RGB, state, instruction)."""
        return RawObservation({c: obs.images[c] for c in CAMERAS}, obs.state, obs.instruction)

    def _step(self, observation: RawObservation | PreparedObservation, language: bool = True):
        out = self.runner.step(observation, start_language=language)
        res: FrameResult = out.result
        self.engine_s += res.timings["frame"]
        self.tokens += res.tokens_generated
        self._last = res
        return out

    def run_episode(self, seed: int, record: bool = False) -> EpisodeResult:
        """One episode: replan every chunk until success or the step limit, plus one frame after the end (its
        memory describes the final scene), then finish in-flight language requests."""
        world = self.world
        obs = world.reset(seed)
        self._seed = seed
        truth: dict[int, str] = {}
        film: dict[int, FilmFrame] = {}
        finished: list[FinishedRequest] = []
        result = EpisodeResult(seed, world.instruction, False, 0, 0)
        while True:
            self._frame = result.frames
            ending = world.done
            out = self._step(self.raw(obs))
            finished += out.result.finished
            index = out.result.frame_index
            truth[index] = world.memory_text()
            if record:
                film[index] = FilmFrame(world.steps, [obs.images[c] for c in CAMERAS], truth[index])
            result.frames += 1
            if ending:
                break
            self.frame_s.append(out.result.timings["frame"])
            result.chunks.append(out.chunk.actions)
            world.step(out.chunk.actions)
            obs = world.observation()
        while self.runner.backlog:
            finished += self._step(out.prepared, language=False).result.finished
        result.success, result.steps = world.success, world.steps
        for f in finished:
            result.memory_total += 1
            result.memory_exact += int(not f.dropped and f.text == truth[f.frame_index])
            if f.frame_index in film:
                film[f.frame_index].memory_pred = f.text
        result.film = [film[i] for i in sorted(film)]
        return result

    def metrics(self, results: list[EpisodeResult]) -> dict:
        """Aggregate success, memory exact match and speed over ``results``."""
        mem_total = sum(r.memory_total for r in results)
        mean_frame = float(np.mean(self.frame_s)) if self.frame_s else float("nan")
        return {
            "mode": self.engine.config.mode,
            "episodes": len(results),
            "success_rate": float(np.mean([r.success for r in results])),
            "memory_exact_match": sum(r.memory_exact for r in results) / max(1, mem_total),
            "memory_requests": mem_total,
            "mean_steps": float(np.mean([r.steps for r in results])),
            "mean_frame_ms": 1000.0 * mean_frame,
            "action_chunks_per_s": 1.0 / mean_frame,
            "actions_per_s": self.model.config.action_horizon / mean_frame,
            "language_tokens_per_s": self.tokens / self.engine_s if self.engine_s else 0.0,
            "language_tokens": self.tokens,
        }


def _display_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (no machine paths in committed JSON)."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def actions_digest(chunks: list[np.ndarray]) -> str:
    """SHA-1 of an episode's executed chunks (float32 bytes): equal digests = bit-identical actions."""
    h = hashlib.sha1()
    for chunk in chunks:
        h.update(np.ascontiguousarray(chunk, dtype=np.float32).tobytes())
    return h.hexdigest()


def evaluate(model_dir: Path, episodes: int = 100, mode: str = "oxygen", first_seed: int = EVAL_FIRST_SEED,
             k: int = 5, max_new_tokens: int = 16, out: Path | None = None, threads: int = 1,
             progress: bool = True) -> dict:
    """Run ``episodes`` seeded episodes; write JSON and the filmstrip of the first episode into ``out``."""
    from tqdm import tqdm

    torch.set_num_threads(threads)
    loop = ClosedLoop(Path(model_dir), mode, k, max_new_tokens)
    results = [loop.run_episode(first_seed + i, record=i == 0)
               for i in tqdm(range(episodes), desc=f"evaluate ({mode})", disable=not progress)]
    metrics = loop.metrics(results)
    metrics["per_episode"] = [{**{k: v for k, v in asdict(r).items() if k not in ("chunks", "film")},
                               "actions_sha1": actions_digest(r.chunks)} for r in results]
    metrics.update(model=_display_path(Path(model_dir)), k=k, max_new_tokens=max_new_tokens, first_seed=first_seed)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"eval_{mode}.json").write_text(json.dumps(metrics, indent=2))
        r0 = results[0]
        title = f"{r0.instruction} (seed {r0.seed}, {'success' if r0.success else 'failure'}, {mode} engine)"
        metrics["filmstrip"] = str(save_filmstrip(r0.film, out / f"filmstrip_{mode}.png", title))
    return metrics


def main(argv: list[str] | None = None) -> None:
    """CLI entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=TOY_MODEL_DIR, help="model directory")
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--mode", default="oxygen", choices=ENGINE_MODES)
    ap.add_argument("--first-seed", type=int, default=EVAL_FIRST_SEED)
    ap.add_argument("--k", type=int, default=5, help="per-frame decode budget (oxygen)")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("runs/eval_toy"), help="where the JSON and PNG go")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    m = evaluate(a.model, a.episodes, a.mode, a.first_seed, a.k, a.max_new_tokens, a.out, a.threads)
    print(f"{a.mode}: success {m['success_rate']:.1%} over {m['episodes']} episodes, memory exact match "
          f"{m['memory_exact_match']:.2%} ({m['memory_requests']} requests), {m['action_chunks_per_s']:.1f} chunks/s "
          f"({m['actions_per_s']:.0f} actions/s), {m['language_tokens_per_s']:.0f} tokens/s "
          f"[{time.perf_counter() - t0:.0f} s] -> {a.out}")


if __name__ == "__main__":
    main()
