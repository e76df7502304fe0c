"""``oxygen-doctor``: what the node will run on here, and what is missing, with the fix for each.

    oxygen-doctor [--preset tabletop|FILE] [--set name=value ...] [--json]

Checks the ROS 2 distro and rclpy, the built messages and the ament index entry, torch and CUDA, the device and
dtype the preset resolves to, the DDS profile in force (RMW_IMPLEMENTATION, FASTRTPS_/FASTDDS_DEFAULT_PROFILES_FILE),
the size of /dev/shm against the profile's shared-memory segment, the model files the preset needs, and the pip-only
Python packages (requirements-robot.txt). Exit status 1 when something required is missing, else 0 (warnings do not
fail). The preset is found as a file, else by name in the ament index (``share/oxygen_ros/config``), else in the
source checkout's ``config/``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from oxygen_ros.robot.realtime import capability

from .dds import PROFILE_ENV_VARS, PROFILE_FILE_NAME, default_profile_path, profile_env_var

__all__ = ["Check", "find_preset", "main", "run_checks"]

PACKAGE = "oxygen_ros"
OK, WARN, MISSING = "ok", "warn", "MISSING"
# Fast DDS SHM segments live in /dev/shm, one per participant: room for this many of the profile's segments
# (the node, two cameras, a simulator or driver, tools) is what the launch file's graph needs.
SHM_SEGMENTS_WANTED = 8
PIP_ONLY = ("safetensors", "sentencepiece", "rosbags")  # requirements-robot.txt


@dataclass
class Check:
    """One line of the report: ``status`` is ok, warn or MISSING; ``fix`` says what to do when it is not ok."""

    name: str
    status: str
    detail: str
    fix: str = ""


def _ament_share() -> Path | None:
    try:
        from ament_index_python.packages import get_package_share_directory

        return Path(get_package_share_directory(PACKAGE))
    except Exception:  # not importable, AMENT_PREFIX_PATH unset, or the package is not in the index
        return None


def find_preset(name: str) -> Path:
    """The preset file: ``name`` as a path, else ``<name>.yaml`` in the ament index's ``share/oxygen_ros/config``,
    else in the source checkout's ``config/``.

    Raises:
        FileNotFoundError: naming every place looked in.
    """
    path = Path(name).expanduser()
    if path.is_file():
        return path
    filename = name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"
    share = _ament_share()
    dirs = [d for d in (share / "config" if share else None, Path(__file__).resolve().parents[2] / "config") if d]
    for directory in dirs:
        if (directory / filename).is_file():
            return directory / filename
    raise FileNotFoundError(f"preset {name}: not a file, and no {filename} in " + ", ".join(map(str, dirs)))


def _load_preset(path: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text()) or {}
    params = dict(next(iter(data.values()))["ros__parameters"]) if data else {}
    return {**params, **overrides}


def check_ros() -> list[Check]:
    """ROS distro, rclpy, the built messages and the ament index entry."""
    out = []
    distro = os.environ.get("ROS_DISTRO", "")
    try:
        import rclpy  # noqa: F401
    except Exception as e:
        return [Check("rclpy", MISSING, f"import rclpy fails: {e}",
                      "source /opt/ros/jazzy/setup.bash (robot) or use the venv of `make setup` (workstation)")]
    version, where = _rclpy_version()
    if not distro:
        distro = {"7": "jazzy", "9": "kilted"}.get(version.split(".")[0], "") + " (PyPI wheels)" if version else ""
    out.append(Check("ROS 2", OK, f"distro {distro or 'unknown'}, rclpy {version or 'unknown'} ({where})"))
    try:
        from oxygen_ros.action import Ask  # noqa: F401
        from oxygen_ros.msg import ActionChunk, ExecutedPlan, LanguageOutput  # noqa: F401
        out.append(Check("messages", OK, "oxygen_ros.msg and oxygen_ros.action import"))
    except Exception as e:
        out.append(Check("messages", MISSING, f"oxygen_ros messages do not import: {e}",
                         "colcon build --packages-select oxygen_ros && source install/setup.bash (robot), or "
                         "make setup (workstation)"))
    share = _ament_share()
    if share is None:
        out.append(Check("ament index", WARN, "oxygen_ros is not in the ament index (AMENT_PREFIX_PATH): "
                         "`ros2 launch oxygen_ros` and `ros2 run` cannot find it",
                         "source install/setup.bash of the colcon workspace (robot), or . tools/ros_env.sh"))
    else:
        out.append(Check("ament index", OK, f"share/oxygen_ros at {share}"))
    return out


def _rclpy_version() -> tuple[str, str]:
    for dist in ("ros-rclpy", "rclpy"):
        try:
            return metadata.version(dist), f"pip distribution {dist}"
        except metadata.PackageNotFoundError:
            pass
    try:  # a distro install: the version is in share/rclpy/package.xml
        from ament_index_python.packages import get_package_share_directory

        xml = (Path(get_package_share_directory("rclpy")) / "package.xml").read_text()
        match = re.search(r"<version>([^<]+)</version>", xml)
        return (match.group(1) if match else ""), "share/rclpy/package.xml"
    except Exception:
        return "", "version not found"


def check_torch(params: dict[str, Any] | None) -> list[Check]:
    """torch and CUDA; then the device and dtype the preset's ``device``/``dtype`` resolve to."""
    try:
        import torch
    except Exception as e:
        return [Check("torch", MISSING, f"import torch fails: {e}",
                      "Jetson: JetPack's CUDA torch (NVIDIA's wheel for this JetPack); elsewhere pip install torch")]
    cuda = torch.version.cuda
    available = torch.cuda.is_available()
    detail = f"torch {torch.__version__}, " + (f"CUDA {cuda} build" if cuda else "CPU build")
    if available:
        detail += f", GPU {torch.cuda.get_device_name(0)}"
    elif cuda:
        detail += ", but no CUDA device is usable"
    out = [Check("torch", OK, detail)]
    if params is None:
        return out
    from oxygen_ros.policy.device import choose_precision, resolve_device

    device, dtype = str(params.get("device", "auto")), str(params.get("dtype", "auto"))
    try:
        dev, compute = resolve_device(device, dtype)
    except ValueError as e:
        fix = ("install a CUDA build of torch (Jetson: JetPack's) or set device:=cpu" if "cuda" in device
               else "set device/dtype to a supported value (oxygen-node --help)")
        return [*out, Check("device", MISSING, f"device={device} dtype={dtype}: {e}", fix)]
    status, note = OK, ""
    if dev.type == "cpu" and cuda and available:
        status, note = WARN, " (a GPU is there: device:=auto or cuda would use it)"
    framework, checkpoint_dtype = _checkpoint_framework(params)
    choice = choose_precision(dev, dtype, framework, checkpoint_dtype)
    out.append(Check("device", status, f"device={device} dtype={dtype} -> {dev}, {choice.describe()}{note}",
                     "set device:=cuda in the preset" if note else ""))
    return out


