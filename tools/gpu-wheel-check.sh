#!/usr/bin/env bash
# On a GPU machine (no network): the wheel users install (dist/sinkattn-*.whl of tools/build-wheel.sh, carried from
# the machine that built it), installed with `pip install --no-deps --target` next to the machine's own torch and
# JAX (CUDA), and run from there, in three commands of 10 minutes at most: "info suite", "jax", "hf torch" (on
# 2026-12-06, H100: "info suite" 278 s; the JAX tests 273 s, the PyTorch tests 211 s; tools/gpu-python-check.sh on
# a slower machine):
#   WHEEL_STEPS="info"   the installed `sinkattn` console script: `info` and `check --preset gpt-oss-20b` on the GPU
#   WHEEL_STEPS="suite"  the C++ GPU programs of the same CMake build (build/tests/gpu, carried with dist: they link
#                        the wheel's libsinkattn.so) through tools/gpu-check.sh, its steps in SUITE_STEPS (default
#                        "suite concurrency decode sanitizer determinism"; "decode_bench" times the decode bench,
#                        "paged_bench" paged prefill against the contiguous cache (PAGED_ITERS, PAGED_ARGS),
#                        with DECODE_ITERS and DECODE_ARGS as tools/gpu-check.sh takes them), logs in $OUT/cpp
#   WHEEL_STEPS="jax"    the JAX tests on JAX's GPU backend (tools/gpu-python-check.sh)
#   WHEEL_STEPS="hf"     the HF GPT-OSS training example (examples/finetune_gpt_oss_hf.py, bf16 on the GPU: its first
#                        steps checked against eager, then 100 steps)
#   WHEEL_STEPS="torch"  the PyTorch tests on the GPU (tools/gpu-torch-check.sh)
#   WHEEL_STEPS="fa4"    FlashAttention-4 beside sinkattn (issue 37): bench/bench_torch.py --methods sdpa,sinkattn,fa4
#                        on every layer (forward, backward, deterministic backward; a layer FA4 turns down keeps its
#                        row with "refused: <its message>"), then examples/finetune_gpt_oss_hf.py --benchmark with
#                        attn_implementation "sinkattn", "eager" and "flash_attention_4"; FA4 from /tmp/fa4-site
#                        (FA4_SITE) of tools/fa4-install.sh, whose header gives the two commands that bring it
#                        (the second: tools/fa4-install.sh stage && tools/fa4-install.sh install &&
#                        WHEEL_STEPS=fa4 tools/gpu-wheel-check.sh). Both parts write their JSON as they go;
#                        FA4_PARTS (default "bench hf") runs one of them (e.g. the HF part in a third command on the
#                        same machine), FA4_BENCH_ARGS adds bench_torch.py arguments (layer names: some
#                        layers), FA4_BENCH_TIMEOUT / FA4_HF_TIMEOUT (default 360 / 130 s) bound them
# Logs go to $OUT (default ./gpu-check-out): wheel_install.log wheel_info.log pytest.log wheel_hf.log
# torch_pytest.log bench_torch_fa4.{log,json} hf_bench_fa4.{log,json}, and lines in summary.txt.
set -u
cd "$(dirname "$0")/.."
STEPS=${WHEEL_STEPS:-"info suite"}
. tools/gpu-log.sh

whl=$(ls dist/sinkattn-*.whl 2>/dev/null | head -1)
[ -n "$whl" ] || { note "no dist/sinkattn-*.whl here: build it with tools/build-wheel.sh and carry dist"; exit 1; }
SITE=/tmp/sinkattn-wheel-site
rm -rf "$SITE"
t0=$(date +%s)
$PY -m pip install --no-deps --no-index --target "$SITE" "$whl" >"$OUT/wheel_install.log" 2>&1
rc=$?
note "wheel install ($(basename "$whl"), --no-deps --target $SITE): rc=$rc in $(($(date +%s) - t0)) s"
[ $rc -eq 0 ] || { tail -20 "$OUT/wheel_install.log"; exit 1; }
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export PATH=$SITE/bin:$PATH
unset SINKATTN_JAX_FFI_LIBRARY SINKATTN_TORCH_LIBRARY
status=0

