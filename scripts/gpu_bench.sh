#!/usr/bin/env bash
# Headline points of the OxyGen evaluation on one CUDA GPU: the full pi05 config (random weights) in bf16.
#
#   scripts/gpu_bench.sh              -> runs/gpu/{points.jsonl, summary.json, summary.md, headline*.png, ...}
#   CONFIG=tiny DEVICE=cpu FRAMES=2 OUT=/tmp/gpu scripts/gpu_bench.sh     # rehearse it without a GPU
#
# Points: N=30 isolated / oxygen k=1 / oxygen k=5 and N=5 isolated / shared_kv (the issue's headline), plus the
# memory suite (shared_kv and parallel at N=30, torch.cuda.max_memory_allocated per point). Two passes of
# oxygen_ros.bench.sweep into the same resumable directory:
#   1. eager (torch.compile off): headline + memory;
#   2. the headline points again with torch.compile (mode "default"), under its own timeout, so the eager
#      results stand even if compilation is slow; its summary adds the compiled points and speedup_vs_compile_off.
# Runs from the working tree (PYTHONPATH=.) with what the machine has (python, torch, numpy, safetensors);
# installs nothing. Without matplotlib there, the JSON and summary.md are written but no PNG: draw them later
# with `python -m oxygen_ros.bench.sweep_plots runs/gpu`. Expected wall time on an H100/H200: model build
# ~0.5-1 min per pass, eager points ~1-2 min, compilation ~1-3 min: under 8 minutes (the timeouts cap it at 7.5).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-runs/gpu}
CONFIG=${CONFIG:-pi05}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
FRAMES=${FRAMES:-20}
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"

command -v nvidia-smi >/dev/null && nvidia-smi
"$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
  "cuda", torch.version.cuda, "available", torch.cuda.is_available())'

ARGS=(--mode full --config "$CONFIG" --device "$DEVICE" --dtype "$DTYPE" --frames "$FRAMES" --out "$OUT")
start=$SECONDS
timeout 240 "$PYTHON" -m oxygen_ros.bench.sweep "${ARGS[@]}" --suite headline memory --compile off \
  || echo "eager pass failed or timed out (rc=$?)"
echo "eager pass: $((SECONDS - start)) s"
timeout 210 "$PYTHON" -m oxygen_ros.bench.sweep "${ARGS[@]}" --suite headline memory --compile off default \
  || echo "compile pass failed or timed out (rc=$?): the eager results stand"
echo "total: $((SECONDS - start)) s"

"$PYTHON" -c "import matplotlib" 2>/dev/null \
  || echo "no matplotlib here, so no PNG: run python -m oxygen_ros.bench.sweep_plots $OUT on a workstation"
cat "$OUT/summary.md" 2>/dev/null || echo "no summary written"
