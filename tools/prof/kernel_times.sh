#!/usr/bin/env bash
# Per-kernel GPU durations (ncu gpu__time_duration, clocks left alone) of `sinkattn_gpu_bench 1 SHAPE` for each
# library build in $AB_DIR (tools/gpu-ab.sh's layout: AB_DIR/NAME.so.xz, unpacked by `gpu-ab.sh unpack`) and each
# SHAPE: one line per kernel launch (warm-up, forward, backward, deterministic backward), for the per-kernel share
# of a layer's time (bench/RESULTS.md). Usage: tools/prof/kernel_times.sh SHAPE... (device).
set -u
cd "$(dirname "$0")/../.."
AB_DIR=$(realpath -m "${AB_DIR:-build-ab}")
AB_DIR="$AB_DIR" tools/gpu-ab.sh unpack
for f in "$AB_DIR"/*.so.xz; do
  name=$(basename "$f" .so.xz)
  for shape in "$@"; do
    echo "== $name $shape"
    LD_LIBRARY_PATH="$AB_DIR/$name" timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      "$AB_DIR/sinkattn_gpu_bench" 1 "$shape" 2>/dev/null | python3 tools/prof/ncu_durations.py
  done
done
