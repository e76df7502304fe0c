#!/usr/bin/env bash
# Build the oxygen_ros messages (msg/*.msg) with plain cmake against the ROS 2 PyPI wheels and install
# them into a virtual environment's prefix, so that `from oxygen_ros.msg import ActionChunk` works there.
#
#   bash tools/build_msgs.sh [VENV]     VENV defaults to $VIRTUAL_ENV, else .venv next to this repo
#
# Only the messages are installed (-DOXYGEN_ROS_INSTALL_PYTHON_SOURCES=OFF, see CMakeLists.txt): the Python
# sources come from the repository through `pip install -e .`; the generated oxygen_ros.msg lands in
# <site-packages>/_oxygen_ros_msgs/oxygen_ros, which <site-packages>/oxygen_ros.pkg adds to the package via
# pkgutil.extend_path in oxygen_ros/__init__.py. Nothing pip owns is touched, so the order relative to
# `pip install -e .` does not matter (make setup runs it after the pip installs). Quiet unless it fails;
# idempotent; re-runs are incremental (build tree in build/msgs). On a real ROS 2 robot use colcon instead.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-${VIRTUAL_ENV:-$repo/.venv}}"
venv="$(cd "$venv" && pwd)"
python="$venv/bin/python"
build="$repo/build/msgs"
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
  grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$repo" "$cache"; }; then
  rm -rf "$build"
  mkdir -p "$build"
  : >"$log"
fi

generator=()
if [[ ! -f "$cache" ]] && command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)
fi

run cmake -S "$repo" -B "$build" ${generator[@]+"${generator[@]}"} \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$venv" \
  -DPython3_EXECUTABLE="$python" \
  -DPython3_FIND_VIRTUALENV=ONLY \
  -DBUILD_TESTING=OFF \
  -DOXYGEN_ROS_INSTALL_PYTHON_SOURCES=OFF
run cmake --build "$build" --parallel "$(nproc 2>/dev/null || echo 2)"
run cmake --install "$build"

# Smoke check (from the repository root, so it also holds before `pip install -e .`): the installed
# messages merge into the repository's oxygen_ros package.
if ! (cd "$repo" && "$python" -c "from oxygen_ros.msg import ActionChunk, LanguageOutput") >>"$log" 2>&1; then
  echo "build_msgs.sh: built, but 'from oxygen_ros.msg import ActionChunk, LanguageOutput' fails in $venv" >&2
  tail -n 30 "$log" >&2
  exit 1
fi
