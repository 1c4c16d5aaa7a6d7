#!/usr/bin/env bash
# One command for a GPU machine: build (or reuse a carried build), run the GPU suite (edge cases + randomized
# sweep: the CUDA pipeline judged by SPEC.md section 5 against the float64 reference, the CPU backend on the
# same inputs as extra evidence; its SUMMARY line ends with the worst err / tolerance per output),
# compute-sanitizer memcheck and racecheck on small cases, determinism (inside the suite: bitwise repeats of
# deterministic calls), and the benchmarks (sinkattn_gpu_bench's every row, sinkattn_gpu_bench_philox, `sinkattn
# bench --backend cuda` when the command is built, bench/bench_torch.py), and, with "python" in STEPS,
# tools/gpu-python-check.sh (the Python package built with CUDA: pytest + example), and with "cp" in STEPS,
# tools/gpu-cp-check.sh (context parallelism on all GPUs of the machine: the ring / all-to-all / sharding tests and
# bench/bench_context_parallel.py; NCCL_NVLS_ENABLE=0).
# With "torchop" in STEPS, tools/gpu-torch-check.sh (the PyTorch operators: torch tests on the GPU, op vs
# FlexAttention / SDPA / the C ABI, host overhead, the HF GPT-OSS example; TORCH_STEPS selects its parts).
# With "determinism" in STEPS, sinkattn_gpu_determinism (bitwise repeats of the deterministic backward on large
# shapes, its agreement with the default backward, its time against it) plus an A/B of the deterministic backward
# against the sm_80 kernels (sinkattn_gpu_bench with SINKATTN_CUDA_DET_SM80=1: its "bwd det ms" / "det x" columns).
# The suite covers fp16, bf16 and fp32 (the CUDA backend's SIMT fp32 path): fp32 edge cases run in fp32 and
# about 15% of the sweep is fp32; its SUMMARY line counts configurations per dtype.
# Everything runs in this one call (one device `run`): put the steps you need in STEPS.
# Decode and paged KV (issue 13): STEPS "decode" runs sinkattn_gpu_decode (decode kernels and paged KV against the
# float64 reference, split counts, CUDA-graph capture) and compute-sanitizer memcheck + racecheck on its --small
# cases; "decode_bench" runs sinkattn_gpu_bench_decode (GPT-OSS-120B decode speed against the copy bandwidth and a
# streaming-read kernel over each configuration's bytes, for bench/RESULTS.md; DECODE_ITERS replays, default 50;
# DECODE_ARGS more arguments, word-split: a filter such as "sliding,b256", "--sweep-splits" to time every
# configuration with forced split counts 1-128 too); "paged_bench" runs sinkattn_gpu_bench_paged_prefill (a prefill
# chunk's forward through a page table against the same call on a contiguous cache; PAGED_ITERS calls, default 20,
# PAGED_ARGS a layer filter).
# STEPS "concurrency" (in the default steps) runs sinkattn_gpu_concurrency: 8 host threads, one stream each, forward +
# backward on different and shared inputs, bitwise equal to single-threaded runs, sinkattn_last_error per thread.
# Logs go to $OUT (default ./gpu-check-out): build.log suite.log sanitizer.log bench.log bench_torch.log; the
# benchmarks' JSON (gpu_bench.json, bench_torch.json, gpu_bench_decode.json) is what tools/results_dashboard.py add
# takes into bench/RESULTS.md
# (concurrency: concurrency.log; python: py_install.log pytest.log example.log example_bench.log; decode: decode.log
# decode_sanitizer.log;
# decode_bench: gpu_bench_decode.log; paged_bench: gpu_bench_paged_prefill.log; determinism: determinism.log bench_det_sm80.log) summary.txt
#
# Environment: BUILD_DIR (default build-gpu; a carried build dir such as build-cuda is used as is when its
# binaries run here), CUDA_ARCHS (default 90a when building here), SWEEP (default 500), SEED (default: time),
# STEPS (default "suite sanitizer decode concurrency bench torch"; optional: python, cp, torchop, decode_bench,
# determinism),
# SAN_MATCH (edge cases the sanitizer step runs besides its small sweep: names containing it, default "bias"; empty:
# none), SAN_TOOLS (the compute-sanitizer tools for those, default "memcheck racecheck synccheck"), JOBS (default
# nproc), SUITE_TIMEOUT (default 420), PYTHON_TIMEOUT (default 420), DECODE_TIMEOUT (300),
# DECODE_BENCH_TIMEOUT (540), DECODE_ITERS (50), DECODE_ARGS (none).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-gpu}
SWEEP=${SWEEP:-500}
SEED=${SEED:-$(date +%s)}
STEPS=${STEPS:-"suite sanitizer decode concurrency bench torch"}
JOBS=${JOBS:-$(nproc)}
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
export LD_LIBRARY_PATH="$PWD/$BUILD_DIR:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"

