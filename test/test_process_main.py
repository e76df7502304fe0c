"""The one process main (:func:`oxygen_ros.ros.process.run_node`) that the node, the executor and the simulator
share, each case in a child process (it owns the signal handlers): the order of the shutdown hooks, the exit status
of a clean stop by SIGINT / SIGTERM / ``finished``, of an executor failure and of invalid parameters."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from conftest import require_ros, ros_domain

require_ros(messages=False)

from oxygen_ros.testing import ros_env  # noqa: E402

DOMAIN = ros_domain()
SCRIPT = """
import sys
from rclpy.node import Node
from oxygen_ros.ros.process import run_node

case = sys.argv[1]

class Toy(Node):
    def __init__(self):
        if case == "config":
            raise ValueError("bad parameter x")
        super().__init__("toy")
        self.ticks = 0
        self.create_timer(0.05, self.tick)

    def tick(self):
        self.ticks += 1
        if self.ticks == 3:
            print("ready", flush=True)
        if case == "fail" and self.ticks == 3:
            raise RuntimeError("callback failed")

rc = run_node(Toy, args=sys.argv[:1], help_text="toy help", config_errors=(ValueError,), name="toy",
              finished=(lambda n: n.ticks >= 5) if case == "finished" else None,
              on_stop=lambda n: print("on_stop", n.context.ok(), flush=True),
              on_stopped=lambda n: print("on_stopped", flush=True))
print("exit", rc, flush=True)
sys.exit(rc)
"""


def run(case: str, sig: int | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, case], env=ros_env(DOMAIN), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if sig is not None:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"  # spinning: the timer ran
        time.sleep(0.2)
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_it_cleanly_with_the_hooks_in_order(sig: int) -> None:
    done = run("spin", sig)
    assert done.returncode == 0, done.stderr
    # on_stop runs while the context is still up (the executor's loop stops before the executor), on_stopped after
    assert done.stdout.split("\n")[:3] == ["on_stop True", "on_stopped", "exit 0"], done.stdout


def test_finished_ends_it_and_a_failing_callback_exits_1_after_the_same_shutdown() -> None:
    done = run("finished")
    assert done.returncode == 0 and done.stdout.split()[-2:] == ["exit", "0"], (done.stdout, done.stderr)
    failed = run("fail")
    assert failed.returncode == 1, failed.stdout
    assert "on_stopped" in failed.stdout and "RuntimeError: callback failed" in failed.stderr


def test_invalid_parameters_exit_2_and_help_exits_0() -> None:
    bad = run("config")
    assert bad.returncode == 2 and "toy: bad parameter x" in bad.stderr, (bad.stdout, bad.stderr)
    shown = subprocess.run([sys.executable, "-c", SCRIPT.replace("args=sys.argv[:1]", "args=sys.argv[:1] + ['-h']"),
                            "spin"], env=ros_env(DOMAIN), capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout.startswith("toy help"), shown.stderr
