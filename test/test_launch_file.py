"""launch/oxygen.launch.py read without starting a process: its declared arguments, the DDS profile it sets unless
the environment names one, respawn reaching the node and the executor, and the venv's share copies being the
repository's files. (test_launch.py starts the processes; helpers: launch_support.py.)
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

import launch_support
import pytest
from launch_support import (
    PROFILE_ENV_VARS,
    REPO,
    GroupAction,
    launch,
    load_launch_module,
    venv_prefix,
)

pytestmark = launch_support.MARKS
ros_environment, recorder = launch_support.ros_environment, launch_support.recorder  # the shared fixtures


# ---------------------------------------------------------------------------------------------- without processes
def test_launch_arguments_are_declared() -> None:
    module = load_launch_module()
    names = [a[0] for a in module.ARGUMENTS]
    assert {"config_file", "checkpoint_path", "use_sim_time", "namespace", "with_sim", "dds_profile"} <= set(names)
    ld = module.generate_launch_description()
    declared = {e.name for e in ld.entities if isinstance(e, launch.actions.DeclareLaunchArgument)}
    assert declared == set(names)


def _setup_actions(**values: str) -> list[Any]:
    """The actions the launch file's OpaqueFunction returns for these argument values (defaults otherwise)."""
    module = load_launch_module()
    context = launch.LaunchContext()
    for name, default, _ in module.ARGUMENTS:
        context.launch_configurations[name] = values.get(name, default if isinstance(default, str) else "")
    (group,) = module._launch_setup(context)
    assert isinstance(group, GroupAction)
    return group.get_sub_entities()


def _profile_vars(actions: list[Any]) -> dict[str, str]:
    def text(subs: Any) -> str:
        return "".join(s.text for s in subs)
    return {text(a.name): text(a.value) for a in actions if isinstance(a, launch.actions.SetEnvironmentVariable)}


def test_dds_profile_is_applied_unless_the_environment_names_one(monkeypatch, tmp_path) -> None:
    profile = tmp_path / "profile.xml"
    profile.write_text("<profiles/>")
    monkeypatch.delenv("ROS_DISTRO", raising=False)  # the PyPI wheels: the name the installed Fast DDS reads
    applied = _profile_vars(_setup_actions(dds_profile=str(profile)))
    try:  # Jazzy's wheels (.venv-jazzy) carry Fast DDS 2.x, which reads FASTRTPS_...; Kilted's Fast DDS 3 FASTDDS_...
        importlib.metadata.version("ros-fastrtps")
        wheel_var = PROFILE_ENV_VARS[1]
    except importlib.metadata.PackageNotFoundError:
        wheel_var = PROFILE_ENV_VARS[0]
    assert applied == {wheel_var: str(profile.resolve())}
    monkeypatch.setenv("ROS_DISTRO", "jazzy")  # Fast DDS 2.x reads FASTRTPS_...
    assert _profile_vars(_setup_actions(dds_profile=str(profile))) == {PROFILE_ENV_VARS[1]: str(profile.resolve())}
    monkeypatch.delenv("ROS_DISTRO")
    assert _profile_vars(_setup_actions(dds_profile="")) == {}  # '' = none
    monkeypatch.setenv(PROFILE_ENV_VARS[0], "/users/own.xml")  # the user's choice wins
    assert _profile_vars(_setup_actions(dds_profile=str(profile))) == {}
    monkeypatch.delenv(PROFILE_ENV_VARS[0])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        _setup_actions(dds_profile=str(tmp_path / "missing.xml"))


def test_respawn_reaches_the_node_and_the_executor() -> None:
    """respawn:=true and respawn_delay go to both processes' actions (launch's ExecuteLocal restarts them); the
    simulator is not respawned; a bad delay is an error naming the argument."""
    def respawns(**values: str) -> dict[str, Any]:
        context = launch.LaunchContext()
        return {a.node_executable: (launch.utilities.type_utils.perform_typed_substitution(
            context, a._ExecuteLocal__respawn, bool), a._ExecuteLocal__respawn_delay)
            for a in _setup_actions(**values) if getattr(a, "node_executable", None)}

    got = respawns(with_executor="true")  # default: no respawn
    assert got == {"oxygen_executor": (False, 2.0), "oxygen_node": (False, 2.0)}, got
    got = respawns(with_sim="true", with_executor="true", respawn="true", respawn_delay="0.5")
    assert got == {"tabletop_sim": (False, None), "oxygen_executor": (True, 0.5), "oxygen_node": (True, 0.5)}, got
    with pytest.raises(ValueError, match="respawn_delay"):
        _setup_actions(respawn="true", respawn_delay="-1")


def test_share_copies_are_the_repository_files() -> None:
    """make setup links <venv>/share/oxygen_ros/{launch,config} to the repository: the edited file is the one run."""
    prefix = venv_prefix()
    if prefix is None:
        pytest.skip("not the venv of make setup (a colcon install copies the files at build time)")
    share = prefix / "share" / "oxygen_ros"
    for rel in ("launch/oxygen.launch.py", "config/tabletop.yaml"):
        assert (share / rel).resolve() == (REPO / rel).resolve(), f"{share / rel} is a stale copy: run make setup"
