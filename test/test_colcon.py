"""The robot's install path: the package built by colcon in a workspace and run from its install space alone.

A robot installs oxygen_ros by building it in a colcon workspace against its ROS 2 distro and sourcing
``install/setup.bash``. This test does exactly that, against the Jazzy toolchain of ``.venv-jazzy`` (``make setup
ROS_DISTRO=jazzy``, which has colcon) or of any venv with colcon. The venv stands in for ``/opt/ros/jazzy``: an
*underlay* prefix is made of links to its ROS wheels with every trace of oxygen_ros left out (no editable install,
no messages built by ``make setup``, no ament index entry), plus a ``setup.bash`` that plays the distro's. Then, in
a shell that sources the underlay and the install space only, from a directory outside the repository:

- the messages and the action import, from the install space;
- ``lib/oxygen_ros/oxygen_node`` configures and activates from ``share/oxygen_ros/config/tabletop.yaml`` (found
  through the ament index) with the embedded model;
- ``share/oxygen_ros`` holds the launch file and the presets and ``fastdds.xml``;
- the launch file, found through the ament index (``ros2 launch oxygen_ros oxygen.launch.py``'s equivalent: there
  is no ros2cli wheel), brings the node up when launch/launch_ros are installed;
- the same with ``colcon build --symlink-install``.

Build trees are kept under ``build/colcon-test/`` (gitignored) so that a re-run compiles incrementally; the install
space is made afresh each time.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ros_domain

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "build" / "colcon-test" / Path(sys.prefix).name
# what a robot's workspace gets of this repository (the package's sources; nothing else is needed to build it)
SOURCES = ("CMakeLists.txt", "package.xml", "LICENSE", "README.md", "msg", "action", "oxygen_ros", "launch", "config",
           "scripts", "resource", "tools")
COLCON = Path(sys.prefix) / "bin" / "colcon"
_DOMAIN = ros_domain()

pytestmark = [
    pytest.mark.ros, pytest.mark.slow, pytest.mark.colcon, pytest.mark.timeout(1500),
    pytest.mark.skipif(not COLCON.is_file(), reason=f"no colcon in this environment ({COLCON}): the colcon install "
                       "test runs in the Jazzy environment (make setup ROS_DISTRO=jazzy; make test-jazzy)"),
    pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not found"),
]


def _is_oxygen(name: str) -> bool:
    return "oxygen_ros" in name or name.startswith("__editable__")


def _link_filtered(src: Path, dst: Path) -> None:
    """``dst`` mirrors ``src`` with one link per entry, leaving out everything of oxygen_ros."""
    dst.mkdir(parents=True, exist_ok=True)
    for entry in src.iterdir():
        if not _is_oxygen(entry.name) and not (dst / entry.name).exists():
            (dst / entry.name).symlink_to(entry)


def make_underlay(venv: Path, out: Path) -> Path:
    """A ROS 2 "distro" prefix at ``out`` made of ``venv``'s ROS wheels without oxygen_ros, with a setup.bash."""
    python_dir = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = venv / "lib" / python_dir / "site-packages"
    if (out / "setup.bash").is_file() and (out / "setup.bash").stat().st_mtime > site.stat().st_mtime:
        return out  # made after the venv last changed
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(out)], check=True)
    _link_filtered(site, out / "lib" / python_dir / "site-packages")
    for entry in (venv / "lib").iterdir():
        if entry.name != python_dir and not _is_oxygen(entry.name):
            (out / "lib" / entry.name).symlink_to(entry)
    _link_filtered(venv / "include", out / "include")
    index = venv / "share" / "ament_index" / "resource_index"
    for kind in index.iterdir():
        _link_filtered(kind, out / "share" / "ament_index" / "resource_index" / kind.name)
    for entry in (venv / "share").iterdir():
        if entry.name != "ament_index" and not _is_oxygen(entry.name):
            (out / "share" / entry.name).symlink_to(entry)
    libs = ":".join(str(p) for p in sorted((out / "lib" / python_dir / "site-packages").glob("ros_*.libs")))
    (out / "setup.bash").write_text(
        "# The stand-in for /opt/ros/jazzy/setup.bash (test/test_colcon.py)\n"
        f"export ROS_DISTRO={'jazzy' if _rclpy_major(venv) == 7 else 'kilted'}\n"
        f"export AMENT_PREFIX_PATH={out}\nexport CMAKE_PREFIX_PATH={out}\n"
        f"export PATH={out}/bin:{Path(shutil.which('cmake')).parent}:/usr/bin:/bin\n"
        f"export LD_LIBRARY_PATH={out}/lib:{libs}\nunset PYTHONPATH VIRTUAL_ENV\n")
    return out