if has info; then
  rc=0
  { echo "sinkattn: $(command -v sinkattn)"
    sinkattn info || rc=1
    sinkattn check --preset gpt-oss-20b --seqlen 1024 --seed 1 --backend cuda || rc=1
    $PY -c "import jax, torch, transformers, sinkattn, sinkattn.jax._ffi as f, sinkattn.torch._ops as o; \
print('package', sinkattn.__file__); print('jax', jax.__version__, jax.devices(), 'platforms', f.platforms()); \
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__); \
import sinkattn.torch; print('torch operators', o.library_path())" || rc=1
  } >"$OUT/wheel_info.log" 2>&1
  [ $rc -eq 0 ] || status=1
  note "sinkattn info / check --preset gpt-oss-20b --backend cuda / versions: rc=$rc"
  grep -E "^sinkattn|^command built|^  cuda:[0-9]|device 0:|ran on:|^(out|softmax_lse|dq|dk|dv|d_sinks) |^PASS|^FAIL|error|^package|^jax|^torch" \
    "$OUT/wheel_info.log" | cut -c1-200 | tee -a "$SUMMARY"
fi
if has jax; then
  SITE_DIR=$SITE PY_STEPS=pytest OUT=$OUT PYTHON=$PY tools/gpu-python-check.sh || status=1
fi
if has hf; then
  timeout 300 $PY examples/finetune_gpt_oss_hf.py --steps 100 --eval-every 50 --log-every 25 >"$OUT/wheel_hf.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  note "HF GPT-OSS training from the wheel (GPU, 100 steps): rc=$rc"
  grep -E "check:|held-out loss .* ->|train loss|GPT-OSS" "$OUT/wheel_hf.log" | tee -a "$SUMMARY"
fi
if has suite; then
  LD_LIBRARY_PATH=$SITE/sinkattn/lib:$SITE/sinkattn.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} BUILD_DIR=build \
    STEPS=${SUITE_STEPS:-"suite concurrency decode sanitizer determinism"} OUT=$OUT/cpp tools/gpu-check.sh || status=1
  sed 's/^/cpp: /' "$OUT/cpp/summary.txt" >>"$SUMMARY"
fi
if has torch; then
  SITE_DIR=$SITE TORCH_STEPS=pytest OUT=$OUT PYTHON=$PY tools/gpu-torch-check.sh || status=1
fi
if has fa4; then
  # in a subshell: FA4's PYTHONPATH stays with this step
  (
    fa4=${FA4_SITE:-/tmp/fa4-site}
    if [ -f "$fa4/env.sh" ]; then
      . "$fa4/env.sh"
      note "fa4: FlashAttention-4 from $fa4 ($(grep -o 'PYTHONPATH=[^$]*' "$fa4/env.sh"))"
    else
      note "fa4: no $fa4/env.sh (no tools/fa4-install.sh install on this machine): FA4 will say not available"
    fi
    rc_all=0
    parts=${FA4_PARTS:-"bench hf"}
    if [[ " $parts " == *" bench "* ]]; then
      t0=$(date +%s)
      # shellcheck disable=SC2086
      PYTHONUNBUFFERED=1 timeout "${FA4_BENCH_TIMEOUT:-360}" $PY bench/bench_torch.py --methods sdpa,sinkattn,fa4 \
        --json "$OUT/bench_torch_fa4.json" ${FA4_BENCH_ARGS:-} >"$OUT/bench_torch_fa4.log" 2>&1
      rc=$?; [ $rc -eq 0 ] || rc_all=1
      note "bench_torch.py --methods sdpa,sinkattn,fa4${FA4_BENCH_ARGS:+ $FA4_BENCH_ARGS}: rc=$rc in" \
        "$(($(date +%s) - t0)) s (bench_torch_fa4.log, .json)"
      grep -vE "^\s|^Traceback|^  File" "$OUT/bench_torch_fa4.log" | cut -c1-220 | tee -a "$SUMMARY"
    fi
    if [[ " $parts " == *" hf "* ]]; then
      t0=$(date +%s)
      PYTHONUNBUFFERED=1 timeout "${FA4_HF_TIMEOUT:-130}" $PY examples/finetune_gpt_oss_hf.py --benchmark \
        --impls sinkattn,eager,flash_attention_4 --json "$OUT/hf_bench_fa4.json" >"$OUT/hf_bench_fa4.log" 2>&1
      rc=$?; [ $rc -eq 0 ] || rc_all=1
      note "HF GPT-OSS training benchmark, sinkattn / eager / flash_attention_4: rc=$rc in" \
        "$(($(date +%s) - t0)) s (hf_bench_fa4.log, .json)"
      grep -E "benchmark on|tokens/s|not available|failed|sinkattn /" "$OUT/hf_bench_fa4.log" | cut -c1-220 \
        | tee -a "$SUMMARY"
    fi
    exit $rc_all
  ) || status=1
fi
exit $status
