#!/usr/bin/env bash
# Step timelines of the Hopper dK dV kernel (src/cuda/hopper/step_trace.cuh) on rows of sinkattn_gpu_bench: each
# layer's bench row alone (3 reps: the default and the deterministic backward) against a profiling build of the
# library (-DSINKATTN_STEP_TRACE), the stamps of the last launch of each kernel summarised by tools/prof/step_trace.py.
# Env: LIB_DIR (the directory of the profiling build's libsinkattn.so.0, e.g. an unpacked tools/gpu-ab.sh library),
# BENCH (default build/tests/gpu/sinkattn_gpu_bench), LAYERS (default "gpt-oss-full mha-d128 gpt-oss-sliding"),
# OUT (default ./step-trace-out): OUT/LAYER/bench.txt (the profiling build's times: the stamps cost time, compare
# with the library's own; and the library's "step trace:" lines: each launch's grid, blocks recorded, stamps),
# dkdv_*.txt / .json (the summaries); the .bin stamps are removed unless KEEP_BIN=1.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/step-trace-out}
BENCH=${BENCH:-build/tests/gpu/sinkattn_gpu_bench}
LIB_DIR=${LIB_DIR:?LIB_DIR: the profiling build}
for layer in ${LAYERS:-gpt-oss-full mha-d128 gpt-oss-sliding}; do
  d=$OUT/$layer
  mkdir -p "$d"
  SINKATTN_STEP_TRACE_DIR=$d LD_LIBRARY_PATH="$LIB_DIR:${LD_LIBRARY_PATH:-}" \
    "$BENCH" 3 "=$layer" >"$d/bench.txt" 2>&1 || echo "step-trace: $layer: bench failed (status $?)"
  for f in "$d"/*.bin; do
    [ -e "$f" ] || continue
    python3 tools/prof/step_trace.py "$f" --json "${f%.bin}.json" >"${f%.bin}.txt" 2>&1
    echo "== $layer: $(basename "$f")"
    cat "${f%.bin}.txt"
    grep "step trace: $(basename "${f%.bin}"):" "$d/bench.txt" | tail -1
    [ "${KEEP_BIN:-0}" = 1 ] || rm -f "$f"
  done
done