def _rclpy_major(venv: Path) -> int:
    from importlib import metadata

    return int(metadata.version("ros-rclpy").split(".")[0])


def colcon_build(name: str, underlay: Path, *args: str) -> Path:
    """Build the package in workspace ``CACHE/name`` (sources refreshed, install space new); its root."""
    ws = CACHE / name
    src = ws / "src" / "oxygen_ros"
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(ws / "install", ignore_errors=True)
    for item in SOURCES:
        path = REPO / item
        if path.is_dir():
            shutil.copytree(path, src / item, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "train_log.json",
                                                                             "train_curves.png"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / item)
    script = (f"source {underlay}/setup.bash && cd {ws} && {COLCON} build --packages-select oxygen_ros "
              f"--event-handlers console_direct- {' '.join(args)}")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=1200,
                          env={"HOME": os.environ.get("HOME", "/root"), "MAKEFLAGS": "-j2"})
    assert proc.returncode == 0, f"colcon build {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return ws


def in_install_space(ws: Path, underlay: Path, command: str, cwd: Path, **kw) -> subprocess.Popen:
    """``command`` in bash after sourcing the underlay and ``ws/install/setup.bash`` only, from ``cwd``."""
    env = {"HOME": os.environ.get("HOME", "/root"), "ROS_DOMAIN_ID": str(_DOMAIN), "PYTHONUNBUFFERED": "1",
           "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "RCUTILS_COLORIZED_OUTPUT": "0",
           "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME", str(cwd))}
    script = f"source {underlay}/setup.bash && source {ws}/install/setup.bash && exec {command}"
    return subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, text=True, start_new_session=True, **kw)


def run_until(proc: subprocess.Popen, log: Path, text: str, timeout: float) -> str:
    """Wait for ``text`` in ``log`` (or the process's end), then SIGINT its group; the log, with the exit code
    checked to be 0 (a clean shutdown)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None and text not in log.read_text(errors="replace"):
        time.sleep(0.5)
    found = text in log.read_text(errors="replace")
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    out = log.read_text(errors="replace")
    assert found, f"{text!r} not seen:\n{out[-4000:]}"
    assert code == 0, f"exit {code} after SIGINT:\n{out[-4000:]}"
    return out


PROBE = r"""
import sys, oxygen_ros, oxygen_ros.ros.node
from pathlib import Path
from ament_index_python.packages import get_package_share_directory, get_package_prefix
from oxygen_ros.msg import ActionChunk, LanguageOutput, ExecutedPlan
from oxygen_ros.action import Ask
share = Path(get_package_share_directory("oxygen_ros"))
print("prefix", get_package_prefix("oxygen_ros"))
print("share", share)
print("package", Path(oxygen_ros.__file__).absolute())
print("node", Path(oxygen_ros.ros.node.__file__).absolute())
print("msg", Path(sys.modules[ActionChunk.__module__].__file__).absolute())
print("action", Path(sys.modules[Ask.__module__].__file__).absolute())
print("fields", ",".join(ActionChunk.get_fields_and_field_types()), ",".join(Ask.Goal.get_fields_and_field_types()))
for f in ("launch/oxygen.launch.py", "config/tabletop.yaml", "config/executor.yaml", "config/fastdds.xml",
          "package.xml"):
    print("file", f, (share / f).is_file())
