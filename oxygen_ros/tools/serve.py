"""``oxygen-serve``: a drop-in for openpi's ``scripts/serve_policy.py``: a pi0.5 checkpoint served over openpi's
websocket protocol, to any number of ``openpi_client.WebsocketClientPolicy`` clients at once.

    oxygen-serve --checkpoint /models/pi05_libero --tokenizer-path /models/paligemma_tokenizer.model
    oxygen-serve --config config/libero.yaml --checkpoint /models/pi05_libero --port 8000 --api-key secret
    oxygen-serve --checkpoint ckpt --language-streams memory --stream memory.every_n_frames=2
    oxygen-serve --protocol lerobot --checkpoint /models/pi05_so101 --port 8080 --api-key secret \
        --tls-cert server.pem --tls-key server.key --language-log language.jsonl
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence

from oxygen_ros.policy import PolicyConfigError
from oxygen_ros.serve.lerobot_async.server import LeRobotServer
from oxygen_ros.serve.options import build_server, parse


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until interrupted; 2 on a configuration error."""
    args = parse(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        server = build_server(args)
    except (ValueError, FileNotFoundError, PolicyConfigError) as e:
        print(f"oxygen-serve: {e}", file=sys.stderr)
        return 2
    if isinstance(server, LeRobotServer):
        port = server.start()
        print(f"oxygen-serve: LeRobot async inference listening on {args.host}:{port}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.wait()
        server.stop()
        return 0
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(server.serve_forever(lambda port: print(f"oxygen-serve: listening on {args.host}:{port}",
                                                             flush=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
