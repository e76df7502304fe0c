"""launch/oxygen.launch.py's processes stopped and restarted: Ctrl-C of ``oxygen-launch`` exiting 0 (with and without
respawn), and ``respawn:=true`` bringing the node back after SIGKILL while the executor holds (the restart times of
docs/tasks.md). Helpers: launch_support.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import launch_support
import numpy as np
import pytest
from launch_support import (
    REPO,
    Listener,
    Recorder,
    including,
    launch_pytest,
    params_file,
    wait_for,
)

pytestmark = launch_support.MARKS
ros_environment, recorder = launch_support.ros_environment, launch_support.recorder  # the shared fixtures

from oxygen_ros.msg import ActionChunk  # noqa: E402

from oxygen_ros.testing import header_ns  # noqa: E402


# ---------------------------------------------------------------------------------------------- Ctrl-C
@pytest.mark.parametrize("extra", [[], ["respawn:=true", "respawn_delay:=0.5"]], ids=["plain", "respawn"])
def test_ctrl_c_of_oxygen_launch_exits_0(tmp_path: Path, extra: list[str]) -> None:
    """`oxygen-launch with_sim:=true` (the launch file found through the ament index, as `ros2 launch` finds it)
    in a terminal's process group: Ctrl-C (SIGINT to the group) stops node and simulator cleanly, exit code 0; with
    respawn:=true too (the node, which gets the SIGINT as well, is not restarted during the shutdown)."""
    log = tmp_path / "launch.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "oxygen_ros.tools.launch_file", "oxygen_ros",
                                 "oxygen.launch.py", "with_sim:=true", *extra], stdout=out, stderr=subprocess.STDOUT,
                                cwd=tmp_path, start_new_session=True)
    try:
        assert wait_for(lambda: "active:" in log.read_text(errors="replace") or proc.poll() is not None, 90), \
            log.read_text(errors="replace")
        assert proc.poll() is None, log.read_text(errors="replace")
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(30) == 0, log.read_text(errors="replace")
        assert time.monotonic() - t0 < 15
        text = log.read_text(errors="replace")
        assert text.count("process has finished cleanly") == 2 and "Traceback" not in text, text
        assert text.count("process started") == 2, text  # nothing respawned
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


# ---------------------------------------------------------------------------------------------- respawn
RESPAWN_KILLS = 3  # SIGKILLs of the node per run: the restart time is their median
RESTART_LIMIT_S = 40.0  # kill -> first new chunk, with respawn_delay 1 s (measured 5-9 s here: docs/tasks.md)
LIMITED = {"ee_x": 1.0, "ee_y": 1.0, "ee_z": 1.0}  # max_velocity per joint (the node and the executor share them)


@launch_pytest.fixture
def respawn_launch(recorder: Recorder, tmp_path: Path) -> Any:
    limits = {joint: {"max_velocity": v, "max_acceleration": 20.0} for joint, v in LIMITED.items()}
    config = params_file(tmp_path, REPO / "config" / "tabletop.yaml", limits=limits)
    return including(recorder, {"config_file": config, "with_sim": "true", "with_executor": "true",
                                "respawn": "true", "respawn_delay": "1.0"})


@pytest.mark.timeout(420)
@pytest.mark.launch(fixture=respawn_launch)
def test_respawn_after_sigkill(recorder: Recorder, ros_environment: int) -> None:
    """respawn:=true: SIGKILL the node (three times); each time launch restarts it, it configures and activates
    itself with the same parameters (the instruction latched by the simulator, the limits), and publishes chunks
    again within RESTART_LIMIT_S, none stamped before the kill. The executor holds meanwhile and moves within its
    limits after. The kill -> first new chunk times are printed (their median is in docs/tasks.md)."""
    from sensor_msgs.msg import JointState

    from oxygen_ros.ros.stamps import stamp_to_ns

    listener = Listener(ros_environment, "respawn_listener")
    chunks, commands = "/oxygen/action_chunk", "/oxygen_executor/command"
    listener.record(chunks, ActionChunk)
    listener.record(commands, JointState)
    received: list[tuple[float, int]] = []  # (monotonic receipt, stamp) of each chunk
    listener.node.create_subscription(ActionChunk, chunks, lambda m: received.append((time.monotonic(), header_ns(m))),
                                      50)
    setpoints: list[tuple[float, int, list[float]]] = []  # (monotonic receipt, stamp, positions)
    names: list[str] = []

    def on_command(msg: JointState) -> None:
        names[:] = list(msg.name)
        setpoints.append((time.monotonic(), stamp_to_ns(msg.header.stamp), list(msg.position)))

    listener.node.create_subscription(JointState, commands, on_command, 100)
    times: list[float] = []
    try:
        for kill in range(RESPAWN_KILLS):
            total, spawned, active = _kill_and_measure(recorder, received, setpoints, names)
            times.append(total)
            print(f"respawn {kill + 1}: kill -> first new chunk {total:.2f} s (process started after {spawned:.2f} s, "
                  f"active after {active:.2f} s)")
        print(f"kill -> first new chunk: median {float(np.median(times)):.2f} s over {times}")
        _cancel_holds_the_executor(listener, received, setpoints)
    finally:
        listener.close()


def _kill_and_measure(recorder: Recorder, received: list[tuple[float, int]],
                      setpoints: list[tuple[float, int, list[float]]], names: list[str]) -> tuple[float, float, float]:
    """SIGKILL the node once chunks and setpoints flow; check the restart, the guard and the executor; returns the
    seconds from the kill to the first chunk observed after it, to the new process, and to its activation."""
    assert wait_for(lambda: len(received) >= 5 and received[-1][0] > time.monotonic() - 1.0, 120), \
        recorder.text("oxygen_node")[-3000:]
    assert wait_for(lambda: len(setpoints) > 20, 60), recorder.text("oxygen_executor")[-3000:]
    pid = recorder.pids["oxygen_node"]
    actives = recorder.text("oxygen_node").count("active:")
    kill_ns, t_kill = time.time_ns(), time.monotonic()
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: recorder.pids["oxygen_node"] != pid, 30), "not respawned"
    t_spawn = time.monotonic()
    # (not recorder.wait_for_output: it stops at the killed process's exit code)
    assert wait_for(lambda: recorder.text("oxygen_node").count("active:") > actives, 90), \
        recorder.text("oxygen_node")[-3000:]
    t_active = time.monotonic()  # no chunk before this (a subscriber may discover the new publisher later)
    assert wait_for(lambda: any(t > t_kill and s > kill_ns for t, s in received), RESTART_LIMIT_S), \
        recorder.text("oxygen_node")[-3000:]
    t_first = min(t for t, s in received if t > t_kill and s > kill_ns)
    # chunks of the dead process still in delivery arrive within a few ms; nothing later is stamped before the kill
    stale = [(t - t_kill, (s - kill_ns) / 1e9) for t, s in received if t > t_kill + 0.5 and s <= kill_ns]
    assert not stale, stale
    # the executor held: once the old plan ran out (a chunk lasts < 1 s), the setpoint stays where it is
    held = [p for t, _, p in setpoints if t_kill + 1.5 < t < t_active - 0.2]
    assert len(held) >= 5, (len(held), t_active - t_kill)
    assert np.ptp(np.array(held), axis=0).max() < 1e-9, np.ptp(np.array(held), axis=0)
    # ... then follows the new chunks within its limits. The simulator executes the node's chunks itself (the
    # executor's setpoints go nowhere here), so the executor's first setpoint after the hold starts from the
    # measured joint state (one limited step from rest there, docs/executor.md): that one re-anchoring step is
    # not a velocity, every later one is within the limits
    # (the executor discovers the new node's publisher on its own, up to a few seconds after this test's listener)
    def moves() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        after = [(s, p) for t, s, p in setpoints[:] if t > t_active - 0.2]
        stamps, pos = np.array([s for s, _ in after]) / 1e9, np.array([p for _, p in after])
        if len(after) < 2:
            return stamps, pos, np.zeros(0, dtype=int)
        return stamps, pos, np.flatnonzero(np.abs(np.diff(pos, axis=0)).max(axis=1) > 1e-9)

    assert wait_for(lambda: moves()[2].size > 10, 30), "the executor follows the new chunks"
    stamps, pos, moved = moves()
    steps = slice(moved[0] + 1, None)
    speed = (np.abs(np.diff(pos, axis=0)) / np.maximum(np.diff(stamps), 1e-6)[:, None])[steps]
    for joint, limit in LIMITED.items():
        assert speed[:, names.index(joint)].max() <= limit * 1.05 + 1e-6, (joint, speed.max(axis=0))
    return t_first - t_kill, t_spawn - t_kill, t_active - t_kill


def _cancel_holds_the_executor(listener: Listener, received: list[tuple[float, int]],
                               setpoints: list[tuple[float, int, list[float]]]) -> None:
    """A ~/run goal on the respawned node, then a cancel: no chunk is published after the cancel is accepted, and the
    executor holds (its plan runs out, the setpoint stays)."""
    from oxygen_ros.action import RunTask
    from rclpy.action import ActionClient

    client = ActionClient(listener.node, RunTask, "/oxygen/run")
    assert client.wait_for_server(timeout_sec=30)
    feedback: list[Any] = []
    sent = client.send_goal_async(RunTask.Goal(instruction="put the red block on the blue plate", success="external",
                                               timeout_s=60.0), feedback_callback=lambda m: feedback.append(m.feedback))
    assert wait_for(sent.done, 20) and sent.result().accepted
    assert wait_for(lambda: feedback and feedback[-1].chunks >= 3, 30), feedback[-1:]
    cancel = sent.result().cancel_goal_async()
    assert wait_for(cancel.done, 10) and cancel.result().goals_canceling
    t_cancel, cancel_ns = time.monotonic(), time.time_ns()
    time.sleep(3.0)
    late = [(t - t_cancel, (s - cancel_ns) / 1e9) for t, s in received if t > t_cancel]
    # one published before the acceptance may still be in delivery; none observed after it, none later
    assert all(s < 0 for _, s in late) and all(t < 0.5 for t, _ in late), late
    held = [p for t, _, p in setpoints if t > t_cancel + 1.5]
    assert len(held) >= 10 and np.ptp(np.array(held), axis=0).max() < 1e-9, np.ptp(np.array(held), axis=0)