lib = Path(get_package_prefix("oxygen_ros")) / "lib" / "oxygen_ros"
print("programs", ",".join(sorted(p.name for p in lib.iterdir() if p.is_file() and p.stat().st_mode & 0o111)))
print("path", ":".join(sys.path))
"""


def check_install_space(ws: Path, underlay: Path, tmp_path: Path) -> dict[str, list[str]]:
    """The probe's report from the install space; every oxygen_ros file it names lies in ``ws/install``."""
    proc = in_install_space(ws, underlay, f"python3 -c '{PROBE}'", tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    report: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        report.setdefault(key, []).append(value)
    install = ws / "install"
    for key in ("prefix", "share", "package", "node", "msg", "action"):  # as imported (links not followed)
        assert Path(report[key][0]).is_relative_to(install), (key, report[key][0], out)
    assert report["file"] == [f"{f} True" for f in ("launch/oxygen.launch.py", "config/tabletop.yaml",
                                                    "config/executor.yaml", "config/fastdds.xml", "package.xml")], out
    # `ros2 run oxygen_ros <program>`: every entry point of scripts/ installed executable
    assert report["programs"][0].split(",") == sorted(p.name for p in (REPO / "scripts").iterdir()
                                                      if p.is_file() and not p.name.endswith(".sh")), out
    assert report["fields"][0].split(" ")[0].split(",")[:2] == ["header", "frame_index"], out
    assert not [p for p in report["path"][0].split(":") if p and Path(p).resolve().is_relative_to(REPO.resolve())
                and not Path(p).resolve().is_relative_to(CACHE.resolve())], report["path"]
    return report


@pytest.fixture(scope="module")
def underlay() -> Path:
    return make_underlay(Path(sys.prefix), CACHE / "underlay")


@pytest.fixture(scope="module")
def workspace(underlay: Path) -> Path:
    return colcon_build("ws", underlay)


def test_messages_and_share_resolve_from_the_install_space(workspace: Path, underlay: Path, tmp_path: Path) -> None:
    check_install_space(workspace, underlay, tmp_path)


def test_installed_node_configures_from_a_preset_of_the_ament_index(workspace: Path, underlay: Path,
                                                                    tmp_path: Path) -> None:
    exe = workspace / "install" / "oxygen_ros" / "lib" / "oxygen_ros" / "oxygen_node"
    assert os.access(exe, os.X_OK)
    log = tmp_path / "node.log"
    share = "$(python3 -c \"from ament_index_python.packages import get_package_share_directory as g; " \
            "print(g('oxygen_ros'))\")"  # what `ros2 pkg prefix --share oxygen_ros` prints
    preset = f"{share}/config/tabletop.yaml"
    with log.open("w") as f:
        proc = in_install_space(workspace, underlay, f'{exe} --ros-args --params-file "{preset}"', tmp_path,
                                stdout=f, stderr=subprocess.STDOUT)
    out = run_until(proc, log, "active:", 240)
    install = str(workspace / "install")
    assert "configured in" in out and f"toy ({install}" in out, out[-3000:]  # the embedded model, installed


def test_doctor_runs_from_the_install_space(workspace: Path, underlay: Path, tmp_path: Path) -> None:
    proc = in_install_space(workspace, underlay, "oxygen-doctor", tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    out, _ = proc.communicate(timeout=300)
    install = str(workspace / "install")
    assert proc.returncode == 0, out
    assert f"[     ok] ament index: share/oxygen_ros at {install}" in out, out
    assert f"[     ok] preset: {install}/oxygen_ros/share/oxygen_ros/config/tabletop.yaml" in out, out


@pytest.mark.skipif(importlib.util.find_spec("launch_ros") is None,
                    reason="launch/launch_ros not installed (make setup installs them from ../shared/ros2_launch)")
def test_launch_file_of_the_install_space_brings_the_node_up(workspace: Path, underlay: Path,
                                                              tmp_path: Path) -> None:
    """``ros2 launch oxygen_ros oxygen.launch.py``: the installed launcher (oxygen-launch's module) finds the launch
    file through the ament index and starts lib/oxygen_ros/oxygen_node with the default preset."""
    log = tmp_path / "launch.log"
    with log.open("w") as f:
        proc = in_install_space(workspace, underlay, "python3 -m oxygen_ros.tools.launch_file oxygen_ros "
                                "oxygen.launch.py", tmp_path, stdout=f, stderr=subprocess.STDOUT)
    out = run_until(proc, log, "active:", 240)
    install = str(workspace / "install")
    assert f"{install}/oxygen_ros/lib/oxygen_ros/oxygen_node" in out or "oxygen_node-1" in out, out[-3000:]
    assert f"toy ({install}" in out, out[-3000:]


def test_symlink_install(underlay: Path, tmp_path: Path) -> None:
    ws = colcon_build("ws-symlink", underlay, "--symlink-install")
    report = check_install_space(ws, underlay, tmp_path)
    exe = ws / "install" / "oxygen_ros" / "lib" / "oxygen_ros" / "oxygen_node"
    assert exe.is_symlink() and os.access(exe, os.X_OK)
    assert Path(report["package"][0]).resolve().is_relative_to((ws / "src").resolve())  # the linked sources
    log = tmp_path / "node.log"
    with log.open("w") as f:
        proc = in_install_space(ws, underlay, f"{exe} --ros-args --params-file {report['share'][0]}/config/"
                                "tabletop.yaml", tmp_path, stdout=f, stderr=subprocess.STDOUT)
    run_until(proc, log, "configured in", 240)