def _checkpoint_framework(params: dict[str, Any]) -> tuple[str | None, str]:
    """(framework, the dtype its config.json declares) of the preset's checkpoint_path, for ``dtype: auto``'s
    choice; (None, "") for the embedded model or a checkpoint that cannot be read (check_model says why)."""
    ckpt = str(params.get("checkpoint_path", "") or "")
    if not ckpt:
        return None, ""
    from oxygen_ros.policy.formats import detect_layout
    from oxygen_ros.policy.formats.common import read_json

    try:
        framework = detect_layout(Path(ckpt))
        config = Path(ckpt) / "config.json"
        data = read_json(config) if framework == "lerobot" and config.is_file() else {}
    except Exception:
        return None, ""
    return framework, str(data.get("dtype", "float32")) if isinstance(data, dict) and framework == "lerobot" else ""


def check_dds() -> list[Check]:
    """The RMW and the Fast DDS profile the node's process gets, and /dev/shm against its segment size."""
    out = []
    rmw = os.environ.get("RMW_IMPLEMENTATION", "")
    out.append(Check("RMW", OK, f"RMW_IMPLEMENTATION={rmw}" if rmw else "RMW_IMPLEMENTATION unset (rmw_fastrtps_cpp)"))
    if rmw not in ("", "rmw_fastrtps_cpp", "rmw_fastrtps_dynamic_cpp"):
        out.append(Check("DDS profile", WARN, f"{rmw}: config/{PROFILE_FILE_NAME} does not apply; raw camera images "
                         "need that RMW's shared-memory transport", "configure the RMW's transport, or unset it"))
        return out
    wanted = profile_env_var()
    segment, profile = None, None
    set_vars = {n: os.environ[n] for n in PROFILE_ENV_VARS if os.environ.get(n)}
    if set_vars:
        name, value = next(iter(set_vars.items()))
        path = Path(value).expanduser()
        if not path.is_file():
            out.append(Check("DDS profile", MISSING, f"{name}={value}: no such file (Fast DDS ignores it and raw "
                             "images fall back to fragmented UDP)", f"unset {name} or point it at a profile, e.g. "
                             f"share/oxygen_ros/config/{PROFILE_FILE_NAME}"))
            return out
        if wanted not in set_vars:
            out.append(Check("DDS profile", WARN, f"{name}={value} is set, but this Fast DDS reads {wanted}",
                             f"export {wanted}={value}"))
        else:
            out.append(Check("DDS profile", OK, f"{wanted}={value} (the environment's; the launch file keeps it)"))
        profile = path
    else:
        profile = default_profile_path()
        if profile is None:
            out.append(Check("DDS profile", WARN, f"none set and no config/{PROFILE_FILE_NAME} found",
                             "source the install space (share/oxygen_ros/config) or set " + wanted))
        else:
            out.append(Check("DDS profile", OK, f"none in the environment; the launch file applies {profile} "
                             f"({wanted})"))
    if profile is not None:
        match = re.search(r"<segment_size>\s*(\d+)\s*</segment_size>", profile.read_text())
        segment = int(match.group(1)) if match else None
    out.append(check_shm(segment))
    return out


