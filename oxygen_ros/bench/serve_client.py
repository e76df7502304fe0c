"""One benchmark client of ``oxygen-serve`` in its own process: a real ``openpi_client.WebsocketClientPolicy``
sending LIBERO-shaped observations (numpy only: no torch in this process).

Protocol with the parent (``serve_bench``): after connecting and one warm-up request it prints ``ready``, waits for
a line on stdin, sends ``--requests`` requests back to back and prints one JSON line: per request the send and
receive times, the server's timings and the actions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def observation(client: int, index: int) -> dict:
    """A LIBERO client's observation, different per client and request (224 x 224 cameras, as openpi's example)."""
    rng = np.random.default_rng(1000 * client + index + 1)
    return {"observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/state": rng.normal(size=8).astype(np.float32),
            "prompt": ["put the bowl on the plate", "open the top drawer", "turn on the stove"][client % 3]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--client", type=int, required=True)
    ap.add_argument("--requests", type=int, required=True)
    args = ap.parse_args()
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    policy = WebsocketClientPolicy("127.0.0.1", args.port)
    obs = [observation(args.client, i) for i in range(args.requests)]
    policy.infer({**observation(args.client, -1), "seed": args.client})  # warm-up (request 0), fixes the seed
    print("ready", flush=True)
    sys.stdin.readline()
    out = []
    for o in obs:
        t0 = time.time()
        r = policy.infer(o)
        t1 = time.time()
        out.append({"sent": t0, "received": t1, "server_ms": r["server_timing"]["infer_ms"],
                    "policy_ms": r["policy_timing"]["infer_ms"], "batch": r["oxygen"]["batch_size"],
                    "actions": np.asarray(r["actions"]).tolist()})
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
