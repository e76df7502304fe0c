"""The executor in the launch file: ``with_executor:=true`` adds it (its own process, wired to the node's chunks and
halt, given the node's preset then config/executor.yaml), and with the simulator it turns the node's chunks into
setpoints at the preset's action rate; Ctrl-C stops all three cleanly."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import ros_domain

REASON = "launch / launch_ros are not installed (make setup installs them from ../shared/ros2_launch)"
launch = pytest.importorskip("launch", reason=REASON)
pytest.importorskip("launch_ros.actions", reason=REASON)
pytest.importorskip("oxygen_ros.msg", reason="the oxygen_ros messages are not built (run `make setup`)")

from launch.actions import GroupAction  # noqa: E402

from oxygen_ros.executor.params import validate  # noqa: E402
from oxygen_ros.ros.stamps import stamp_to_ns  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LAUNCH_FILE = REPO / "launch" / "oxygen.launch.py"


def setup_actions(**values: str) -> list:
    spec = importlib.util.spec_from_file_location("oxygen_launch_executor", LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    context = launch.LaunchContext()
    for name, default, _ in module.ARGUMENTS:
        context.launch_configurations[name] = values.get(name, default if isinstance(default, str) else "")
    (group,) = module._launch_setup(context)
    assert isinstance(group, GroupAction)
    return group.get_sub_entities()


def executors(actions: list) -> list:
    return [a for a in actions if getattr(a, "node_executable", None) == "oxygen_executor"]


def test_with_executor_adds_the_executor_wired_to_the_node() -> None:
    assert executors(setup_actions(config_file="/x/preset.yaml")) == []  # default: false
    (node,) = executors(setup_actions(with_executor="true", namespace="arm1", node_name="policy",
                                      config_file="/x/preset.yaml", executor_config_file="/x/executor.yaml"))
    params = node._Node__parameters  # the preset first, then the executor's file, then the wiring (normalised)

    def text(subs) -> str:
        return "".join(s.text for s in subs)

    assert [text(p.param_file) for p in params[:2]] == ["/x/preset.yaml", "/x/executor.yaml"]
    wiring = {text(k): text(v) if isinstance(v, tuple) else v for k, v in params[2].items()}
    assert wiring["chunk_topic"].startswith("policy/action_chunk") and wiring["halt_topic"].startswith("policy/halt")


def test_cpu_layout_keeps_the_node_off_the_command_loops_cpu() -> None:
    actions = setup_actions(with_executor="true", config_file="/x/preset.yaml", node_cpus="2-5", executor_cpus="1",
                            executor_rt_priority="80")
    (executor,) = executors(actions)
    (node,) = [a for a in actions if getattr(a, "node_executable", None) == "oxygen_node"]
    extra = executor._Node__parameters[-1]
    flat = {"".join(s.text for s in k): v for k, v in extra.items()}
    assert yaml.safe_load("".join(s.text for s in flat["rt.cpus"])) == "1" and flat["rt.priority"] == 80  # a string
    assert "".join(s.text for s in node.process_description.prefix) == "taskset -c 2-5"  # the node on its CPUs
    node_extra = {"".join(s.text for s in k): v for k, v in node._Node__parameters[-1].items()}
    assert node_extra["torch_threads"] == 4  # one torch thread per CPU of the node
    assert not executors(setup_actions(config_file="/x/preset.yaml", node_cpus="2-5"))  # no executor asked for
    with pytest.raises(ValueError, match="share CPUs"):
        setup_actions(with_executor="true", node_cpus="0-3", executor_cpus="3")
    with pytest.raises(ValueError, match="1-99"):
        setup_actions(with_executor="true", executor_rt_priority="120")


def test_the_shipped_executor_config_is_valid() -> None:
    values = yaml.safe_load((REPO / "config" / "executor.yaml").read_text())["/**"]["ros__parameters"]
    p = validate(values)
    assert p.switch == "replace" and p.on_exhausted == "hold" and p.command_rate_hz == 0.0


def _venv_env(domain: int) -> dict[str, str]:
    env = dict(os.environ)
    prefix = Path(sys.prefix)
    for name, entry in (("AMENT_PREFIX_PATH", prefix), ("PATH", prefix / "bin")):
        env[name] = os.pathsep.join([str(entry), *[p for p in env.get(name, "").split(os.pathsep) if p]])
    env.update(ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", PYTHONUNBUFFERED="1",
               RCUTILS_COLORIZED_OUTPUT="0")
    return env


@pytest.mark.ros
@pytest.mark.slow
def test_with_sim_and_executor_streams_the_nodes_chunks(tmp_path: Path) -> None:
    marker = Path(sys.prefix) / "share" / "ament_index" / "resource_index" / "packages" / "oxygen_ros"
    if not marker.is_file() or not (Path(sys.prefix) / "lib" / "oxygen_ros" / "oxygen_executor").is_file():
        pytest.skip("not the venv of make setup with oxygen_executor installed")
    from oxygen_ros.testing.executor_probe import ExecutorProbe

    domain = ros_domain()
    log = tmp_path / "launch.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "oxygen_ros.tools.launch_file", "oxygen_ros",
                                 "oxygen.launch.py", "with_sim:=true", "with_executor:=true"], stdout=out,
                                stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True, env=_venv_env(domain))
    probe = None
    try:
        probe = ExecutorProbe(domain)
        # the node's chunks reach the executor: ~/executed names a chunk, setpoints come in the chunk's joints
        ok = probe.wait_for(lambda: any(e.frame_index > 0 and e.plan_length for e in probe.got_executed())
                            and len(probe.got_outputs()) > 10 or proc.poll() is not None, 240)
        assert ok and proc.poll() is None, log.read_text(errors="replace")[-5000:]
        out = probe.got_outputs()[-1]
        assert list(out.name) == ["ee_x", "ee_y", "ee_z", "gripper"]
        stamps = np.array([stamp_to_ns(e.header.stamp) for e in probe.got_executed()[-20:]])
        assert np.median(np.diff(stamps)) == pytest.approx(1e9 / 20.0, rel=0.15)  # tabletop's action_rate_hz
    finally:
        if probe is not None:
            probe.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                rc = proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
                rc = None
            text = log.read_text(errors="replace")
            assert rc == 0 and text.count("process has finished cleanly") == 3, text[-5000:]
    time.sleep(0.1)