note "gpu-check $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo none)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$SUMMARY"

SUITE=$BUILD_DIR/tests/gpu/sinkattn_gpu_suite
BENCH=$BUILD_DIR/tests/gpu/sinkattn_gpu_bench
DECODE=$BUILD_DIR/tests/gpu/sinkattn_gpu_decode
DECODE_BENCH=$BUILD_DIR/tests/gpu/sinkattn_gpu_bench_decode
PAGED_BENCH=$BUILD_DIR/tests/gpu/sinkattn_gpu_bench_paged_prefill
DETERMINISM=$BUILD_DIR/tests/gpu/sinkattn_gpu_determinism
PHILOX=$BUILD_DIR/tests/gpu/sinkattn_gpu_bench_philox
CONCURRENCY=$BUILD_DIR/tests/gpu/sinkattn_gpu_concurrency
if [ -x "$SUITE" ] && [ -x "$DECODE" ] && [ -x "$DECODE_BENCH" ] && [ -x "$CONCURRENCY" ] && ! ldd "$SUITE" | grep -q "not found"; then
  note "build: using prebuilt binaries in $BUILD_DIR"
else
  BUILD_DIR=build-gpu
  export LD_LIBRARY_PATH="$PWD/$BUILD_DIR:$LD_LIBRARY_PATH"
  SUITE=$BUILD_DIR/tests/gpu/sinkattn_gpu_suite
  BENCH=$BUILD_DIR/tests/gpu/sinkattn_gpu_bench
  DECODE=$BUILD_DIR/tests/gpu/sinkattn_gpu_decode
  DECODE_BENCH=$BUILD_DIR/tests/gpu/sinkattn_gpu_bench_decode
  PAGED_BENCH=$BUILD_DIR/tests/gpu/sinkattn_gpu_bench_paged_prefill
  DETERMINISM=$BUILD_DIR/tests/gpu/sinkattn_gpu_determinism
  PHILOX=$BUILD_DIR/tests/gpu/sinkattn_gpu_bench_philox
  CONCURRENCY=$BUILD_DIR/tests/gpu/sinkattn_gpu_concurrency
  t0=$(date +%s)
  {
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" \
      -DSINKATTN_BUILD_TESTS=ON -DSINKATTN_BUILD_CLI=${BUILD_CLI:-ON} &&
      ninja -C "$BUILD_DIR" -j"$JOBS" sinkattn_gpu_suite sinkattn_gpu_bench sinkattn_gpu_decode sinkattn_gpu_bench_decode \
        sinkattn_gpu_bench_paged_prefill sinkattn_gpu_determinism sinkattn_gpu_bench_philox sinkattn_gpu_concurrency &&
      { [ "${BUILD_CLI:-ON}" = OFF ] || ninja -C "$BUILD_DIR" -j"$JOBS" sinkattn || true; }
  } >"$OUT/build.log" 2>&1
  rc=$?
  note "build: rc=$rc in $(($(date +%s) - t0)) s (log build.log)"
  [ $rc -eq 0 ] || { tail -30 "$OUT/build.log"; exit 1; }
fi