def check_shm(segment: int | None, path: str = "/dev/shm") -> Check:
    """/dev/shm's size and free space against ``segment`` bytes per participant (Fast DDS SHM transport)."""
    try:
        st = os.statvfs(path)
    except OSError as e:
        return Check("/dev/shm", WARN, f"{path}: {e} (Fast DDS falls back to UDP)", "mount a tmpfs on /dev/shm")
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    mib = 1 << 20
    detail = f"{total / mib:.0f} MiB, {free / mib:.0f} MiB free"
    fix = (f"docker run --shm-size={max(1, SHM_SEGMENTS_WANTED * (segment or 0) // (1 << 30) + 1)}g, or "
           f"sudo mount -o remount,size=2G {path}")
    if segment is None:
        return Check("/dev/shm", OK, detail + " (the profile sets no segment size)")
    if free < segment:
        return Check("/dev/shm", MISSING, f"{detail}: less than one {segment // mib} MiB segment of the DDS "
                     "profile (raw images cannot use shared memory)", fix)
    if total < SHM_SEGMENTS_WANTED * segment:
        return Check("/dev/shm", WARN, f"{detail}: under {SHM_SEGMENTS_WANTED} segments of {segment // mib} MiB "
                     "(node, cameras, simulator, tools)", fix)
    return Check("/dev/shm", OK, f"{detail} (room for {total // segment} segments of {segment // mib} MiB)")


