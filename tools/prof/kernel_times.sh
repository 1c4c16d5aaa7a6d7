#!/usr/bin/env bash
# Per-kernel GPU durations (ncu gpu__time_duration, clocks left alone) of `sinkattn_gpu_bench 1 SHAPE` for each
# library build in $AB_DIR (tools/gpu-ab.sh layout: AB_DIR/NAME/libsinkattn.so.0, unpacked by `gpu-ab.sh run` or
# here) and each SHAPE: one line per kernel launch (warm-up, forward, backward, deterministic backward), for the
# per-kernel share of a layer's time (bench/RESULTS.md). Usage: tools/prof/kernel_times.sh SHAPE... (device).
set -u
cd "$(dirname "$0")/../.."
AB_DIR=$(realpath -m "${AB_DIR:-build-ab}")
for f in "$AB_DIR"/*.so.xz; do
  name=$(basename "$f" .so.xz)
  if [ ! -f "$AB_DIR/$name/libsinkattn.so.0" ]; then
    mkdir -p "$AB_DIR/$name"
    python3 -c "import lzma, sys; open(sys.argv[2], 'wb').write(lzma.open(sys.argv[1]).read())" \
      "$f" "$AB_DIR/$name/libsinkattn.so.0"
  fi
  for shape in "$@"; do
    echo "== $name $shape"
    LD_LIBRARY_PATH="$AB_DIR/$name" timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      "$AB_DIR/sinkattn_gpu_bench" 1 "$shape" 2>/dev/null |
      python3 -c '
import csv, sys
rows = [r for r in csv.reader(sys.stdin) if len(r) > 10]
if rows:
    h = rows[0]
    kn, mv, mu = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
    for r in rows[1:]:
        print(f"{r[mv]:>12s} {r[mu]:8s} {r[kn][:110]}")
'
  done
done
