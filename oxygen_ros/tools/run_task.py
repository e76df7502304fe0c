"""``oxygen-run``: give a running oxygen node a task over its ``~/run`` action, print the feedback and the outcome;
Ctrl-C cancels the task (the robot holds). The same with ros2cli:
``ros2 action send_goal --feedback /oxygen/run oxygen_ros/action/RunTask "{instruction: ..., timeout_s: 60.0}"``.

    oxygen-run "put the red block on the blue plate"                 # until the subtask stream says done
    oxygen-run --timeout 30 --success external "wipe the table"       # until the time-out (or Ctrl-C)
    oxygen-run --success pattern --stream narration --pattern "on the .* plate" "put the red block on the blue plate"
    oxygen-run --on-end continue --node /robot1/oxygen "open the drawer"
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

EXIT_CODES = {"succeeded": 0, "timed_out": 3, "canceled": 4, "aborted": 1, "rejected": 2}


def main(argv: Sequence[str] | None = None) -> int:
    """Send one goal, print one line per feedback (at most ``--every`` frames apart) and the result. Exit code: 0
    succeeded, 3 timed out, 4 canceled, 1 aborted, 2 rejected or no server."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("instruction", help="the task")
    ap.add_argument("--node", default="/oxygen", help="the node's name with namespace (default /oxygen)")
    ap.add_argument("--timeout", type=float, default=0.0, help="seconds the task may take (0 = none)")
    ap.add_argument("--success", default="subtask_done", choices=("subtask_done", "external", "pattern"))
    ap.add_argument("--stream", default="", help="--success pattern: the language stream matched")
    ap.add_argument("--pattern", default="", help="--success pattern: a regular expression")
    ap.add_argument("--on-end", default="hold", choices=("hold", "continue"), help="after the task (default hold)")
    ap.add_argument("--every", type=int, default=5, help="print every n-th feedback (default 5)")
    ap.add_argument("--server-timeout", type=float, default=30.0, help="seconds to wait for the action server")
    args = ap.parse_args(argv)

    import rclpy

    from oxygen_ros.action import RunTask

    from .action_client import client_node, connect, send_goal

    with client_node("oxygen_run") as node:
        handle = None
        try:
            client = connect(node, RunTask, args.node, "run", args.server_timeout)
            if client is None:
                return 2
            goal = RunTask.Goal(instruction=args.instruction, timeout_s=args.timeout, success=args.success,
                                stream=args.stream, pattern=args.pattern, on_end=args.on_end)

            def show(msg) -> None:
                fb = msg.feedback
                if fb.frames % max(args.every, 1) == 0:
                    print(f"  {fb.elapsed_s:6.1f} s  {fb.frames:4d} frames  {fb.chunks:4d} chunks  {fb.gate}  "
                          f"subtask: {fb.subtask!r}  narration: {fb.narration!r}", flush=True)

            handle = send_goal(node, client, goal, show, args.server_timeout)
            if handle is None:
                print("goal not accepted (no response)", file=sys.stderr)
                return 2
            done = handle.get_result_async()
            while not done.done():  # no time limit here: the goal's own timeout_s bounds it
                rclpy.spin_once(node, timeout_sec=0.1)
            result = done.result().result
            print(f"{result.outcome}: {result.reason}\n({result.frames} frames, {result.chunks} chunks, "
                  f"{result.elapsed_s:.1f} s; last subtask {result.last_subtask!r}, memory {result.last_memory!r})")
            return EXIT_CODES.get(result.outcome, 1)
        except KeyboardInterrupt:
            if handle is not None and rclpy.ok():
                cancel = handle.cancel_goal_async()
                end = time.monotonic() + 5.0
                while not cancel.done() and time.monotonic() < end:
                    rclpy.spin_once(node, timeout_sec=0.1)
                print("canceled: the node holds", file=sys.stderr)
            return EXIT_CODES["canceled"]


if __name__ == "__main__":
    sys.exit(main())
