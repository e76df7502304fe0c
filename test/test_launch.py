"""launch_pytest tests of launch/oxygen.launch.py (for a robot or CI machine with ROS 2 installed and this package
built with colcon and sourced, so `oxygen_node` is found by package).

launch, launch_ros and launch_pytest are not installable from PyPI, so here the module skips; the same behaviour
(node starts, configures itself, publishes chunks over DDS, exits cleanly on SIGINT, remapped trajectory topic) is
covered by test_node_process.py, which starts the node as a plain process, and the closed loop of ``with_sim:=true``
(the toy model driving the simulator until tasks are done) by test_closed_loop_ros.py.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest

launch_pytest = pytest.importorskip(
    "launch_pytest", reason="launch_pytest is not installable from PyPI here; the same behaviour is covered by "
                            "test_node_process.py")
launch = pytest.importorskip("launch")
pytest.importorskip("launch_ros")

from launch.actions import IncludeLaunchDescription, SetEnvironmentVariable  # noqa: E402
from launch.launch_description_sources import PythonLaunchDescriptionSource  # noqa: E402
from launch_pytest.tools import process as process_tools  # noqa: E402

from oxygen_ros.testing import Probe  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
LAUNCH_FILE = REPO / "launch" / "oxygen.launch.py"
DEMO_CONFIG = str(REPO / "config" / "synthetic.yaml")
DOMAIN = 20 + (os.getpid() * 7 + 5) % 100
CAMERAS = [("base_0_rgb", "/cameras/base_0_rgb/image_raw"), ("left_wrist_0_rgb", "/cameras/left_wrist_0_rgb/image_raw")]
JOINTS = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
TRAJECTORY_TOPIC = "/launch_test/controller/joint_trajectory"
ENV = {"ROS_DOMAIN_ID": str(DOMAIN), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "PYTHONUNBUFFERED": "1",
       "RCUTILS_LOGGING_USE_STDOUT": "1", "RCUTILS_COLORIZED_OUTPUT": "0"}


def load_launch_module():
    """The launch file as a module (for its oxygen_node() helper)."""
    spec = importlib.util.spec_from_file_location("oxygen_launch", LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------- the node action
@pytest.fixture(scope="module")
def node_action():
    return load_launch_module().oxygen_node(
        config_file=DEMO_CONFIG, namespace="launch_test", trajectory_topic=TRAJECTORY_TOPIC,
        extra_parameters={"publish_trajectory": True, "control_rate_hz": 5.0},
        cached_output=True, additional_env=ENV, output="screen")


@launch_pytest.fixture(scope="module")
def launch_node(node_action):
    return launch.LaunchDescription([node_action, launch_pytest.actions.ReadyToTest()])


@pytest.mark.launch(fixture=launch_node)
def test_node_configures_activates_and_exits_cleanly(node_action, launch_context):
    def activated(output: str) -> bool:
        assert "configured in" in output and "active:" in output, output
        return True

    assert process_tools.wait_for_output_sync(launch_context, node_action, activated, timeout=60)
    assert "/launch_test/oxygen/action_chunk" in node_action.get_stdout()
    yield
    # after the launch service shut the node down (SIGINT)
    assert node_action.return_code == 0
    assert "Traceback" not in node_action.get_stdout()


@pytest.mark.launch(fixture=launch_node)
def test_namespaced_node_publishes_chunks_and_remapped_trajectories(node_action, launch_context):
    process_tools.wait_for_output_sync(launch_context, node_action, lambda out: "active:" in out, timeout=60)
    # camera topics in synthetic.yaml are absolute; joint_states and instruction are relative: under the namespace
    probe = Probe(CAMERAS, JOINTS, node="/launch_test/oxygen", domain_id=DOMAIN, inputs_ns="launch_test",
                  trajectory_topic=TRAJECTORY_TOPIC)
    try:
        assert probe.wait_for_subscribers(30)
        probe.start_stream(10.0)
        probe.wait_for(lambda: probe.instruction_pub.get_subscription_count() > 0, 10)
        probe.publish_instruction("put the red block on the blue plate")
        assert probe.wait_for(lambda: len(probe.chunks()) >= 3, 20), probe.diagnostics()
        chunk = probe.chunks()[-1]
        assert list(chunk.joint_names) == JOINTS and chunk.horizon > 0
        assert probe.wait_for(lambda: len(probe.trajectories()) >= 1, 5)
        points = probe.trajectories()[-1].points
        assert points[0].time_from_start.nanosec > 0 or points[0].time_from_start.sec > 0
    finally:
        probe.close()


# ---------------------------------------------------------------------------------------------- the launch file
@launch_pytest.fixture(scope="module")
def launch_file():
    return launch.LaunchDescription([
        *(SetEnvironmentVariable(name, value) for name, value in ENV.items()),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(str(LAUNCH_FILE)),
            launch_arguments={"config_file": DEMO_CONFIG, "use_sim_time": "false", "namespace": "",
                              "node_name": "oxygen_from_launch_file"}.items()),
        launch_pytest.actions.ReadyToTest(),
    ])


@pytest.mark.launch(fixture=launch_file)
def test_launch_file_brings_up_a_working_node(launch_context):
    probe = Probe(CAMERAS, JOINTS, node="/oxygen_from_launch_file", domain_id=DOMAIN, name="launch_file_probe")
    try:
        assert probe.wait_for_subscribers(60)
        probe.start_stream(10.0)
        probe.wait_for(lambda: probe.instruction_pub.get_subscription_count() > 0, 10)
        probe.publish_instruction("put the red block on the blue plate")
        assert probe.wait_for(lambda: len(probe.chunks()) >= 3, 20), probe.diagnostics()
        assert probe.wait_for(lambda: probe.diagnostics().get("state") == "active", 5)
    finally:
        probe.close()


@launch_pytest.fixture(scope="module")
def launch_closed_loop():
    return launch.LaunchDescription([
        *(SetEnvironmentVariable(name, value) for name, value in ENV.items()),
        IncludeLaunchDescription(PythonLaunchDescriptionSource(str(LAUNCH_FILE)),
                                 launch_arguments={"with_sim": "true", "node_name": "oxygen_closed_loop"}.items()),
        launch_pytest.actions.ReadyToTest(),
    ])


@pytest.mark.launch(fixture=launch_closed_loop)
def test_launch_with_sim_completes_a_task(launch_context):
    """The launch default (config/tabletop.yaml, the toy model) plus the simulator: a task is completed."""
    import json

    import rclpy
    from rclpy.context import Context
    from rclpy.node import Node
    from std_msgs.msg import String

    context = Context()
    rclpy.init(context=context, domain_id=DOMAIN)
    node = Node("closed_loop_listener", context=context)
    events: list[dict] = []
    node.create_subscription(String, "/tabletop_sim/events", lambda m: events.append(json.loads(m.data)), 10)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(e.get("success") for e in events):
            rclpy.spin_once(node, timeout_sec=0.2)
        assert any(e.get("event") == "episode" and e["success"] for e in events), events
    finally:
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def test_launch_arguments_are_declared():
    module = load_launch_module()
    names = [a[0] for a in module.ARGUMENTS]
    assert {"config_file", "checkpoint_path", "use_sim_time", "namespace", "with_sim"} <= set(names)
    ld = module.generate_launch_description()
    declared = {e.name for e in ld.entities if isinstance(e, launch.actions.DeclareLaunchArgument)}
    assert declared == set(names)
