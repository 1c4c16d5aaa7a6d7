#!/usr/bin/env bash
# On a GPU machine (no network): the PyTorch binding (issue 11) in one device call, or in two (10 minutes a call):
#   TORCH_STEPS="pytest"                                   the torch tests on the GPU (every case on CUDA and CPU
#                                                          tensors, CUDA graph capture, bf16 HF GPT-OSS against fp32
#                                                          eager, opcheck, torch.compile, the shared edge cases)
#   TORCH_STEPS="cp cpbench"                               context parallelism (sinkattn.torch.distributed):
#                                                          tests/python/test_torch_context_parallel.py (gloo groups
#                                                          of 2 and 4 on the CPU, NCCL world size 1 on the GPU, bf16
#                                                          cases, HF GPT-OSS) and bench/bench_context_parallel_torch.py
#                                                          on the GPUs present (one GPU: the single-device baseline)
#   TORCH_STEPS="bench overhead example examplebench"      speed: bench/bench_torch.py (SDPA, FlexAttention + sink,
#                                                          sinkattn's torch API, op / C ABI ratio at b=2 s=4096),
#                                                          bench/bench_torch_overhead.py (host time of the op over
#                                                          the C ABI call, CUDA and CPU tensors), the HF example's
#                                                          training run (GPU, bf16) and its tokens/s benchmark
# The package: SITE_DIR (an install made elsewhere with `pip install --no-build-isolation --no-deps --target DIR .`,
# e.g. on the development machine against its newer torch: then this also checks that the stable-ABI operators built
# there load into this machine's torch), else built here against this machine's torch into /tmp/sinkattn-site.
# Logs go to $OUT (default ./gpu-check-out): py_install.log torch_pytest.log torch_bench.log torch_overhead.log
# torch_example.log torch_example_bench.log torch_cp_pytest.log torch_cp_bench.log, and lines in summary.txt.
set -u
cd "$(dirname "$0")/.."
STEPS=${TORCH_STEPS:-"pytest cp bench overhead example examplebench cpbench"}
. tools/gpu-log.sh
. tools/gpu-py-site.sh
sinkattn_site reuse torch || exit 1
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
$PY -c "import torch, transformers, sinkattn.torch, sinkattn.torch._ops as o; print('torch', torch.__version__, \
'transformers', transformers.__version__, 'cuda', torch.cuda.is_available(), o.library_path())" 2>&1 | tee -a "$SUMMARY"
status=0
if has pytest; then
  t0=$(date +%s)
  # The float64 reference (pure JAX) runs on JAX's CPU backend, next to PyTorch's GPU work.
  (cd /tmp && JAX_PLATFORMS=cpu timeout "${PYTEST_TIMEOUT:-540}" $PY -m pytest -q -p no:cacheprovider \
    "$OLDPWD"/tests/python/test_torch_op.py "$OLDPWD"/tests/python/test_torch_edge_cases.py \
    "$OLDPWD"/tests/python/test_torch_hf.py "$OLDPWD"/tests/python/test_torch_example.py \
    "$OLDPWD"/tests/python/test_torch_kvcache.py) >"$OUT/torch_pytest.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  note "torch pytest (GPU): rc=$rc in $(($(date +%s) - t0)) s; $(tail -1 "$OUT/torch_pytest.log")"
  grep -E '^(FAILED|ERROR)' "$OUT/torch_pytest.log" | head -30 | tee -a "$SUMMARY"
fi
if has bench; then
  PYTHONUNBUFFERED=1 timeout "${BENCH_TIMEOUT:-300}" $PY bench/bench_torch.py --json "$OUT/bench_torch.json" >"$OUT/torch_bench.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  note "torch bench (bench/bench_torch.py): rc=$rc"; tee -a "$SUMMARY" <"$OUT/torch_bench.log"
fi
if has overhead; then
  # (--floor: the same schemas on PyTorch's C++ API with kernels that only allocate, bench/torch_dispatch_floor.cpp)
  { timeout 180 $PY bench/bench_torch_overhead.py --device cuda --floor
    timeout 180 $PY bench/bench_torch_overhead.py --device cpu --floor; } \
    >"$OUT/torch_overhead.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  note "torch host overhead: rc=$rc"; tee -a "$SUMMARY" <"$OUT/torch_overhead.log"
fi
if has example; then
  timeout 240 $PY examples/finetune_gpt_oss_hf.py --steps 300 --eval-every 100 --log-every 50 >"$OUT/torch_example.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  note "HF example (GPU, 300 steps): rc=$rc"; grep -E "check:|held-out loss .* ->|layer |GPT-OSS" "$OUT/torch_example.log" | tee -a "$SUMMARY"
fi
if has examplebench; then
  timeout 300 $PY examples/finetune_gpt_oss_hf.py --benchmark --context 4096 --batch 2 --layers 4 --hidden 512 \
    --heads 8 --kv-heads 2 --head-dim 64 --experts 4 --json "$OUT/hf_bench.json" >"$OUT/torch_example_bench.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  note "HF example benchmark (context 4096): rc=$rc"; tail -6 "$OUT/torch_example_bench.log" | tee -a "$SUMMARY"
fi
if has cp; then
  t0=$(date +%s)
  (cd /tmp && NCCL_NVLS_ENABLE=0 JAX_PLATFORMS=cpu timeout "${CP_PYTEST_TIMEOUT:-540}" $PY -m pytest -q \
    -p no:cacheprovider "$OLDPWD"/tests/python/test_torch_context_parallel.py) >"$OUT/torch_cp_pytest.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  note "torch context-parallel pytest (gloo + NCCL): rc=$rc in $(($(date +%s) - t0)) s;" \
    "$(tail -1 "$OUT/torch_cp_pytest.log")"
  grep -E '^(FAILED|ERROR)' "$OUT/torch_cp_pytest.log" | head -30 | tee -a "$SUMMARY"
fi
if has cpbench; then
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 timeout "${CP_BENCH_TIMEOUT:-420}" $PY bench/bench_context_parallel_torch.py \
    ${CP_BENCH_ARGS:---contexts 32k,128k} >"$OUT/torch_cp_bench.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  note "torch context-parallel bench: rc=$rc"; sed -n '/^| N |/,$p' "$OUT/torch_cp_bench.log" | tee -a "$SUMMARY"
  [ $rc -eq 0 ] || tail -20 "$OUT/torch_cp_bench.log" | tee -a "$SUMMARY"
fi
exit $status
