"""Closed-loop evaluation of a trained model in the tabletop world, driven by the inference engine.

    python -m oxygen_ros.toy.train.evaluate --model oxygen_ros/toy/model --episodes 100 --mode oxygen
        [--out runs/eval_toy] [--subtask off|on|both]

Every control frame: the world's raw observation -> the policy layer's frame runner (the checkpoint's own
pre-processing, engine.step with the frame's language requests, post-processing to world units; the same runner the
ROS node and the bag evaluation use) -> the chunk's first ``--execute`` actions (default: the checkpoint's
``n_action_steps``, 8 of the toy model's 16) are executed in the world, then the next frame replans. Each frame
starts one request of every language task (:data:`LANGUAGE_TASKS`): "memory", "subtask" and "narration" streams of
the runner and one question (task "answer", ``PromptTokenizer.tokenize_question``, drawn from
:func:`oxygen_ros.toy.world.sample_questions`) added to the frame's requests. Every finished text is scored by exact
match against the world's truth at the frame its request started from.

Subtask conditioning (``--subtask on``, staged inference): the latest finished subtask text (the one started last)
goes into the action prompt of the following frames (``"...;\nSubtask: {subtask};\nAction: "``); until the first
one finishes the prompt is the unconditioned one. ``off`` keeps upstream's prompt throughout.

Reports the success rate, the exact match per task, the action frequency and the language throughput; writes
``eval_<mode>.json`` (off) / ``eval_<mode>_subtask.json`` (on) and their ``filmstrip_*.png`` (one episode with its
memory texts). Evaluation seeds start at 1,000,000, disjoint from the training demonstrations (seeds 0 .. episodes -
1).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from oxygen_ros.engine.engine import Engine, EngineConfig, build_engine
from oxygen_ros.engine.modes import ENGINE_MODES
from oxygen_ros.engine.requests import FinishedRequest, FrameResult, LanguageRequest
from oxygen_ros.policy import Policy, PreparedObservation, RawObservation, load_policy
from oxygen_ros.policy.language import LanguageSchedule
from oxygen_ros.policy.runner import FrameRunner
from oxygen_ros.policy.shipped_model import TOY_MODEL_DIR
from oxygen_ros.toy.world import CAMERAS, TabletopWorld, WorldConfig, WorldObservation, expert_subtask
from oxygen_ros.toy.world.language import narration_text, sample_questions

from .filmstrip import FilmFrame, save_filmstrip
from .policy import episode_noise

__all__ = ["EVAL_FIRST_SEED", "LANGUAGE_TASKS", "ClosedLoop", "EpisodeResult", "actions_digest", "evaluate",
           "prepare_with_subtask"]

EVAL_FIRST_SEED = 1_000_000
LANGUAGE_TASKS: tuple[str, ...] = ("memory", "subtask", "narration", "answer")
ANSWER = "answer"
MAX_MISMATCHES = 8  # per episode, kept in the JSON for inspection


@dataclass
class EpisodeResult:
    """One episode: outcome, length, language matches per task and (optionally) the executed chunks and film."""

    seed: int
    instruction: str
    success: bool
    steps: int
    frames: int
    memory_total: int = 0
    memory_exact: int = 0
    total: dict[str, int] = field(default_factory=dict)  # task -> finished requests
    exact: dict[str, int] = field(default_factory=dict)  # task -> exact matches
    conditioned_frames: int = 0  # frames whose action prompt held a subtask
    mismatches: list[dict] = field(default_factory=list)  # the first MAX_MISMATCHES wrong texts
    chunks: list[np.ndarray] = field(default_factory=list, repr=False)
    film: list[FilmFrame] = field(default_factory=list, repr=False)


def prepare_with_subtask(policy: Policy, raw: RawObservation, subtask: str | None) -> PreparedObservation:
    """``policy.prepare(raw)`` with the action prompt conditioned on ``subtask`` (None or '': unchanged)."""
    return policy.prepare(dataclasses.replace(raw, subtask=subtask or ""))


class ClosedLoop:
    """A model directory (checkpoint, tokenizer, norm stats) run by the policy layer's frame runner in the world.

    ``tasks``: the language tasks each frame starts (subset of :data:`LANGUAGE_TASKS`); ``condition``: subtask
    conditioning of the action prompt (needs the "subtask" task); ``execute``: actions of each chunk executed before
    the next frame (None: the checkpoint's ``n_action_steps``; at most the chunk)."""

    def __init__(self, model_dir: Path, mode: str = "oxygen", k: int = 5, max_new_tokens: int = 24,
                 num_steps: int | None = None, max_steps: int = WorldConfig.max_steps,
                 tasks: tuple[str, ...] = LANGUAGE_TASKS, condition: bool = False, question_seed: int = 0,
                 execute: int | None = None) -> None:
        unknown = set(tasks) - set(LANGUAGE_TASKS)
        if unknown:
            raise ValueError(f"unknown language tasks {sorted(unknown)}; known: {LANGUAGE_TASKS}")
        if condition and "subtask" not in tasks:
            raise ValueError("subtask conditioning needs the 'subtask' task")
        self.policy = load_policy(model_dir)
        self.model = self.policy.model
        cfg, tok = self.model.config, self.policy.tokenizer
        self.tasks, self.condition, self.question_seed = tuple(tasks), condition, question_seed
        self.max_new_tokens = max_new_tokens
        engine_cfg = EngineConfig(mode=mode, k=k, eos_id=tok.eos_id, max_new_tokens=max_new_tokens,
                                  max_prompt_tokens=32, num_steps=num_steps or cfg.num_steps)

        def factory() -> Engine:
            return build_engine(self.model, engine_cfg, detokenize=tok.decode)

        self._seed, self._frame = 0, 0  # noise is fixed by (episode seed, frame in the episode)
        streams = [LanguageSchedule(1, t, "", max_new_tokens, 32) for t in self.tasks if t != ANSWER]
        self.runner = FrameRunner(self.policy, factory, streams,
                                  noise=lambda _i, h, a: episode_noise(self._seed, self._frame, h, a),
                                  n_execute=execute)
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

    def _truth(self, world: TabletopWorld, question: tuple[str, str] | None) -> dict[str, str]:
        t = {"memory": world.memory_text(), "subtask": expert_subtask(world), "narration": narration_text(world)}
        if question is not None:
            t[ANSWER] = question[1]
        return t

    def run_episode(self, seed: int, record: bool = False) -> EpisodeResult:
        """One episode: replan every chunk until success or the step limit, plus one frame after the end (its
        language describes the final scene), then finish in-flight language requests."""
        world = self.world
        obs = world.reset(seed)
        self._seed = seed
        tok = self.policy.tokenizer
        truth: dict[int, dict[str, str]] = {}
        questions: dict[int, str] = {}
        film: dict[int, FilmFrame] = {}
        finished: list[FinishedRequest] = []
        result = EpisodeResult(seed, world.instruction, False, 0, 0)
        subtask, subtask_frame = "", -1  # the latest finished subtask text (by originating frame)

        def collect(done: list[FinishedRequest]) -> None:
            nonlocal subtask, subtask_frame
            finished.extend(done)
            for f in done:
                if f.task == "subtask" and not f.dropped and f.text is not None and f.frame_index > subtask_frame:
                    subtask, subtask_frame = f.text.strip(), f.frame_index

        while True:
            self._frame = result.frames
            ending = world.done
            question = None
            if ANSWER in self.tasks:  # the frame's question, admitted after its stream requests
                question = sample_questions(world, np.random.default_rng([seed, result.frames, self.question_seed]))[0]
                self.runner.submit(LanguageRequest(ANSWER, self.max_new_tokens, tok.tokenize_question(question[0]),
                                                   stream=ANSWER))
            cond = subtask if self.condition else ""
            result.conditioned_frames += int(bool(cond))
            out = self._step(prepare_with_subtask(self.policy, self.raw(obs), cond))
            index = out.result.frame_index
            truth[index] = self._truth(world, question)
            if question is not None:
                questions[index] = question[0]
            collect(out.result.finished)
            if record:
                film[index] = FilmFrame(world.steps, [obs.images[c] for c in CAMERAS], truth[index]["memory"])
            result.frames += 1
            if ending:
                break
            self.frame_s.append(out.result.timings["frame"])
            result.chunks.append(out.chunk.actions)
            world.step(out.chunk.actions)
            obs = world.observation()
        while self.runner.backlog:
            collect(self._step(out.prepared, language=False).result.finished)
        result.success, result.steps = world.success, world.steps
        for f in finished:
            task = f.task
            want = truth[f.frame_index].get(task)
            ok = not f.dropped and f.text == want
            result.total[task] = result.total.get(task, 0) + 1
            result.exact[task] = result.exact.get(task, 0) + int(ok)
            if not ok and len(result.mismatches) < MAX_MISMATCHES:
                miss = {"task": task, "frame": f.frame_index - min(truth), "pred": f.text, "true": want}
                if task == ANSWER:
                    miss["question"] = questions.get(f.frame_index)
                result.mismatches.append(miss)
            if task == "memory" and f.frame_index in film:
                film[f.frame_index].memory_pred = f.text
        result.memory_total, result.memory_exact = result.total.get("memory", 0), result.exact.get("memory", 0)
        result.film = [film[i] for i in sorted(film)]
        return result

    def metrics(self, results: list[EpisodeResult]) -> dict:
        """Aggregate success, exact match per language task and speed over ``results``."""
        mean_frame = float(np.mean(self.frame_s)) if self.frame_s else float("nan")
        out = {
            "mode": self.engine.config.mode,
            "subtask_conditioning": self.condition,
            "episodes": len(results),
            "success_rate": float(np.mean([r.success for r in results])),
        }
        for task in self.tasks:
            total = sum(r.total.get(task, 0) for r in results)
            out[f"{task}_exact_match"] = sum(r.exact.get(task, 0) for r in results) / max(1, total)
            out[f"{task}_requests"] = total
        out.update({
            "conditioned_frames": sum(r.conditioned_frames for r in results),
            "frames": sum(r.frames for r in results),
            "mean_steps": float(np.mean([r.steps for r in results])),
            "mean_frame_ms": 1000.0 * mean_frame,
            "action_chunks_per_s": 1.0 / mean_frame,
            "action_horizon": self.model.config.action_horizon,
            "actions_executed_per_frame": self.runner.n_execute,
            "actions_per_s": self.runner.n_execute / mean_frame,
            "language_tokens_per_s": self.tokens / self.engine_s if self.engine_s else 0.0,
            "language_tokens": self.tokens,
        })
        return out


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
             k: int = 5, max_new_tokens: int = 24, out: Path | None = None, threads: int = 1,
             progress: bool = True, condition: bool = False, tasks: tuple[str, ...] = LANGUAGE_TASKS,
             execute: int | None = None) -> dict:
    """Run ``episodes`` seeded episodes; write JSON and the filmstrip of the first episode into ``out``
    (``eval_<mode>.json``, or ``eval_<mode>_subtask.json`` with subtask ``condition``-ing)."""
    from tqdm import tqdm

    torch.set_num_threads(threads)
    loop = ClosedLoop(Path(model_dir), mode, k, max_new_tokens, tasks=tasks, condition=condition, execute=execute)
    name = f"{mode}_subtask" if condition else mode
    results = [loop.run_episode(first_seed + i, record=i == 0)
               for i in tqdm(range(episodes), desc=f"evaluate ({name})", disable=not progress)]
    metrics = loop.metrics(results)
    metrics["per_episode"] = [{**{k: v for k, v in asdict(r).items() if k not in ("chunks", "film")},
                               "actions_sha1": actions_digest(r.chunks)} for r in results]
    metrics.update(model=_display_path(Path(model_dir)), k=k, max_new_tokens=max_new_tokens, first_seed=first_seed)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"eval_{name}.json").write_text(json.dumps(metrics, indent=2))
        r0 = results[0]
        title = (f"{r0.instruction} (seed {r0.seed}, {'success' if r0.success else 'failure'}, {mode} engine"
                 f"{', subtask-conditioned' if condition else ''})")
        metrics["filmstrip"] = str(save_filmstrip(r0.film, out / f"filmstrip_{name}.png", title))
    return metrics


