"""What the launch tests share (test_launch.py, test_launch_file.py, test_launch_respawn.py): the skip when launch,
launch_ros and launch_pytest are missing, the per-test ROS environment (``ros_environment``, autouse in each module
that takes it over), the :class:`Recorder` of launched processes, a :class:`Listener` node, and the helpers that
include the launch file. Each launch test has its own launch service (function-scoped fixtures), its own ROS domain,
discovery on localhost only, and a time-out of its own (pytest-timeout): a launch that fails before ReadyToTest
cannot hang the run.

Needs launch, launch_ros and launch_pytest (not on PyPI): `make setup` installs them from ../shared/ros2_launch when
that folder exists (ROS2_LAUNCH_DIR), on a ROS 2 distro they come from the distro; elsewhere the modules that import
this one skip.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from conftest import require_ros, ros_domain

REASON = ("launch / launch_ros / launch_pytest are not installed (they are not on PyPI): `make setup` installs them "
          "from ../shared/ros2_launch (ROS2_LAUNCH_DIR) when that folder exists; on a ROS 2 distro source it")
launch_pytest = pytest.importorskip("launch_pytest", reason=REASON)
launch = pytest.importorskip("launch", reason=REASON)
pytest.importorskip("launch_ros.actions", reason=REASON + " (launch_ros.actions also needs composition_interfaces)")
require_ros()

import rclpy  # noqa: E402
from launch.actions import GroupAction, IncludeLaunchDescription, RegisterEventHandler  # noqa: E402
from launch.event_handlers import OnProcessExit, OnProcessIO, OnProcessStart  # noqa: E402
from launch.launch_description_sources import PythonLaunchDescriptionSource  # noqa: E402
from launch_ros.actions import PushRosNamespace  # noqa: E402
from rclpy.context import Context  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.node import Node  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from oxygen_ros.ros.dds import PROFILE_ENV_VARS  # noqa: E402

LAUNCH_TIMEOUT_S = 150  # per test: bring-up, the test, shutdown (a healthy one takes 10-30 s here)
MARKS = [pytest.mark.ros, pytest.mark.slow, pytest.mark.timeout(LAUNCH_TIMEOUT_S)]  # every launch test module's

REPO = Path(__file__).resolve().parents[1]
LAUNCH_FILE = REPO / "launch" / "oxygen.launch.py"
SYNTHETIC = REPO / "config" / "synthetic.yaml"
CAMERAS = [("base_0_rgb", "/cameras/base_0_rgb/image_raw"), ("left_wrist_0_rgb", "/cameras/left_wrist_0_rgb/image_raw")]
JOINTS = [f"joint_{i}" for i in range(1, 8)] + ["gripper"]
SIM_JOINTS = ["ee_x", "ee_y", "ee_z", "gripper"]  # config/tabletop.yaml (the launch default)


def venv_prefix() -> Path | None:
    """This interpreter's prefix when it is a venv holding oxygen_ros's ament index entry (make setup), else None."""
    prefix = Path(sys.prefix)
    marker = prefix / "share" / "ament_index" / "resource_index" / "packages" / "oxygen_ros"
    return prefix if sys.prefix != sys.base_prefix and marker.is_file() else None


@pytest.fixture(autouse=True)
def ros_environment(monkeypatch: pytest.MonkeyPatch) -> int:
    """What tools/ros_env.sh gives a shell (the venv first on AMENT_PREFIX_PATH and PATH), an isolated ROS domain,
    plain unbuffered logs, and no DDS profile from outside (the launch file's own default applies). The launch
    service runs in this process and its children inherit the environment. Returns the domain id."""
    domain = ros_domain()  # one ROS domain per test
    prefix = venv_prefix()
    if prefix is not None:
        for name, entry in (("AMENT_PREFIX_PATH", prefix), ("PATH", prefix / "bin")):
            rest = [p for p in os.environ.get(name, "").split(os.pathsep) if p and p != str(entry)]
            monkeypatch.setenv(name, os.pathsep.join([str(entry), *rest]))
    for name, value in {"ROS_DOMAIN_ID": str(domain), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
                        "PYTHONUNBUFFERED": "1", "RCUTILS_COLORIZED_OUTPUT": "0"}.items():
        monkeypatch.setenv(name, value)
    for name in PROFILE_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    return domain


def load_launch_module() -> ModuleType:
    """The launch file as a module (its ARGUMENTS and helpers)."""
    spec = importlib.util.spec_from_file_location("oxygen_launch", LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def params_file(tmp_path: Path, base: Path = SYNTHETIC, **overrides: Any) -> str:
    """A copy of a preset (its ``/**`` section) with ``overrides``, for the launch's config_file."""
    data = yaml.safe_load(base.read_text())
    data["/**"]["ros__parameters"].update(overrides)
    path = tmp_path / f"params_{base.stem}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


# ---------------------------------------------------------------------------------------------- helpers
class Recorder:
    """Records every launched process's pid, output and exit code (keyed by executable), whatever launch file
    started it: event handlers that the test's launch description registers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pids: dict[str, int] = {}
        self.output: dict[str, str] = {}
        self.returncodes: dict[str, int] = {}

    @staticmethod
    def _key(event: Any) -> str:
        return event.process_name.rsplit("-", 1)[0]  # "oxygen_node-2" -> "oxygen_node"

    def actions(self) -> list[RegisterEventHandler]:
        """The event handlers to put first in the launch description."""
        def started(event: Any, _context: Any) -> None:
            with self._lock:
                self.pids[self._key(event)] = event.pid

        def io(event: Any) -> None:
            with self._lock:
                key = self._key(event)
                self.output[key] = self.output.get(key, "") + event.text.decode(errors="replace")

        def exited(event: Any, _context: Any) -> None:
            with self._lock:
                self.returncodes[self._key(event)] = event.returncode

        return [RegisterEventHandler(OnProcessStart(on_start=started)),
                RegisterEventHandler(OnProcessIO(on_stdout=io, on_stderr=io)),
                RegisterEventHandler(OnProcessExit(on_exit=exited))]

    def text(self, key: str) -> str:
        """Everything process ``key`` printed so far."""
        with self._lock:
            return self.output.get(key, "")

    def wait_for_output(self, key: str, condition: Callable[[str], bool], timeout: float) -> bool:
        """Wait until ``condition(output of key)`` holds (False after ``timeout`` s or once the process exited)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if condition(self.text(key)):
                return True
            with self._lock:
                if key in self.returncodes:
                    break
            time.sleep(0.1)
        return condition(self.text(key))


class Listener:
    """A helper node on a Context of its own, spun by an executor bound to that context in a thread: records topics
    and calls services."""

    def __init__(self, domain: int, name: str = "launch_test_listener") -> None:
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain)
        self.node = Node(name, context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._lock = threading.Lock()
        self._received: dict[str, list[Any]] = {}
        self._thread = threading.Thread(target=self._spin, daemon=True, name="listener-spin")
        self._thread.start()

    def _spin(self) -> None:
        with contextlib.suppress(Exception):  # the context was shut down
            self.executor.spin()

    def record(self, topic: str, msg_type: type = String) -> None:
        """Keep every message on ``topic``."""
        self._received[topic] = []

        def keep(msg: Any) -> None:
            with self._lock:
                self._received[topic].append(msg)

        self.node.create_subscription(msg_type, topic, keep, 50)

    def messages(self, topic: str) -> list[Any]:
        """Messages received on ``topic`` so far."""
        with self._lock:
            return list(self._received[topic])

    def events(self, topic: str) -> list[dict[str, Any]]:
        """The JSON lines received on a ``std_msgs/String`` topic (the simulator's ``~/events``)."""
        return [json.loads(m.data) for m in self.messages(topic)]

    def close(self) -> None:
        """Stop spinning, destroy the node, shut the context down."""
        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)
        self._thread.join(timeout=2.0)


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return bool(predicate())


def including(recorder: Recorder, arguments: dict[str, str], namespace: str | None = None) -> Any:
    """A launch description that includes the launch file with ``arguments`` (under ``PushRosNamespace`` when
    ``namespace`` is given), in a scoped group so nothing leaks into this process's environment."""
    include = IncludeLaunchDescription(PythonLaunchDescriptionSource(str(LAUNCH_FILE)),
                                       launch_arguments=list(arguments.items()))
    pushed = [PushRosNamespace(namespace)] if namespace else []
    return launch.LaunchDescription([
        GroupAction([*recorder.actions(), *pushed, include], scoped=True, forwarding=True),
        launch_pytest.actions.ReadyToTest(),
    ])


def assert_clean_exit(recorder: Recorder, *keys: str) -> None:
    """After the launch service shut the processes down (SIGINT): each exited 0 without a traceback."""
    for key in keys:
        assert recorder.returncodes.get(key) == 0, (key, recorder.returncodes, recorder.text(key)[-3000:])
        assert "Traceback" not in recorder.text(key), recorder.text(key)[-3000:]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()

