#!/usr/bin/env bash
# Context parallelism on a GPU machine with one or more GPUs (device kinds nvidia-h200, -x2, -x4, -x8; no network):
# the Python package with the CUDA backend (prebuilt in SITE_DIR, or the install of tools/gpu-python-check.sh in
# /tmp/sinkattn-site, or built here), then
#   1. pytest of the context-parallel and sharding tests on all GPUs (meshes of 2, 4 and 8 devices run when that
#      many GPUs are present; bf16, SPEC.md section 5; the HLO test checks that the ring's collective-permutes run
#      asynchronously around the fused calls),
#   2. bench/bench_context_parallel.py (all-to-all and ring, GPT-OSS-20B-like layer, 32k / 128k / 512k tokens,
#      scaling efficiency; N = 2, 4, 8 up to the GPUs present, or N = 1 as a smoke test on one GPU).
# NVLink multicast stays off: NCCL_NVLS_ENABLE=0 (the device machines require it). XLA's latency-hiding scheduler on.
# Environment: SITE_DIR, CP_STEPS (default "pytest bench"), CP_BENCH_ARGS (extra arguments of the benchmark, e.g.
# "--contexts 32k,128k"), PYTEST_TIMEOUT (default 420), BENCH_TIMEOUT (default 540), CUDA_ARCHS (default 90a).
# Logs go to $OUT (default ./gpu-check-out): cp_pytest.log cp_bench.log cp_bench.jsonl, lines in summary.txt.
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
export XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true${XLA_FLAGS:+ $XLA_FLAGS}"
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SUMMARY=$OUT/summary.txt
note() { echo "$*" | tee -a "$SUMMARY"; }
note "gpu-cp-check $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo none);" \
  "$(nvidia-smi -L 2>/dev/null | wc -l) GPU(s); NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
. tools/gpu-py-site.sh
sinkattn_site reuse || exit 1
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
# the package's Python files from this tree (the prebuilt install may predate them); its libraries from SITE
rm -rf /tmp/sinkattn-cp-py && mkdir -p /tmp/sinkattn-cp-py && cp -r "$SITE/sinkattn" /tmp/sinkattn-cp-py/ &&
  cp python/sinkattn/jax/*.py /tmp/sinkattn-cp-py/sinkattn/jax/ && export PYTHONPATH=/tmp/sinkattn-cp-py:$PYTHONPATH
status=0
STEPS=${CP_STEPS:-pytest bench}
if [[ " $STEPS " == *" pytest "* ]]; then
  t0=$(date +%s)
  T=$PWD/tests/python
  (cd /tmp && timeout "${PYTEST_TIMEOUT:-420}" $PY -m pytest -q -p no:cacheprovider "$T/test_ring.py" \
    "$T/test_ulysses.py" "$T/test_sharding.py") >"$OUT/cp_pytest.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  note "context-parallel pytest (GPU): rc=$rc in $(($(date +%s) - t0)) s; $(tail -1 "$OUT/cp_pytest.log")"
  grep -E '^(FAILED|ERROR)' "$OUT/cp_pytest.log" | head -30 | tee -a "$SUMMARY"
fi
if [[ " $STEPS " == *" bench "* ]]; then
  t0=$(date +%s)
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 timeout "${BENCH_TIMEOUT:-540}" $PY bench/bench_context_parallel.py --json "$OUT/cp_bench.jsonl" \
    ${CP_BENCH_ARGS:-} >"$OUT/cp_bench.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  note "bench_context_parallel: rc=$rc in $(($(date +%s) - t0)) s (cp_bench.log, cp_bench.jsonl)"
  sed -n '/^| N |/,$p' "$OUT/cp_bench.log" | tee -a "$SUMMARY"
  [ $rc -eq 0 ] || tail -20 "$OUT/cp_bench.log" | tee -a "$SUMMARY"
fi
note "gpu-cp-check: status=$status"
exit $status
