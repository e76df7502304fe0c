#!/usr/bin/env bash
# The GPU check and benchmark, in one call of at most ~7 minutes on an H100/H200 (docs/gpu.md):
#
#   OUT=$OUT scripts/gpu_bench.sh                                          # on a GPU (the device tool's $OUT)
#   DEVICE=cpu CONFIG=tiny GRAPHS=static OUT=/tmp/gpu scripts/gpu_bench.sh   # rehearse it on a CPU (test_gpu_bench.py)
#
# 1. the CUDA tests (test/test_cuda.py, marker cuda): captured vs eager steps in every mode, RTC as a captured step,
#    bfloat16_islands on the device; each measured difference into cuda_tests.jsonl as it is measured;
# 2. oxygen_ros.bench.gpu_suite: the full pi05 in bfloat16_islands (random weights, humanoid shapes), the shipped
#    default engine first, then the headline points, stage latencies eager vs captured, a node-shaped frame and
#    memory, each result appended to results.jsonl the moment it exists (stages stop by their own budgets);
# 3. summary.md from whatever exists, even after a timeout.
# Each pass runs under its own timeout, so whatever happens later the earlier results stand. At most 8 files under
# $OUT, none deeper than $OUT/: env.txt, tests.xml, cuda_tests.jsonl, results.jsonl, summary.md (+ the caller's log).
# Runs from the working tree (PYTHONPATH=.) on what the machine has: torch, numpy, pytest (no PIL, sentencepiece,
# rclpy or matplotlib needed; nothing installed).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-runs/gpu}
CONFIG=${CONFIG:-pi05}
DEVICE=${DEVICE:-cuda}
GRAPHS=${GRAPHS:-cuda}
PRECISION=${PRECISION:-bfloat16_islands}
FRAMES=${FRAMES:-20}
REPEATS=${REPEATS:-7}
TESTS_TIMEOUT=${TESTS_TIMEOUT:-100}   # seconds for pass 1
SUITE_BUDGET=${SUITE_BUDGET:-270}     # seconds the suite plans its stages in (build included)
SUITE_TIMEOUT=${SUITE_TIMEOUT:-$((SUITE_BUDGET + 40))}  # the hard stop of pass 2
STAGES=${STAGES:-default headline stages node memory}  # gpu_suite's stages, in this order
TESTS_SELECT=${TESTS_SELECT:-}        # a pytest -k expression (the rehearsal runs a subset)
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
start=$SECONDS

{
  date -u
  command -v nvidia-smi >/dev/null && nvidia-smi
  "$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
    "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
    torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
  git log -1 --oneline 2>/dev/null
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

echo "== pass 1: CUDA tests (timeout ${TESTS_TIMEOUT} s)"
rehearse=$([ "$DEVICE" = cpu ] && echo 1 || echo 0)
OXYGEN_CUDA_REHEARSAL=$rehearse OXYGEN_CUDA_REPORT="$OUT/cuda_tests.jsonl" \
  timeout "$TESTS_TIMEOUT" "$PYTHON" -m pytest -q -rA -m cuda test/test_cuda.py -p no:cacheprovider \
  ${TESTS_SELECT:+-k "$TESTS_SELECT"} --junitxml="$OUT/tests.xml" || echo "CUDA tests failed or timed out (rc=$?)"
echo "pass 1: $((SECONDS - start)) s"

echo "== pass 2: gpu_suite (budget ${SUITE_BUDGET} s, timeout ${SUITE_TIMEOUT} s)"
timeout "$SUITE_TIMEOUT" "$PYTHON" -m oxygen_ros.bench.gpu_suite --out "$OUT" --config "$CONFIG" --device "$DEVICE" \
  --graphs "$GRAPHS" --precision "$PRECISION" --frames "$FRAMES" --repeats "$REPEATS" --budget-s "$SUITE_BUDGET" \
  --stages $STAGES \
  || echo "gpu_suite failed or timed out (rc=$?): the results written before stand"
echo "pass 2: $((SECONDS - start)) s"

"$PYTHON" -m oxygen_ros.bench.gpu_suite --out "$OUT" --summarize || echo "no summary (rc=$?)"
echo "total: $((SECONDS - start)) s"
cat "$OUT/summary.md" 2>/dev/null
