"""The demo's parameter presets: where the ``config/*.yaml`` files are, reading one, ``--set`` overrides.

The presets live in the source checkout's ``config/`` and, once installed (colcon), in ``share/oxygen_ros/config``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from oxygen_ros.testing.process import source_checkout

__all__ = ["PACKAGE", "config_dirs", "find_config", "load_params", "parse_set"]

PACKAGE = "oxygen_ros"


def _ament_share() -> Path | None:
    """``share/oxygen_ros`` of the sourced ROS workspace (colcon install), or None."""
    try:
        from ament_index_python.packages import get_package_share_directory
    except ImportError:
        return None
    try:
        return Path(get_package_share_directory(PACKAGE))
    except (LookupError, OSError, ValueError):  # package not found / AMENT_PREFIX_PATH unset
        return None


def config_dirs() -> list[Path]:
    """Where presets are looked for, in order: the source checkout's ``config/`` (when running from one), the
    ament index's ``share/oxygen_ros/config`` (when ament_index_python is importable and knows the package), then
    ``<sys.prefix>/share/oxygen_ros/config``."""
    root, share = source_checkout(), _ament_share()
    candidates = [root / "config" if root else None, share / "config" if share else None,
                  Path(sys.prefix) / "share" / PACKAGE / "config"]
    return list(dict.fromkeys(c for c in candidates if c is not None))


def find_config(name: str) -> Path:
    """The preset ``name`` (``tabletop`` or ``tabletop.yaml``) from the first of :func:`config_dirs` that has it.

    Raises:
        FileNotFoundError: naming the preset and every directory looked in.
    """
    filename = name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"
    dirs = config_dirs()
    for directory in dirs:
        if (directory / filename).is_file():
            return directory / filename
    raise FileNotFoundError(f"config preset {filename} not found; looked in: " + ", ".join(map(str, dirs))
                            + " (pass --config FILE)")


def load_params(config: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """The ``ros__parameters`` of the params file's first node, with ``overrides`` applied."""
    data = yaml.safe_load(Path(config).read_text()) or {}
    params = dict(next(iter(data.values()))["ros__parameters"]) if data else {}
    return {**params, **overrides}


def parse_set(items: Sequence[str]) -> dict[str, Any]:
    """``name:=value`` pairs (values parsed as YAML, like ``-p``)."""
    out = {}
    for item in items:
        name, sep, value = item.partition(":=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"--set expects name:=value, got {item!r}")
        out[name] = yaml.safe_load(value)
    return out