status=0
if [[ " $STEPS " == *" suite "* ]]; then
  t0=$(date +%s)
  timeout "${SUITE_TIMEOUT:-420}" "$SUITE" --cases tests/gpu/cases/edge-cases.json \
    --cases tests/gpu/cases/edge-cases-sinkattn.json --sweep "$SWEEP" --seed "$SEED" >"$OUT/suite.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  note "suite: rc=$rc in $(($(date +%s) - t0)) s; $(grep -c '^FAIL' "$OUT/suite.log") failing; $(grep SUMMARY "$OUT/suite.log")"
  grep -E '^  (reject|dropout)' "$OUT/suite.log" | tee -a "$SUMMARY"
  # Drift: per output, the worst err / tolerance of the CUDA pipeline and the configuration it came from.
  sed -n '/^-- worst err/,/^SUMMARY/p' "$OUT/suite.log" | grep -v '^SUMMARY' | tee -a "$SUMMARY"
  grep -A6 '^FAIL' "$OUT/suite.log" | head -80 | tee -a "$SUMMARY"
  # A CUDA-vs-CPU mismatch alone does not say which backend is wrong: the suite then judges the call by the float64
  # reference itself (SPEC.md section 5; "cpu backend SPEC 5" lines blame the CPU side). To rerun one sweep
  # configuration by hand: $SUITE --no-cases --seed $SEED --only K --ref -v
  # The fp32 cancellation cases (tests/gpu/CMakeLists.txt, gpu_suite_fp32_cancellation_*) on both backends.
  # (Counted by exit status: the suite prints "ok" lines only with -v.)
  ok=0
  for spec in "120404 250 148" "79 400 83"; do
    set -- $spec
    if "$SUITE" --no-cases --seed "$1" --sweep "$2" --only "$3" >>"$OUT/suite_fp32_cancellation.log" 2>&1; then
      ok=$((ok + 1))
    else
      status=1
    fi
  done
  note "fp32 cancellation cases: $ok of 2 passed (suite_fp32_cancellation.log)"
  # The forward's L2 sections (scheduler.hpp): the suite's shapes are too small for the dispatch to cut their heads
  # into sections, so the edge cases run again with one (head, sequence) pair per section.
  SINKATTN_CUDA_FWD_SECTION=1 timeout "${SUITE_TIMEOUT:-420}" "$SUITE" --cases tests/gpu/cases/edge-cases.json \
    --cases tests/gpu/cases/edge-cases-sinkattn.json --sweep 0 >"$OUT/suite_sections.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  note "suite, edge cases with SINKATTN_CUDA_FWD_SECTION=1: rc=$rc; $(grep SUMMARY "$OUT/suite_sections.log")"
fi

if [[ " $STEPS " == *" concurrency "* ]]; then
  t0=$(date +%s)
  timeout "${CONCURRENCY_TIMEOUT:-300}" "$CONCURRENCY" >"$OUT/concurrency.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  note "concurrency: rc=$rc in $(($(date +%s) - t0)) s; $(grep 'CONCURRENCY SUMMARY' "$OUT/concurrency.log")"
  grep '^FAIL' "$OUT/concurrency.log" | head -20 | tee -a "$SUMMARY"
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
  # The edge cases whose names contain SAN_MATCH (default "bias": the staged bias tiles of the Hopper kernels and
  # the d_bias workspace, which the small random sweep rarely reaches; "dropout": the dK dV kernel's keep producer
  # and its mbarrier handover), under SAN_TOOLS (default memcheck, racecheck, synccheck).
  if [ -n "${SAN_MATCH-bias}" ]; then
    for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
      t0=$(date +%s)
      timeout "${SAN_TIMEOUT:-120}" "$CS" --tool $tool --error-exitcode 3 "$SUITE" --small --match "${SAN_MATCH-bias}" \
        --sweep 0 >>"$OUT/sanitizer.log" 2>&1
      rc=$?
      [ $rc -eq 0 ] || status=1
      note "compute-sanitizer $tool, edge cases matching '${SAN_MATCH-bias}': rc=$rc in $(($(date +%s) - t0)) s; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.log" | tail -1)"
    done
  fi
fi

if [[ " $STEPS " == *" decode "* ]]; then
  t0=$(date +%s)
  timeout "${DECODE_TIMEOUT:-300}" "$DECODE" >"$OUT/decode.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  note "decode suite: rc=$rc in $(($(date +%s) - t0)) s; $(grep 'DECODE SUMMARY' "$OUT/decode.log")"
  grep -E '^FAIL' "$OUT/decode.log" | head -40 | tee -a "$SUMMARY"
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  : >"$OUT/decode_sanitizer.log"
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    timeout "${SAN_TIMEOUT:-240}" "$CS" --tool $tool --error-exitcode 3 "$DECODE" --small >>"$OUT/decode_sanitizer.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || status=1
    note "decode compute-sanitizer $tool: rc=$rc in $(($(date +%s) - t0)) s; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/decode_sanitizer.log" | tail -1)"
  done
fi