def check_model(params: dict[str, Any]) -> list[Check]:
    """The files the preset's model needs: the embedded toy model, or checkpoint_path (and the tokenizer and norm
    stats paths when set)."""
    model = str(params.get("model", "") or "")
    if model == "random_tiny":
        return [Check("model", OK, "random_tiny: generated at configure (no files)")]
    if model == "toy":
        from oxygen_ros.policy.shipped_model import TOY_MODEL_DIR, toy_model_available

        if toy_model_available():
            return [Check("model", OK, f"toy: embedded in the package ({TOY_MODEL_DIR})")]
        return [Check("model", MISSING, f"toy: the trained files are not in {TOY_MODEL_DIR}",
                      f"reinstall the package, or train it: oxygen-train-toy --out {TOY_MODEL_DIR}")]
    if model:
        return [Check("model", MISSING, f"model: {model!r} is not an embedded model (toy, random_tiny)",
                      "set model:='' and checkpoint_path, or model:=toy")]
    out = []
    ckpt = str(params.get("checkpoint_path", "") or "")
    if not ckpt:
        return [Check("model", MISSING, "checkpoint_path is empty (and model is '')",
                      "set checkpoint_path:=/path/to/checkpoint (openpi or LeRobot pi0.5), or model:=toy")]
    for name in ("checkpoint_path", "tokenizer_path", "norm_stats_path"):
        value = str(params.get(name, "") or "")
        if not value:
            continue
        path = Path(value).expanduser()
        if path.exists():
            out.append(Check(name, OK, f"{path} exists"))
        else:
            out.append(Check(name, MISSING, f"{path} does not exist",
                             f"download/copy it there, or set {name}:= to where it is"))
    return out


def check_python() -> list[Check]:
    """The pip-only packages of requirements-robot.txt (no apt rule on Ubuntu noble)."""
    out = []
    for module in PIP_ONLY:
        try:
            importlib.import_module(module)
            out.append(Check(module, OK, f"{module} {metadata.version(module)}"))
        except Exception as e:
            required = module != "rosbags"  # bag replay and evaluation only
            out.append(Check(module, MISSING if required else WARN, f"import {module} fails: {e}",
                             "pip install -r requirements-robot.txt"))
    return out


def check_realtime() -> list[Check]:
    """What this machine allows the executor's command loop (rt.priority, rt.cpus, rt.mlockall): warnings, never
    missing (the loop runs at normal priority without them)."""
    return [Check(f"realtime: {name}", OK if ok else WARN, detail, "" if ok else fix)
            for name, ok, detail, fix in capability()]


def run_checks(preset: str, overrides: dict[str, Any]) -> list[Check]:
    """Every check, for ``preset`` with ``overrides``."""
    checks: list[Check] = []
    params: dict[str, Any] | None = None
    try:
        path = find_preset(preset)
        params = _load_preset(path, overrides)
        checks.append(Check("preset", OK, str(path)))
    except Exception as e:
        checks.append(Check("preset", MISSING, str(e), "pass --preset FILE, or source the install space"))
    steps: list[Callable[[], list[Check]]] = [check_ros, lambda: check_torch(params), check_dds, check_python,
                                            check_realtime]
    if params is not None:
        steps.append(lambda: check_model(params))
    for step in steps:
        try:
            checks += step()
        except Exception as e:  # a check that breaks is itself a finding, never a traceback
            checks.append(Check(getattr(step, "__name__", "check"), MISSING, f"{type(e).__name__}: {e}"))
    return checks


def _parse_set(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"oxygen-doctor: --set expects name=value, got {item!r}")
        out[name.rstrip(":")] = yaml.safe_load(value) if value else ""
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the report; 1 when something required is missing."""
    parser = argparse.ArgumentParser(prog="oxygen-doctor", description=__doc__.strip().splitlines()[0])
    parser.add_argument("--preset", default="tabletop", help="a preset name (config/<name>.yaml) or a params file")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override a parameter")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    args = parser.parse_args(argv)
    checks = run_checks(args.preset, _parse_set(args.set))
    missing = [c for c in checks if c.status == MISSING]
    if args.json:
        print(json.dumps({"ok": not missing, "checks": [asdict(c) for c in checks]}, indent=1))
    else:
        for c in checks:
            print(f"[{c.status:>7}] {c.name}: {c.detail}")
            if c.fix and c.status != OK:
                print(f"          fix: {c.fix}")
        print(f"oxygen-doctor: {len(missing)} missing" + (": " + ", ".join(c.name for c in missing) if missing
                                                          else "; the node can run here"))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