def summary_line(m: dict) -> str:
    """One line: success, exact match per task (requests), speed."""
    lang = ", ".join(f"{t} {m[f'{t}_exact_match']:.1%} ({m[f'{t}_requests']})" for t in LANGUAGE_TASKS
                     if f"{t}_requests" in m)
    return (f"{m['mode']}{' +subtask' if m['subtask_conditioning'] else ''}: success {m['success_rate']:.1%} over "
            f"{m['episodes']} episodes; exact match {lang}; {m['action_chunks_per_s']:.1f} chunks/s "
            f"({m['actions_per_s']:.0f} actions/s), {m['language_tokens_per_s']:.0f} tokens/s")


def main(argv: list[str] | None = None) -> None:
    """CLI entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=TOY_MODEL_DIR, help="model directory")
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--mode", default="oxygen", choices=ENGINE_MODES)
    ap.add_argument("--first-seed", type=int, default=EVAL_FIRST_SEED)
    ap.add_argument("--k", type=int, default=5, help="per-frame decode budget (oxygen)")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--subtask", default="both", choices=("off", "on", "both"),
                    help="subtask conditioning of the action prompt")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--execute", type=int, help="actions of each chunk executed before the next frame (default: "
                    "the checkpoint's n_action_steps; at most the chunk)")
    ap.add_argument("--out", type=Path, default=Path("runs/eval_toy"), help="where the JSON and PNG go")
    a = ap.parse_args(argv)
    for condition in {"off": (False,), "on": (True,), "both": (False, True)}[a.subtask]:
        t0 = time.perf_counter()
        m = evaluate(a.model, a.episodes, a.mode, a.first_seed, a.k, a.max_new_tokens, a.out, a.threads,
                     condition=condition, execute=a.execute)
        print(f"{summary_line(m)} [{time.perf_counter() - t0:.0f} s] -> {a.out}")


if __name__ == "__main__":
    main()