# A timing program's step: LABEL NAME TIMEOUT PROGRAM ARGS... runs PROGRAM ARGS --json $OUT/NAME.json into
# $OUT/NAME.log (ARGS are word-split by the caller on purpose: a filter, --sweep-splits), notes its status and time, and
# copies its table into the summary.
bench_step() {
  local label=$1 name=$2 limit=$3 t0 rc
  shift 3
  t0=$(date +%s)
  timeout "$limit" "$@" --json "$OUT/$name.json" >"$OUT/$name.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  note "$label: rc=$rc in $(($(date +%s) - t0)) s ($name.log)"
  tee -a "$SUMMARY" <"$OUT/$name.log"
}
if [[ " $STEPS " == *" decode_bench "* ]]; then
  bench_step "decode bench" gpu_bench_decode "${DECODE_BENCH_TIMEOUT:-540}" "$DECODE_BENCH" "${DECODE_ITERS:-50}" \
    ${DECODE_ARGS:-}
fi
if [[ " $STEPS " == *" paged_bench "* ]]; then
  bench_step "paged prefill bench" gpu_bench_paged_prefill "${PAGED_BENCH_TIMEOUT:-300}" "$PAGED_BENCH" \
    "${PAGED_ITERS:-20}" ${PAGED_ARGS:-}
fi

if [[ " $STEPS " == *" bench "* ]]; then
  {
    # every row of issue 12's table (the three layers, bias, dropout, head dim 256, s = 16384), then the RNG floor
    # of a dropout forward
    timeout 300 "$BENCH" 20 all --json "$OUT/gpu_bench.json"
    [ -x "$PHILOX" ] && timeout 60 "$PHILOX" 10
    if [ -x "$BUILD_DIR/cli/sinkattn" ]; then
      for preset in gpt-oss-20b llama3-8b; do
        timeout 180 "$BUILD_DIR/cli/sinkattn" bench --backend cuda --preset $preset --dtype bf16 --batch 2 --seqlen 4096 || true
      done
    fi
  } >"$OUT/bench.log" 2>&1
  note "bench: $(grep -c . "$OUT/bench.log") lines (bench.log)"
  tee -a "$SUMMARY" <"$OUT/bench.log" | tail -8
fi

if [[ " $STEPS " == *" determinism "* ]]; then
  t0=$(date +%s)
  timeout "${DET_TIMEOUT:-300}" "$DETERMINISM" --time >"$OUT/determinism.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  note "determinism: rc=$rc in $(($(date +%s) - t0)) s; $(grep SUMMARY "$OUT/determinism.log")"
  grep -E 'FAIL|time:|backward, deterministic = 1' "$OUT/determinism.log" | head -40 | tee -a "$SUMMARY"
  # The deterministic backward on the sm_80 kernels (dq kernel + dK dV kernel), for the A/B with the Hopper one
  # (bench.log's "bwd det ms" when STEPS has bench).
  SINKATTN_CUDA_DET_SM80=1 timeout 120 "$BENCH" 20 >"$OUT/bench_det_sm80.log" 2>&1
  note "bench with SINKATTN_CUDA_DET_SM80=1: rc=$? (bench_det_sm80.log)"
  tail -4 "$OUT/bench_det_sm80.log" | tee -a "$SUMMARY"
fi

if [[ " $STEPS " == *" torch "* ]]; then
  PYTHONUNBUFFERED=1 timeout "${TORCH_TIMEOUT:-240}" python3 bench/bench_torch.py --json "$OUT/bench_torch.json" \
    >"$OUT/bench_torch.log" 2>&1
  note "bench_torch: rc=$? (bench_torch.log)"
  tail -12 "$OUT/bench_torch.log" | tee -a "$SUMMARY"
fi
# A step that is a script of its own: step name, script, timeout in seconds.
script_step() {
  [[ " $STEPS " == *" $1 "* ]] || return 0
  local t0 rc
  t0=$(date +%s)
  OUT="$OUT" CUDA_ARCHS="${CUDA_ARCHS:-90a}" timeout "$3" bash "$2"
  rc=$?
  [ $rc -eq 0 ] || status=1
  note "$1 ($2): rc=$rc in $(($(date +%s) - t0)) s"
}
script_step python tools/gpu-python-check.sh "${PYTHON_TIMEOUT:-420}"
script_step cp tools/gpu-cp-check.sh "${CP_TIMEOUT:-590}"
script_step torchop tools/gpu-torch-check.sh "${TORCHOP_TIMEOUT:-590}"
note "gpu-check: status=$status"
exit $status
