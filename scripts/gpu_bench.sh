#!/usr/bin/env bash
# Headline points of the OxyGen evaluation on one CUDA GPU: the full pi05 config (random weights) in bf16.
#
#   scripts/gpu_bench.sh              -> runs/gpu/{points.jsonl, summary.json, summary.md, headline*.png, ...}
#   CONFIG=tiny DEVICE=cpu FRAMES=2 GRAPHS=static OUT=/tmp/gpu scripts/gpu_bench.sh   # rehearse it without a GPU
#
# Points: N=30 isolated / oxygen k=1 / oxygen k=5 and N=5 isolated / shared_kv (the issue's headline), plus the
# memory suite (shared_kv and parallel at N=30, torch.cuda.max_memory_allocated per point). Three passes, each
# under its own timeout so the earlier results stand whatever happens later:
#   1. oxygen_ros.bench.sweep, eager (torch.compile off): headline + memory;
#   2. oxygen_ros.bench.frame_overhead -> $OUT/frame_overhead: eager / fused / captured-CUDA-graph stages
#      (prefill, the S-step denoise loop, decode at B=1/6/30: graphs_speedup), oxygen vs isolated at N=30 (k=5)
#      with speculation off and on (random weights reject the drafts: its overhead) and with graphs off and on
#      (GRAPHS=cuda: engine/graphs.py, captured on first use per bucket), median-based frame statistics and host
#      stalls, and speculation on/off on the toy model's continuous memory stream (tokens/s, request latency in
#      frames). PRECISION=bfloat16_islands (default) is openpi's bf16 with float32 islands (engine/precision.py);
#   3. the headline points again with torch.compile (mode "default"); its summary adds the compiled points and
#      speedup_vs_compile_off.
# Runs from the working tree (PYTHONPATH=.) with what the machine has (python, torch, numpy, safetensors);
# installs nothing. Without matplotlib there, the JSON and summary.md are written but no PNG: draw them later
# with `python -m oxygen_ros.bench.sweep_plots runs/gpu`. Expected wall time on an H100/H200: model build
# ~0.5-1 min per pass, eager points ~1-2 min, compilation ~1-3 min: under 8 minutes (the timeouts cap it at 7.8).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-runs/gpu}
CONFIG=${CONFIG:-pi05}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
FRAMES=${FRAMES:-20}
PRECISION=${PRECISION:-bfloat16_islands}
GRAPHS=${GRAPHS:-cuda}  # the graphs backend of pass 2 (static / compile to rehearse on a CPU)
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"

command -v nvidia-smi >/dev/null && nvidia-smi
"$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
  "cuda", torch.version.cuda, "available", torch.cuda.is_available())'

ARGS=(--mode full --config "$CONFIG" --device "$DEVICE" --dtype "$DTYPE" --frames "$FRAMES" --out "$OUT")
start=$SECONDS
timeout 200 "$PYTHON" -m oxygen_ros.bench.sweep "${ARGS[@]}" --suite headline memory --compile off \
  || echo "eager pass failed or timed out (rc=$?)"
echo "eager pass: $((SECONDS - start)) s"
timeout 150 "$PYTHON" -m oxygen_ros.bench.frame_overhead --config "$CONFIG" --device "$DEVICE" --dtype "$DTYPE" \
  --precision "$PRECISION" --repeats 7 --k 5 --frames "$((FRAMES / 2 > 2 ? FRAMES / 2 : 2))" --episodes 2 \
  --graphs "$GRAPHS" --engine-graphs "$GRAPHS" --out "$OUT/frame_overhead" \
  || echo "frame-overhead pass failed or timed out (rc=$?)"
echo "frame-overhead pass: $((SECONDS - start)) s"
timeout 120 "$PYTHON" -m oxygen_ros.bench.sweep "${ARGS[@]}" --suite headline memory --compile off default \
  || echo "compile pass failed or timed out (rc=$?): the eager results stand"
echo "total: $((SECONDS - start)) s"

"$PYTHON" -c "import matplotlib" 2>/dev/null \
  || echo "no matplotlib here, so no PNG: run python -m oxygen_ros.bench.sweep_plots $OUT on a workstation"
cat "$OUT/summary.md" 2>/dev/null || echo "no summary written"
cat "$OUT/frame_overhead/summary.md" 2>/dev/null || echo "no frame-overhead summary written"
