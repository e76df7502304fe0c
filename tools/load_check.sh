#!/usr/bin/env bash
# Run a pytest selection K times in a row beside N CPU-bound hog processes (bounded in time, killed at exit) and
# print pass/fail and the wall time of each round (oxygen_ros/testing/load.py; docs/evaluation-determinism.md).
#   tools/load_check.sh [--hogs N] [--rounds K] [--log-dir DIR] -- test/test_safety.py test/test_launch.py
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
exec "$PY" -m oxygen_ros.testing.load "$@"
