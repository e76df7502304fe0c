# The shell environment that `oxygen-launch` (this venv's `ros2 launch`) and the launched nodes need when ROS 2
# comes from the PyPI wheels in a venv (make setup) rather than from a distro:
#
#   . tools/ros_env.sh [VENV]                  set it in this shell (bash or zsh); VENV defaults to .venv here
#   eval "$(make -s env)"                      the same, through make (runs make setup first)
#   bash tools/ros_env.sh --print [VENV]       print the export lines
#
#   AMENT_PREFIX_PATH  VENV first: FindPackageShare / get_package_share_directory find oxygen_ros (and launch_ros
#                      finds its executables in VENV/lib/oxygen_ros)
#   PATH               VENV/bin first: the installed executables start with `#!/usr/bin/env python3`
#   LD_LIBRARY_PATH    VENV/lib and the wheels' ros_*.libs (what the venv's Python sets for itself on start-up;
#                      needed by non-Python tools such as `fastdds`)
#   VIRTUAL_ENV        VENV (what `activate` sets)
# Idempotent: sourcing it twice does not grow the paths. On a ROS 2 distro source its setup.bash instead.

_oxygen_env_main() {
  local print=0 script repo venv python libs entry
  if [[ "${1:-}" == "--print" ]]; then
    print=1
    shift
  fi
  script="${BASH_SOURCE[0]:-${(%):-%x}}"
  repo="$(cd "$(dirname "$script")/.." && pwd)"
  venv="${1:-$repo/.venv}"
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "ros_env.sh: no venv at $venv (run make setup first)" >&2
    return 1
  fi
  venv="$(cd "$venv" && pwd)"
  python="$(cd "$venv/lib" && ls -d python3* 2>/dev/null | head -n 1)"
  libs="$venv/lib"
  for entry in "$venv/lib/$python/site-packages"/ros_*.libs; do
    if [[ -d "$entry" ]]; then libs="$libs:$entry"; fi
  done

  _oxygen_prepend() {  # $1 = entries to put first (:-separated), $2 = current list: "$1:<$2 without them>"
    local rest=":${2}:" item
    local IFS=:
    for item in $1; do
      while [[ "$rest" == *":$item:"* ]]; do rest="${rest//:$item:/:}"; done
    done
    rest="${rest#:}"
    rest="${rest%:}"
    printf '%s' "$1${rest:+:$rest}"
  }
  local new_ament new_path new_ld
  new_ament="$(_oxygen_prepend "$venv" "${AMENT_PREFIX_PATH:-}")"
  new_path="$(_oxygen_prepend "$venv/bin" "${PATH:-}")"
  new_ld="$(_oxygen_prepend "$libs" "${LD_LIBRARY_PATH:-}")"
  unset -f _oxygen_prepend

  if [[ "$print" == 1 ]]; then
    printf 'export VIRTUAL_ENV=%q\n' "$venv"
    printf 'export AMENT_PREFIX_PATH=%q\n' "$new_ament"
    printf 'export PATH=%q\n' "$new_path"
    printf 'export LD_LIBRARY_PATH=%q\n' "$new_ld"
  else
    export VIRTUAL_ENV="$venv" AMENT_PREFIX_PATH="$new_ament" PATH="$new_path" LD_LIBRARY_PATH="$new_ld"
  fi
}

if [[ -n "${BASH_VERSION:-}" && "${BASH_SOURCE[0]}" == "$0" ]]; then
  # executed rather than sourced: only --print makes sense
  if [[ "${1:-}" != "--print" ]]; then
    echo "ros_env.sh: source it (. tools/ros_env.sh [VENV]) or run it with --print [VENV]" >&2
    exit 2
  fi
  _oxygen_env_main "$@" || exit 1
else
  _oxygen_env_main "$@"
fi
unset -f _oxygen_env_main
