#!/usr/bin/env bash
# Build ROS 2 interface packages with plain cmake against the ROS 2 PyPI wheels and install them into a virtual
# environment's prefix: by default this repository's messages (msg/*.msg), so that `from oxygen_ros.msg import
# ActionChunk` works there; with SRC, another interface package's source (e.g. composition_interfaces, which
# launch_ros needs and which has no wheel: `make setup` builds it from ../shared/ros2_launch/src).
#
#   bash tools/build_msgs.sh [VENV [SRC]]   VENV defaults to $VIRTUAL_ENV, else .venv next to this repo;
#                                           SRC defaults to this repository
#
# For this repository only the messages are installed (-DOXYGEN_ROS_INSTALL_PYTHON_SOURCES=OFF, see CMakeLists.txt):
# the Python sources come from the repository through `pip install -e .`; the generated oxygen_ros.msg lands in
# <site-packages>/_oxygen_ros_msgs/oxygen_ros, which <site-packages>/oxygen_ros.pkg adds to the package via
# pkgutil.extend_path in oxygen_ros/__init__.py. Nothing pip owns is touched, so the order relative to
# `pip install -e .` does not matter (make setup runs it after the pip installs). Another package (SRC) is built
# unchanged, with tools/wheel_include_fix.cmake injected after its project() for the wheels' include-directory
# pitfall, and installs its Python package into <site-packages>/<name>. For this repository, <VENV>/share/oxygen_ros/
# launch and config end up as symlinks to the repository's launch/ and config/ (edited files are the ones that run).
# Quiet unless it fails; idempotent; re-runs are incremental (build tree in build/msgs, build/<name> for SRC;
# under build/<venv name>/ for a venv other than .venv).
# On a real ROS 2 robot use colcon instead.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-${VIRTUAL_ENV:-$repo/.venv}}"
venv="$(cd "$venv" && pwd)"
src="$(cd "${2:-$repo}" && pwd)"
python="$venv/bin/python"
# One build tree per venv (.venv: build/msgs, build/<name>; another venv, e.g. .venv-jazzy: build/.venv-jazzy/...),
# so that building for Kilted and for Jazzy in turn stays incremental instead of starting over each time.
builds="$repo/build"
if [[ "$venv" != "$repo/.venv" ]]; then builds="$repo/build/$(basename "$venv")"; fi
if [[ "$src" == "$repo" ]]; then
  name=oxygen_ros
  build="$builds/msgs"
  extra_args=(-DOXYGEN_ROS_INSTALL_PYTHON_SOURCES=OFF)
  smoke="from oxygen_ros.msg import ActionChunk, LanguageOutput; from oxygen_ros.action import Ask, RunTask"
else
  name="$(basename "$src")"
  build="$builds/$name"
  extra_args=(-DCMAKE_PROJECT_INCLUDE="$repo/tools/wheel_include_fix.cmake")
  smoke="import $name"
  for kind in msg srv action; do
    if [[ -d "$src/$kind" ]]; then smoke="$smoke, $name.$kind"; fi
  done
fi
log="$build/build_msgs.log"

if [[ ! -x "$python" ]]; then
  echo "build_msgs.sh: no Python at $python (create the venv first: make setup)" >&2
  exit 1
fi
if ! command -v cmake >/dev/null 2>&1; then
  echo "build_msgs.sh: cmake not found (apt-get install cmake, or pip install cmake)" >&2
  exit 1
fi

mkdir -p "$build"
: >"$log"

run() {
  if ! "$@" >>"$log" 2>&1; then
    echo "build_msgs.sh: FAILED: $*" >&2
    tail -n 60 "$log" >&2
    echo "build_msgs.sh: full log: $log" >&2
    exit 1
  fi
}

# The wheels' CMake packages live under $venv/share/<pkg>/cmake; ament resolves packages via AMENT_PREFIX_PATH.
export VIRTUAL_ENV="$venv"
export PATH="$venv/bin:$PATH"
export AMENT_PREFIX_PATH="$venv${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
export CMAKE_PREFIX_PATH="$venv${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
# The ROS wheels' shared libraries (also needed by the generators at build time).
export LD_LIBRARY_PATH="$venv/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# A build tree configured for another venv or source dir is stale: start it over.
cache="$build/CMakeCache.txt"
if [[ -f "$cache" ]] && ! { grep -qx "CMAKE_INSTALL_PREFIX:PATH=$venv" "$cache" &&
  grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$src" "$cache"; }; then
  rm -rf "$build"
  mkdir -p "$build"
  : >"$log"
fi

generator=()
if [[ ! -f "$cache" ]] && command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)
fi

run cmake -S "$src" -B "$build" ${generator[@]+"${generator[@]}"} \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$venv" \
  -DPython3_EXECUTABLE="$python" \
  -DPython3_FIND_VIRTUALENV=ONLY \
  -DBUILD_TESTING=OFF \
  "${extra_args[@]}"
run cmake --build "$build" --parallel "$(nproc 2>/dev/null || echo 2)"
share="$venv/share/oxygen_ros"
if [[ "$src" == "$repo" ]]; then
  for dir in launch config; do  # links of an earlier run: cmake must not install through them
    if [[ -L "$share/$dir" ]]; then rm "$share/$dir"; fi
  done
fi
run cmake --install "$build"
if [[ "$src" == "$repo" ]]; then
  # The share copies of launch/ and config/ (cmake's, and `pip install -e .`'s data_files) become links to the
  # repository's directories: the launch file and the presets that run are always the checked-out ones.
  for dir in launch config; do
    rm -rf "${share:?}/$dir"
    ln -s "$repo/$dir" "$share/$dir"
  done
fi

# Smoke check (from the repository root, so it also holds before `pip install -e .`): the installed package
# imports (for this repository: the installed messages merge into the repository's oxygen_ros package).
if ! (cd "$repo" && "$python" -c "$smoke") >>"$log" 2>&1; then
  echo "build_msgs.sh: built, but '$smoke' fails in $venv" >&2
  tail -n 30 "$log" >&2
  exit 1
fi
