"""oxygen-doctor, run as the real command: it reports this machine correctly (exit 0), and says what is missing,
with the fix, when a preset points at a missing checkpoint, a DDS profile path is wrong, or the device is absent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch
import yaml

from oxygen_ros.robot.realtime import fifo_refusal
from oxygen_ros.ros.doctor import MISSING, OK, check_shm

REPO = Path(__file__).resolve().parents[1]
# the environment's own DDS choices are left out: each test sets what it checks
PROFILE_VARS = ("FASTDDS_DEFAULT_PROFILES_FILE", "FASTRTPS_DEFAULT_PROFILES_FILE", "RMW_IMPLEMENTATION")


def doctor(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[int, dict]:
    """Run oxygen-doctor --json (the venv's console script, else ``python -m``) from ``cwd``; (exit code, report)."""
    script = Path(sys.prefix) / "bin" / "oxygen-doctor"
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "oxygen_ros.ros.doctor"]
    base = {k: v for k, v in os.environ.items() if k not in PROFILE_VARS}
    proc = subprocess.run([*cmd, "--json", *args], capture_output=True, text=True, timeout=120,
                          env={**base, **(env or {})}, cwd=cwd or REPO)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def test_reports_this_machine(tmp_path: Path) -> None:
    code, report = doctor(cwd=tmp_path)
    checks = by_name(report)
    assert code == 0 and report["ok"], [c for c in report["checks"] if c["status"] == MISSING]
    try:  # the PyPI wheels (make setup); a sourced distro names itself in ROS_DISTRO
        rclpy_version = metadata.version("ros-rclpy")
    except metadata.PackageNotFoundError:
        rclpy_version = None
    if rclpy_version:
        assert f"rclpy {rclpy_version}" in checks["ROS 2"]["detail"]
        assert ("jazzy" if rclpy_version.startswith("7.") else "kilted") in checks["ROS 2"]["detail"]
    else:
        assert f"distro {os.environ['ROS_DISTRO']}" in checks["ROS 2"]["detail"]
    assert checks["messages"]["status"] == OK
    assert f"torch {torch.__version__}" in checks["torch"]["detail"]
    assert ("CPU build" in checks["torch"]["detail"]) == (torch.version.cuda is None)
    assert checks["device"]["detail"].endswith("-> cpu, float32 (own checkpoint on cpu)")  # tabletop: dtype auto
    assert checks["model"]["status"] == OK and "toy" in checks["model"]["detail"]
    assert checks["preset"]["detail"].endswith("tabletop.yaml")
    assert checks["DDS profile"]["status"] == OK and "fastdds.xml" in checks["DDS profile"]["detail"]
    assert checks["/dev/shm"]["status"] in (OK, "warn") and "MiB" in checks["/dev/shm"]["detail"]
    # the real-time capability of this machine (the executor's rt.* settings), each with its fix when not there
    fifo = checks["realtime: SCHED_FIFO allowed"]
    assert fifo["status"] == ("warn" if fifo_refusal() else OK), fifo
    preempt_rt = Path("/sys/kernel/realtime").exists() or "PREEMPT_RT" in os.uname().version
    assert checks["realtime: PREEMPT_RT kernel"]["status"] == (OK if preempt_rt else "warn")
    isolated = Path("/sys/devices/system/cpu/isolated").read_text().strip()
    assert checks["realtime: isolated CPUs"]["detail"] == (isolated or "none")
    for c in checks.values():
        if c["name"].startswith("realtime:") and c["status"] != OK:
            assert c["fix"], c


def test_a_missing_checkpoint_is_missing_with_its_fix(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "config" / "libero.yaml").read_text())
    params = next(iter(data.values()))["ros__parameters"]
    params.update(model="", checkpoint_path=str(tmp_path / "no_such_checkpoint"))
    preset = tmp_path / "robot.yaml"
    preset.write_text(yaml.safe_dump(data))
    code, report = doctor("--preset", str(preset))
    check = by_name(report)["checkpoint_path"]
    assert code == 1 and not report["ok"]
    assert check["status"] == MISSING and "no_such_checkpoint does not exist" in check["detail"] and check["fix"]
    (tmp_path / "no_such_checkpoint").mkdir()  # the same preset once the checkpoint is there
    code, report = doctor("--preset", str(preset))
    assert by_name(report)["checkpoint_path"]["status"] == OK


def test_a_bad_profile_path_is_missing(tmp_path: Path) -> None:
    code, report = doctor(env={"FASTRTPS_DEFAULT_PROFILES_FILE": str(tmp_path / "nope.xml")})
    check = by_name(report)["DDS profile"]
    assert code == 1 and check["status"] == MISSING and "nope.xml: no such file" in check["detail"]
    assert "unset FASTRTPS_DEFAULT_PROFILES_FILE" in check["fix"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: device:=cuda is not missing here")
def test_cuda_requested_without_cuda_is_missing() -> None:
    code, report = doctor("--set", "device=cuda")
    check = by_name(report)["device"]
    assert code == 1 and check["status"] == MISSING and "CUDA is not available" in check["detail"]


def test_an_unknown_preset_and_the_text_report(tmp_path: Path) -> None:
    script = Path(sys.prefix) / "bin" / "oxygen-doctor"
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "oxygen_ros.ros.doctor"]
    proc = subprocess.run([*cmd, "--preset", "no_such_preset"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 1
    assert "[MISSING] preset: preset no_such_preset: not a file" in proc.stdout
    assert "fix: pass --preset FILE" in proc.stdout and "1 missing: preset" in proc.stdout


def test_shm_smaller_than_a_segment_is_missing(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    assert check_shm(free * 2, str(tmp_path)).status == MISSING  # a segment larger than the free space
    assert check_shm(1, str(tmp_path)).status == OK
    assert check_shm(None, str(tmp_path / "absent")).status == "warn"


def test_the_device_check_names_the_precision_the_checkpoint_chooses(tmp_path: Path) -> None:
    """dtype auto follows the checkpoint (docs/precision.md): an openpi checkpoint runs openpi's bf16, on CPU too."""
    ckpt = REPO / "test" / "fixtures" / "openpi" / "pi05_libero" / "checkpoint"
    data = yaml.safe_load((REPO / "config" / "libero.yaml").read_text())
    params = next(iter(data.values()))["ros__parameters"]
    params.update(model="", checkpoint_path=str(ckpt), device="cpu", dtype="auto")
    preset = tmp_path / "libero.yaml"
    preset.write_text(yaml.safe_dump(data))
    _, report = doctor("--preset", str(preset))
    detail = by_name(report)["device"]["detail"]
    assert "-> cpu, bfloat16_islands (openpi checkpoint" in detail, detail
    params["dtype"] = "float32"
    preset.write_text(yaml.safe_dump(data))
    _, report = doctor("--preset", str(preset))
    assert by_name(report)["device"]["detail"].endswith("-> cpu, float32 (dtype parameter)")
