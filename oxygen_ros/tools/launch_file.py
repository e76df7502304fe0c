"""``ros2 launch`` where there is no ros2cli (a venv with the ROS 2 PyPI wheels and ../shared/ros2_launch):

    oxygen-launch [PACKAGE FILE | PATH] [name:=value ...] [--show-args] [--debug]
    python -m oxygen_ros.tools.launch_file ...              (the same)

With no file, ``oxygen_ros oxygen.launch.py``. PACKAGE FILE is found under the package's share directory through
the ament index (``AMENT_PREFIX_PATH``: source ``tools/ros_env.sh`` first); PATH is a launch file. Ctrl-C shuts
the launched processes down (SIGINT) and exits 0, like ``ros2 launch``. On a ROS 2 distro use ``ros2 launch``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

__all__ = ["find_launch_file", "main"]

DEFAULT = ("oxygen_ros", "oxygen.launch.py")


def find_launch_file(package: str, file_name: str) -> Path:
    """``file_name`` under ``share/<package>`` (``launch/`` first, then anywhere below), as ``ros2 launch`` does."""
    from ament_index_python.packages import PackageNotFoundError, get_package_share_directory

    try:
        share = Path(get_package_share_directory(package))
    except PackageNotFoundError as e:
        raise SystemExit(f"oxygen-launch: package {package!r} not found in AMENT_PREFIX_PATH="
                         f"{os.environ.get('AMENT_PREFIX_PATH', '')!r} (source tools/ros_env.sh)") from e
    direct = share / "launch" / file_name
    if direct.is_file():
        return direct
    found = sorted(p for p in share.rglob(file_name) if p.is_file())
    if not found:
        raise SystemExit(f"oxygen-launch: no {file_name!r} under {share}")
    return found[0]


def _split(tokens: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    positional, arguments = [], []
    for token in tokens:
        if ":=" in token:
            name, _, value = token.partition(":=")
            if not name:
                raise SystemExit(f"oxygen-launch: malformed launch argument {token!r} (expected name:=value)")
            arguments.append((name, value))
        else:
            positional.append(token)
    return positional, arguments


def main(argv: list[str] | None = None) -> int:
    """Run a launch file until it finishes or is interrupted; returns the launch service's exit code."""
    parser = argparse.ArgumentParser(prog="oxygen-launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", nargs="*", help="[PACKAGE FILE | PATH] then name:=value launch arguments")
    parser.add_argument("-s", "--show-args", action="store_true", help="print the launch arguments and exit")
    parser.add_argument("-d", "--debug", action="store_true", help="launch's debug output")
    options = parser.parse_args(sys.argv[1:] if argv is None else argv)
    positional, arguments = _split(options.target)

    from launch import LaunchDescription, LaunchService
    from launch.actions import IncludeLaunchDescription
    from launch.launch_description_sources import (
        AnyLaunchDescriptionSource,
        get_launch_description_from_any_launch_file,
    )

    if not positional:
        path = find_launch_file(*DEFAULT)
    elif len(positional) == 1 and Path(positional[0]).is_file():
        path = Path(positional[0])
    elif len(positional) == 2:
        path = find_launch_file(*positional)
    else:
        parser.error(f"expected PACKAGE FILE or a launch file's path, got {positional}")
    if options.show_args:
        for arg in get_launch_description_from_any_launch_file(str(path)).get_launch_arguments():
            print(f"    '{arg.name}':\n        {arg.description}")
            if arg.default_value is not None:
                print("        (default: " + " + ".join(s.describe() for s in arg.default_value) + ")")
        return 0
    service = LaunchService(argv=[f"{n}:={v}" for n, v in arguments], noninteractive=True, debug=options.debug)
    service.include_launch_description(LaunchDescription([
        IncludeLaunchDescription(AnyLaunchDescriptionSource(str(path)), launch_arguments=arguments)]))
    return service.run()


if __name__ == "__main__":
    sys.exit(main())
