"""Real-time chunking on LeRobot's async path in closed loop: the tabletop world through
``oxygen-serve --protocol lerobot`` by a RobotClient-shaped loop, ``latest_only`` / ``weighted_average`` / ``rtc``
(docs/benchmarks.md). Writes ``results.json``, ``table.md`` and ``plot.png``.

    python -m oxygen_ros.bench.lerobot_rtc_loop --episodes 20 --delays 1 2 3 [--out runs/lerobot_async_rtc]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import grpc
import numpy as np
import torch

from oxygen_ros.policy import load_policy
from oxygen_ros.policy.rtc import RTCSchedule
from oxygen_ros.policy.shipped_model import TOY_MODEL_DIR
from oxygen_ros.serve.lerobot_async.payloads import RemotePolicyConfig, TimedAction, TimedObservation
from oxygen_ros.serve.lerobot_async.pickler import dumps
from oxygen_ros.serve.lerobot_async.proto import services_pb2
from oxygen_ros.serve.lerobot_async.server import LeRobotServer
from oxygen_ros.serve.lerobot_async.service import AsyncInferenceStub
from oxygen_ros.serve.lerobot_async.unpickler import loads
from oxygen_ros.serve.options import build_server, parse
from oxygen_ros.toy.train.evaluate import EVAL_FIRST_SEED
from oxygen_ros.toy.train.policy import episode_noise
from oxygen_ros.toy.train.rtc_eval import EpisodeTrace, markdown_table, plot, summarize
from oxygen_ros.toy.world import CAMERAS, JOINT_NAMES, TabletopWorld, WorldConfig
from oxygen_ros.toy.world.delayed import DelayedExecutor

__all__ = ["STRATEGIES", "run"]

STRATEGIES = {"latest_only": ("off", "replace"), "weighted_average": ("off", "weighted_average"),
              "rtc": ("on", "replace")}
CHUNK = 2 * 1024 * 1024  # LeRobot's send_bytes_in_chunks


def _messages(data: bytes) -> list:
    pieces = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]
    return [services_pb2.Observation(data=p, transfer_state=services_pb2.TRANSFER_END if i == len(pieces) - 1 else
                                     services_pb2.TRANSFER_BEGIN if i == 0 else services_pb2.TRANSFER_MIDDLE)
            for i, p in enumerate(pieces)]


class _Loop:
    def __init__(self, model: Path, rtc: str, dt_s: float) -> None:
        self.server: LeRobotServer = build_server(parse([
            "--protocol", "lerobot", "--checkpoint", str(model), "--host", "127.0.0.1", "--port", "0",
            "--kernels", "plain", "--request-every-n-frames", "0", "--lerobot-rtc", rtc, "--fps", str(1 / dt_s),
            "--obs-queue-timeout", "30", "--batch-window-ms", "0"]))
        self.seed = self.frame = 0
        policy = self.server.pool.policy
        h, a = policy.spec.chunk_size, policy.model.config.action_dim
        self.server.noise_for = lambda _client, _step: episode_noise(self.seed, self.frame, h, a).numpy()
        self.port = self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = AsyncInferenceStub(self.channel)
        features = {"observation.state": {"dtype": "float32", "shape": (len(JOINT_NAMES),),
                                          "names": list(JOINT_NAMES)}}
        features |= {f"observation.images.{c}": {"dtype": "image", "shape": (0, 0, 3)} for c in CAMERAS}
        self.config = RemotePolicyConfig("pi05", str(model), features, h)

    def close(self) -> None:
        self.channel.close()
        self.server.stop()

    def episode(self, world: TabletopWorld, delay: int, blend: str, seed: int, period: int) -> EpisodeTrace:
        ex = DelayedExecutor(world, delay, period, blend)
        obs = ex.reset(seed)
        self.stub.Ready(services_pb2.Empty())  # a new session: nothing to continue
        self.stub.SendPolicyInstructions(services_pb2.PolicySetup(data=dumps(self.config)))
        self.seed, self.frame = seed, 0
        chunks, frame_s = [], []
        while not ex.done:
            raw = {name: float(v) for name, v in zip(JOINT_NAMES, obs.state, strict=True)}
            raw |= {c: obs.images[c] for c in CAMERAS} | {"task": obs.instruction}
            t0 = time.perf_counter()
            self.stub.SendObservations(iter(_messages(dumps(TimedObservation(time.time(), ex.observed_at, raw,
                                                                             True)))))
            actions = loads(self.stub.GetActions(services_pb2.Empty(), timeout=120).data)
            frame_s.append(time.perf_counter() - t0)
            assert all(isinstance(x, TimedAction) for x in actions)
            assert [x.timestep for x in actions] == list(range(ex.observed_at, ex.observed_at + len(actions)))
            chunk = np.stack([x.action.numpy() for x in actions]).astype(np.float64)
            chunks.append(chunk)
            obs = ex.execute(chunk)
            self.frame += 1
        client = next(iter(self.server._clients.values()))
        guided = client.session.runner.remainder_counts["timing_rule"]
        jumps = np.array([s.jump for s in ex.switches]).reshape(len(ex.switches), -1)
        return EpisodeTrace(seed, world.success, world.steps, len(chunks), guided, [delay] * guided, jumps,
                            np.array(ex.commanded), chunks, frame_s)


def run(model: Path, delays: list[int], seeds: list[int], strategies: list[str], period: int = 2,
        dt_s: float = 0.05) -> tuple[list[dict], object]:
    """One summary row per (delay, strategy), every strategy on the same seeds; and the RTC settings used."""
    from tqdm import tqdm

    rows = []
    loops = {rtc: _Loop(model, rtc, dt_s) for rtc in {STRATEGIES[s][0] for s in strategies}}
    try:
        policy = next(iter(loops.values())).server.pool.policy
        world = TabletopWorld(WorldConfig(image_size=policy.model.config.vision.image_size))
        bar = tqdm(total=len(delays) * len(strategies) * len(seeds), desc="lerobot async rtc")
        for d in delays:
            for name in strategies:
                rtc, blend = STRATEGIES[name]
                loop = loops[rtc]
                if loop.server.pool.rtc is not None:  # the delay RTC assumes: fixed to d (the world's is d)
                    loop.server.pool.rtc = RTCSchedule(loop.server.pool.rtc.config, dt_s, d)
                traces = []
                for seed in seeds:
                    traces.append(loop.episode(world, d, blend, seed, period))
                    bar.update()
                rows.append({"strategy": name, "delay": d, **summarize(traces, dt_s)})
        bar.close()
        rtc_config = loops["on"].server.pool.rtc.config if "on" in loops else None
    finally:
        for loop in loops.values():
            loop.close()
    return rows, rtc_config


def main(argv: list[str] | None = None) -> None:
    """CLI entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=TOY_MODEL_DIR)
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=EVAL_FIRST_SEED)
    ap.add_argument("--delays", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("runs/lerobot_async_rtc"))
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    seeds = list(range(a.first_seed, a.first_seed + a.episodes))
    t0 = time.perf_counter()
    rows, rtc = run(a.model, a.delays, seeds, a.strategies)
    horizon = load_policy(a.model).spec.chunk_size
    result = {"model": str(a.model), "horizon": horizon, "period": 2, "dt_s": 0.05, "threads": a.threads,
              "transport": "oxygen-serve --protocol lerobot over gRPC on 127.0.0.1, LeRobot's payloads",
              "delay_estimate": "fixed (--rtc-delay d)", "rtc": None if rtc is None else rtc.__dict__,
              "first_seed": a.first_seed, "episodes": a.episodes, "host_date": time.strftime("%Y-%m-%d"),
              "wall_s": time.perf_counter() - t0, "rows": rows}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    table = markdown_table(rows, horizon)
    (a.out / "table.md").write_text(table + "\n")
    plot(rows, a.out / "plot.png", horizon)
    print(table)
    print(f"[{result['wall_s']:.0f} s] -> {a.out}")


if __name__ == "__main__":
    main()
