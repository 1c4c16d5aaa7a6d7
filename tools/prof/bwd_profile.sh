#!/usr/bin/env bash
# Nsight Compute profile of the Hopper dK dV kernel (the backward's main kernel) on the GPT-OSS full layer and the
# MHA layer of bench/RESULTS.md (bf16, b 2, s 4096, causal), through `sinkattn bench` (one timed iteration, no
# warm-up: ncu replays the one launch it profiles). Writes under $OUT (default ./prof-out):
#   bwd_<layer>.kernels.txt every kernel of one forward + backward call and its duration (gpu__time_duration)
#   bwd_<layer>.txt       the details page (speed of light, compute / memory workload, warp states, occupancy)
#   bwd_<layer>_sass.txt  the SASS lines with the most warp-stall samples (top 60, with their stall reasons)
# Layers "gptoss-det" / "mha-det": the same with the deterministic backward (deterministic = 1).
# Layers "gptoss-bias" / "mha-bias" ("gptoss-dropout" / "mha-dropout") are the bias (dropout) rows of tests/gpu/gpu_bench.cpp (one rep: its warm-up and timed calls
# of the forward and of both backward modes are all listed), as is "bench:SHAPE" (any row of it), run from BENCH (default
# $BUILD_DIR/tests/gpu/sinkattn_gpu_bench).
# Env: BUILD_DIR (default build-cuda; its cli/sinkattn and libsinkattn), LAYERS (default "gptoss mha"),
#      KERNEL (the kernel the details and SASS pages profile, an ncu -k filter; default regex:bwd_dkdv_sm90; e.g.
#      regex:fwd_sm90_ws for the forward of the bias rows), KERNELS_ONLY=1 (only the per-kernel durations),
#      PROF_ENV (extra environment for the profiled process, e.g. "SINKATTN_CUDA_NO_TMA=1"), TAG (file suffix).
# ncu gets --clock-control none (device/METHOD.md: leave the clocks alone).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/prof-out}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-cuda}
CLI=$BUILD_DIR/cli/sinkattn
BENCH=${BENCH:-$BUILD_DIR/tests/gpu/sinkattn_gpu_bench}
TAG=${TAG:-}
export LD_LIBRARY_PATH="$PWD/$BUILD_DIR:${LD_LIBRARY_PATH:-}"
for layer in ${LAYERS:-gptoss mha}; do
  case $layer in
    gptoss) cmd="$CLI bench --preset gpt-oss-20b --layer full" ;;
    mha) cmd="$CLI bench --preset llama3-8b" ;;
    gptoss-det) cmd="$CLI bench --preset gpt-oss-20b --layer full --deterministic" ;;
    mha-det) cmd="$CLI bench --preset llama3-8b --deterministic" ;;
    gptoss-bias) cmd="$BENCH 1 gpt-oss-full+bias" ;;
    mha-bias) cmd="$BENCH 1 mha-d128+bias" ;;
    gptoss-dropout) cmd="$BENCH 1 gpt-oss-full+dropout" ;;
    mha-dropout) cmd="$BENCH 1 mha-d128+dropout" ;;
    bench:*) cmd="$BENCH 1 ${layer#bench:}" ;;  # any tests/gpu/gpu_bench.cpp row, e.g. bench:mha-d128
    *) echo "unknown layer $layer"; continue ;;
  esac
  run_args=""
  [[ $layer == *-bias || $layer == *-dropout || $layer == bench:* ]] || run_args="--batch 2 --seqlen 4096 --iters 1 --warmup 0 --backend cuda"
  rep=$OUT/bwd_${layer#bench:}${TAG}
  # every kernel of one forward + backward call, with its duration (the backward's small kernels included)
  # shellcheck disable=SC2086
  env ${PROF_ENV:-} ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    $cmd $run_args 2>/dev/null | python3 tools/prof/ncu_durations.py >"$rep.kernels.txt"
  echo "== kernels of one call ($layer$TAG):"
  cat "$rep.kernels.txt"
  [ "${KERNELS_ONLY:-0}" = 1 ] && continue
  # shellcheck disable=SC2086
  env ${PROF_ENV:-} ncu --clock-control none -k "${KERNEL:-regex:bwd_dkdv_sm90}" -c 1 --set full --import-source no -f -o "$rep" \
    $cmd $run_args >"$rep.log" 2>&1 ||
    { echo "ncu failed for $layer"; tail -20 "$rep.log"; continue; }
  ncu -i "$rep.ncu-rep" --page details >"$rep.txt" 2>&1
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.sass.csv" 2>/dev/null
  python3 - "$rep.sass.csv" >"${rep}_sass.txt" <<'EOF'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
# the page starts with a "Kernel Name" line; the header is the first row that names the Source column
start = next((k for k, r in enumerate(rows) if "Source" in r), None)
if start is None:
    sys.exit("no source page")
hdr = rows[start]
rows = rows[start:]
def col(name):
    for i, h in enumerate(hdr):
        if h == name:
            return i
    return None
src = col("Source")
samp = col("Warp Stall Sampling (All Samples)")
stall_cols = [i for i, h in enumerate(hdr) if "stall" in h.lower() and "Sampling" not in h]
if samp is None:
    print("columns:", hdr)
    sys.exit(0)
body = [r for r in rows[1:] if len(r) == len(hdr)]
def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0
total = sum(num(r[samp]) for r in body)
print(f"total stall samples {total:.0f} over {len(body)} SASS lines")
for r in sorted(body, key=lambda r: -num(r[samp]))[:60]:
    reasons = sorted(((num(r[i]), hdr[i]) for i in stall_cols if num(r[i]) > 0), reverse=True)[:3]
    print(f"{num(r[samp]):7.0f} {100 * num(r[samp]) / max(total, 1):5.1f}%  {r[src][:90]:90s} "
          + " ".join(f"{n}:{v:.0f}" for v, n in reasons))
EOF
  rm -f "$rep.sass.csv"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|L1/TEX Hit|L2 Hit|Bank" \
    "$rep.txt" | head -20
done
