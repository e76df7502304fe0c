"""launch/oxygen.launch.py run for real: launch_pytest tests that start the launch file's processes over DDS.

Needs launch, launch_ros and launch_pytest (not on PyPI): `make setup` installs them from ../shared/ros2_launch when
that folder exists (ROS2_LAUNCH_DIR), on a ROS 2 distro they come from the distro; elsewhere this module skips.
Each launch test has its own launch service (function-scoped fixtures), its own ROS domain, discovery on localhost
only, and a time-out of its own (pytest-timeout): a launch that fails before ReadyToTest cannot hang the run.

Covered here: the default bring-up (and the DDS profile in the node's environment), ``with_sim:=true`` completing a
task, ``namespace`` + the trajectory remap, the file included under ``PushRosNamespace`` closing the loop,
``with_sim`` + ``use_sim_time`` on the simulator's clock, ``use_sim_time`` following a bag replay's /clock,
``autostart:=false`` driven by an external lifecycle client and ``checkpoint_path`` replacing the config's embedded
model.
The launch file read without processes: test_launch_file.py; Ctrl-C and respawn: test_launch_respawn.py; the shared
helpers and fixtures: launch_support.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import launch_support
import pytest
from launch_support import (
    CAMERAS,
    JOINTS,
    SIM_JOINTS,
    Listener,
    Recorder,
    assert_clean_exit,
    including,
    launch_pytest,
    params_file,
    wait_for,
)

pytestmark = launch_support.MARKS
ros_environment, recorder = launch_support.ros_environment, launch_support.recorder  # the shared fixtures

from ament_index_python.packages import get_package_share_directory  # noqa: E402
from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetState  # noqa: E402
from oxygen_ros.msg import ActionChunk  # noqa: E402

from oxygen_ros.ros.dds import profile_env_var  # noqa: E402
from oxygen_ros.testing import Probe, header_ns  # noqa: E402
from oxygen_ros.testing.services import call, change_state  # noqa: E402


# ---------------------------------------------------------------------------------------------- bring-up
@launch_pytest.fixture
def default_launch(recorder: Recorder) -> Any:
    return including(recorder, {})


@pytest.mark.launch(fixture=default_launch)
def test_default_bringup_serves_chunks_and_exits_cleanly(recorder: Recorder, ros_environment: int) -> Iterator[None]:
    """No arguments: config/tabletop.yaml (the toy model) found through the package share, the DDS profile in the
    node's environment, chunks for the probe's frames; SIGINT at shutdown exits 0."""
    assert recorder.wait_for_output("oxygen_node", lambda out: "active:" in out, 60), recorder.text("oxygen_node")
    environ = dict(entry.split("=", 1) for entry in Path(f"/proc/{recorder.pids['oxygen_node']}/environ")
                   .read_text().split("\0") if "=" in entry)
    profile = Path(get_package_share_directory("oxygen_ros")) / "config" / "fastdds.xml"
    var = profile_env_var()  # the name this Fast DDS reads (2.x on Jazzy's wheels: FASTRTPS_...)
    assert Path(environ.get(var, "")).resolve() == profile.resolve(), environ.get(var)
    probe = Probe(CAMERAS, SIM_JOINTS, node="/oxygen", domain_id=ros_environment, name="bringup_probe")
    try:
        assert probe.wait_for_subscribers(30)
        probe.start_stream(10.0)
        probe.wait_for(lambda: probe.instruction_pub.get_subscription_count() > 0, 10)
        probe.publish_instruction("put the red block on the blue plate")
        assert probe.wait_for(lambda: len(probe.chunks()) >= 3, 30), (probe.diagnostics(), recorder.text("oxygen_node"))
        assert list(probe.chunks()[-1].joint_names) == SIM_JOINTS
        assert probe.wait_for(lambda: probe.diagnostics().get("state") == "active", 10), probe.diagnostics()
    finally:
        probe.close()
    yield
    assert_clean_exit(recorder, "oxygen_node")


@launch_pytest.fixture
def namespaced_launch(recorder: Recorder, tmp_path: Path) -> Any:
    return including(recorder, {"config_file": params_file(tmp_path, publish_trajectory=True, control_rate_hz=5.0),
                                "namespace": "launch_test",
                                "trajectory_topic": "/launch_test/controller/joint_trajectory"})


@pytest.mark.launch(fixture=namespaced_launch)
def test_namespace_and_trajectory_remap(recorder: Recorder, ros_environment: int) -> None:
    """namespace:= moves the node and its relative inputs; ~/trajectory goes where trajectory_topic says."""
    assert recorder.wait_for_output("oxygen_node", lambda out: "active:" in out, 60), recorder.text("oxygen_node")
    assert "/launch_test/oxygen/action_chunk" in recorder.text("oxygen_node")
    probe = Probe(CAMERAS, JOINTS, node="/launch_test/oxygen", domain_id=ros_environment, inputs_ns="launch_test",
                  trajectory_topic="/launch_test/controller/joint_trajectory", name="namespace_probe")
    try:
        assert probe.wait_for_subscribers(30)
        probe.start_stream(10.0)
        probe.wait_for(lambda: probe.instruction_pub.get_subscription_count() > 0, 10)
        probe.publish_instruction("put the red block on the blue plate")
        assert probe.wait_for(lambda: len(probe.chunks()) >= 2, 30), (probe.diagnostics(), recorder.text("oxygen_node"))
        assert list(probe.chunks()[-1].joint_names) == JOINTS
        assert probe.wait_for(lambda: len(probe.trajectories()) >= 1, 10)
        points = probe.trajectories()[-1].points
        assert points and (points[0].time_from_start.sec, points[0].time_from_start.nanosec) > (0, 0)
    finally:
        probe.close()


# ---------------------------------------------------------------------------------------------- closed loop
def _closed_loop(recorder: Recorder, domain: int, prefix: str, timeout: float = 60.0) -> list[ActionChunk]:
    """Wait for a successful episode on ``<prefix>/tabletop_sim/events``; returns the chunks seen meanwhile."""
    listener = Listener(domain)
    events, chunks = f"{prefix}/tabletop_sim/events", f"{prefix}/oxygen/action_chunk"
    listener.record(events)
    listener.record(chunks, ActionChunk)
    try:
        done = wait_for(lambda: any(e.get("event") == "episode" and e.get("success")
                                    for e in listener.events(events)), timeout)
        assert done, (listener.events(events), recorder.text("tabletop_sim")[-2000:],
                      recorder.text("oxygen_node")[-2000:])
        assert wait_for(lambda: listener.messages(chunks), 10), [
            (i.node_name, i.qos_profile) for i in listener.node.get_publishers_info_by_topic(chunks)]
        return listener.messages(chunks)
    finally:
        listener.close()


@launch_pytest.fixture
def sim_launch(recorder: Recorder) -> Any:
    return including(recorder, {"with_sim": "true"})


@pytest.mark.launch(fixture=sim_launch)
def test_with_sim_completes_a_task(recorder: Recorder, ros_environment: int) -> Iterator[None]:
    """The launch default (config/tabletop.yaml, the toy model) plus the simulator: a task is completed, and both
    processes exit 0 on SIGINT."""
    assert _closed_loop(recorder, ros_environment, "")
    yield
    assert_clean_exit(recorder, "oxygen_node", "tabletop_sim")


@launch_pytest.fixture
def pushed_namespace_launch(recorder: Recorder) -> Any:
    return including(recorder, {"with_sim": "true"}, namespace="robot1")


@pytest.mark.launch(fixture=pushed_namespace_launch)
def test_included_under_push_ros_namespace_closes_the_loop(recorder: Recorder, ros_environment: int) -> None:
    """Included under PushRosNamespace('robot1'): node and simulator both live under /robot1 and still close the
    loop (cameras, joints, instruction, chunks, language by relative names)."""
    chunks = _closed_loop(recorder, ros_environment, "/robot1")
    assert chunks
    assert "/robot1/oxygen/action_chunk" in recorder.text("oxygen_node")


@launch_pytest.fixture
def sim_time_launch(recorder: Recorder) -> Any:
    return including(recorder, {"with_sim": "true", "use_sim_time": "true"})


@pytest.mark.launch(fixture=sim_time_launch)
def test_with_sim_and_use_sim_time_run_on_the_simulators_clock(recorder: Recorder, ros_environment: int) -> None:
    """with_sim + use_sim_time: the simulator publishes /clock (simulated time from 1 s) and the node follows it;
    without that clock the node would wait forever."""
    chunks = _closed_loop(recorder, ros_environment, "")
    stamps = [header_ns(c) for c in chunks]
    assert stamps and all(0 < s < 10**12 for s in stamps), stamps[:5]  # simulated seconds, not the wall clock


# ---------------------------------------------------------------------------------------------- sim time, bags
@launch_pytest.fixture
def bag_time_launch(recorder: Recorder, tmp_path: Path) -> Any:
    config = params_file(tmp_path, control_rate_hz=5.0, max_new_tokens=4, k=2, max_image_age_s=0.5)
    return including(recorder, {"config_file": config, "use_sim_time": "true"})


@pytest.mark.launch(fixture=bag_time_launch)
def test_use_sim_time_follows_a_bag_replay(recorder: Recorder, ros_environment: int, tmp_path: Path) -> None:
    """use_sim_time:=true and a bag replayed with /clock: every chunk is stamped with a bag observation time (the
    bag is years in the past, so chunks exist only because the node's clock follows /clock)."""
    from oxygen_ros.evaluation.demo_bag import START_TIME_NS, make_demo_bag
    from oxygen_ros.evaluation.replay import BagReplayer

    bag = make_demo_bag(tmp_path / "bag", duration_s=6.0, rate_hz=10.0, cameras=[c for c, _ in CAMERAS], size=48,
                        joint_names=JOINTS, progress=False)
    bag_stamps = {START_TIME_NS + k * 100_000_000 for k in range(60)}
    assert recorder.wait_for_output("oxygen_node", lambda out: "active:" in out, 60), recorder.text("oxygen_node")
    probe = Probe(CAMERAS, JOINTS, domain_id=ros_environment, name="bag_probe")
    try:
        assert probe.wait_for_subscribers(30)
        with BagReplayer(bag, clock=True, context=probe.context, wait_for_subscribers=5.0) as player:
            stats = player.run(max_duration=15.0)
        assert not stats.interrupted and stats.clock_published > 0
        assert probe.wait_for(lambda: len(probe.chunks()) >= 5, 10), (len(probe.chunks()), recorder.text("oxygen_node"))
        chunks = probe.chunks()
        assert all(header_ns(c) in bag_stamps for c in chunks), [header_ns(c) - START_TIME_NS for c in chunks]
    finally:
        probe.close()


# ---------------------------------------------------------------------------------------------- lifecycle
@launch_pytest.fixture
def manual_lifecycle_launch(recorder: Recorder, tmp_path: Path) -> Any:
    return including(recorder, {"config_file": params_file(tmp_path, control_rate_hz=5.0), "autostart": "false"})


@pytest.mark.launch(fixture=manual_lifecycle_launch)
def test_autostart_false_is_driven_by_a_lifecycle_client(recorder: Recorder, ros_environment: int) -> None:
    """autostart:=false: the node waits unconfigured; an external client configures and activates it (chunks
    flow), then deactivates it (chunks stop) through lifecycle_msgs services."""
    probe = Probe(CAMERAS, JOINTS, node="/oxygen", domain_id=ros_environment, name="lifecycle_probe")

    get = probe.node.create_client(GetState, "/oxygen/get_state")
    change_client = probe.node.create_client(ChangeState, "/oxygen/change_state")

    def state() -> str:
        return call(get, GetState.Request(), 30).current_state.label

    def change(transition: int) -> bool:
        return change_state(change_client, get, transition, 60)

    try:
        assert state() == "unconfigured", recorder.text("oxygen_node")
        probe.start_stream(10.0)
        probe.publish_instruction("put the red block on the blue plate")
        time.sleep(1.0)
        assert probe.chunks() == []  # nothing before activation
        assert change(Transition.TRANSITION_CONFIGURE) and state() == "inactive", recorder.text("oxygen_node")
        assert change(Transition.TRANSITION_ACTIVATE) and state() == "active", recorder.text("oxygen_node")
        assert probe.wait_for(lambda: len(probe.chunks()) >= 2, 30), (probe.diagnostics(), recorder.text("oxygen_node"))
        assert change(Transition.TRANSITION_DEACTIVATE) and state() == "inactive"
        time.sleep(1.0)  # a chunk already in flight may still arrive (delivery on a busy host)
        since = time.monotonic()
        time.sleep(1.5)
        assert probe.chunks(since) == []
    finally:
        probe.close()


# ---------------------------------------------------------------------------------------------- checkpoint_path
@launch_pytest.fixture
def missing_checkpoint_launch(recorder: Recorder, tmp_path: Path) -> Any:
    return including(recorder, {"checkpoint_path": str(tmp_path / "no_such_checkpoint")})


@pytest.mark.launch(fixture=missing_checkpoint_launch)
def test_checkpoint_path_replaces_the_embedded_model(recorder: Recorder, tmp_path: Path) -> None:
    """config/tabletop.yaml says model: toy; checkpoint_path:= replaces it: the node tries to load that path, and one
    that does not exist makes configure fail with an error naming it (neither the toy model nor a conflict)."""
    missing = str(tmp_path / "no_such_checkpoint")
    assert recorder.wait_for_output("oxygen_node", lambda out: "configure failed" in out, 60), \
        recorder.text("oxygen_node")
    out = recorder.text("oxygen_node")
    assert f"configure failed: checkpoint_path: {missing} does not exist" in out, out
    assert "configured in" not in out and "toy/model" not in out, out
