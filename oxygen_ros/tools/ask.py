"""``oxygen-ask``: ask a running oxygen node a question over its ``~/ask`` action and print the answer as it is
decoded (``ros2 action send_goal --feedback /oxygen/ask oxygen_ros/action/Ask "{question: ...}"`` where ros2cli
is installed; this works from the venv too).

    oxygen-ask "where is the red block?"
    oxygen-ask --node /robot1/oxygen --max-new-tokens 12 "what is in the gripper?"
    oxygen-ask --task subtask ""          # the subtask stream's output for the current observation, now
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Send one goal, print each feedback line and the result; 0 when it succeeded."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("question", help="the question ('' with --task or --prompt)")
    ap.add_argument("--node", default="/oxygen", help="the node's name with namespace (default /oxygen)")
    ap.add_argument("--task", default="", help="request task ('' = answer)")
    ap.add_argument("--prompt", default="", help="raw prompt instead of the question template")
    ap.add_argument("--max-new-tokens", type=int, default=0, help="0 = the node's ask.max_new_tokens")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the server and the answer")
    args = ap.parse_args(argv)

    import rclpy

    from oxygen_ros.action import Ask

    from .action_client import client_node, connect, send_goal

    with client_node("oxygen_ask") as node:
        client = connect(node, Ask, args.node, "ask", args.timeout)
        if client is None:
            return 2
        goal = Ask.Goal(question=args.question, task=args.task, prompt=args.prompt,
                        max_new_tokens=max(args.max_new_tokens, 0))
        deadline = time.monotonic() + args.timeout
        handle = send_goal(node, client, goal, lambda fb: print(
            f"  [{fb.feedback.frames} frames, {fb.feedback.tokens} tokens] {fb.feedback.text}", flush=True),
            args.timeout)
        if handle is None:
            print("goal rejected (see the node's log: inactive, empty or too long, too many pending)", file=sys.stderr)
            return 1
        done = handle.get_result_async()
        rclpy.spin_until_future_complete(node, done, timeout_sec=max(deadline - time.monotonic(), 0.1))
        if not done.done():
            handle.cancel_goal_async()
            print("no answer in time; goal canceled", file=sys.stderr)
            return 1
        result = done.result().result
        if result.error:
            print(f"aborted: {result.error}", file=sys.stderr)
            return 1
        stamp = result.observation_stamp
        print(f"{result.text}\n(observation {stamp.sec}.{stamp.nanosec:09d}, {result.latency_frames} frames, "
              f"{1e3 * result.latency_s:.0f} ms, request {result.request_id})")
        return 0


if __name__ == "__main__":
    sys.exit(main())
