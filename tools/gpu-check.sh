#!/usr/bin/env bash
# One command for a GPU machine: build (or reuse a carried build), run the GPU suite (edge cases + randomized
# sweep against the CPU backend and the float64 reference), compute-sanitizer memcheck and racecheck on small
# cases, determinism (inside the suite: bitwise repeats of deterministic calls), and the benchmarks
# (sinkattn_gpu_bench, `sinkattn bench --backend cuda` when the command is built, bench/bench_torch.py).
# Logs go to $OUT (default ./gpu-check-out): build.log suite.log sanitizer.log bench.log bench_torch.log summary.txt
#
# Environment: BUILD_DIR (default build-gpu; a carried build dir such as build-cuda is used as is when its
# binaries run here), CUDA_ARCHS (default 90a when building here), SWEEP (default 500), SEED (default: time),
# STEPS (default "suite sanitizer bench torch"), JOBS (default nproc).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-gpu}
SWEEP=${SWEEP:-500}
SEED=${SEED:-$(date +%s)}
STEPS=${STEPS:-"suite sanitizer bench torch"}
JOBS=${JOBS:-$(nproc)}
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
export LD_LIBRARY_PATH="$PWD/$BUILD_DIR:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"

note "gpu-check $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo none)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$SUMMARY"

SUITE=$BUILD_DIR/tests/gpu/sinkattn_gpu_suite
BENCH=$BUILD_DIR/tests/gpu/sinkattn_gpu_bench
if [ -x "$SUITE" ] && ! ldd "$SUITE" | grep -q "not found"; then
  note "build: using prebuilt binaries in $BUILD_DIR"
else
  BUILD_DIR=build-gpu
  export LD_LIBRARY_PATH="$PWD/$BUILD_DIR:$LD_LIBRARY_PATH"
  SUITE=$BUILD_DIR/tests/gpu/sinkattn_gpu_suite
  BENCH=$BUILD_DIR/tests/gpu/sinkattn_gpu_bench
  t0=$(date +%s)
  {
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" \
      -DSINKATTN_BUILD_TESTS=ON -DSINKATTN_BUILD_CLI=${BUILD_CLI:-ON} &&
      ninja -C "$BUILD_DIR" -j"$JOBS" sinkattn_gpu_suite sinkattn_gpu_bench &&
      { [ "${BUILD_CLI:-ON}" = OFF ] || ninja -C "$BUILD_DIR" -j"$JOBS" sinkattn || true; }
  } >"$OUT/build.log" 2>&1
  rc=$?
  note "build: rc=$rc in $(($(date +%s) - t0)) s (log build.log)"
  [ $rc -eq 0 ] || { tail -30 "$OUT/build.log"; exit 1; }
fi

status=0
if [[ " $STEPS " == *" suite "* ]]; then
  t0=$(date +%s)
  timeout "${SUITE_TIMEOUT:-300}" "$SUITE" --cases tests/gpu/cases/edge-cases.json --sweep "$SWEEP" --seed "$SEED" \
    >"$OUT/suite.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  note "suite: rc=$rc in $(($(date +%s) - t0)) s; $(grep -c '^FAIL' "$OUT/suite.log") failing; $(grep SUMMARY "$OUT/suite.log")"
  grep -A4 '^FAIL' "$OUT/suite.log" | head -60 | tee -a "$SUMMARY"
fi

if [[ " $STEPS " == *" sanitizer "* ]]; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  : >"$OUT/sanitizer.log"
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    n=12; [ $tool = racecheck ] && n=4
    timeout "${SAN_TIMEOUT:-120}" "$CS" --tool $tool --error-exitcode 3 "$SUITE" --small --no-cases --sweep $n \
      --seed "$SEED" >>"$OUT/sanitizer.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || status=1
    note "compute-sanitizer $tool: rc=$rc in $(($(date +%s) - t0)) s; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.log" | tail -1)"
  done
fi

if [[ " $STEPS " == *" bench "* ]]; then
  {
    timeout 120 "$BENCH" 20
    if [ -x "$BUILD_DIR/cli/sinkattn" ]; then
      for preset in gpt-oss-20b llama3-8b; do
        timeout 180 "$BUILD_DIR/cli/sinkattn" bench --backend cuda --preset $preset --dtype bf16 --batch 2 --seqlen 4096 || true
      done
    fi
  } >"$OUT/bench.log" 2>&1
  note "bench: $(grep -c . "$OUT/bench.log") lines (bench.log)"
  tee -a "$SUMMARY" <"$OUT/bench.log" | tail -8
fi

if [[ " $STEPS " == *" torch "* ]]; then
  PYTHONUNBUFFERED=1 timeout "${TORCH_TIMEOUT:-240}" python3 bench/bench_torch.py >"$OUT/bench_torch.log" 2>&1
  note "bench_torch: rc=$? (bench_torch.log)"
  tail -12 "$OUT/bench_torch.log" | tee -a "$SUMMARY"
fi
note "gpu-check: status=$status"
exit $status
