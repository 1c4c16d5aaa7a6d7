#!/usr/bin/env bash
# On a GPU machine (no network): install the Python package with the CUDA backend from this tree and run the
# Python test suite on JAX's GPU backend, then the example's GPU check and its tokens/s benchmark.
# Environment: SITE_DIR (prebuilt install, see below), PY_STEPS (default "pytest example bench"), PYTEST_TIMEOUT
# (default 540 s: what a GPU command of at most 10 minutes leaves after the install), PYTEST_ARGS, PYTEST_FILES (an
# extended regular expression the test files' names must match; default all). On 2026-12-06 the JAX tests took 273 s on
# one H100; another stopped them at 300 s halfway (at test_jax_op.py) and ran the other half in 269 s: on such a
# machine, run them in two commands, PYTEST_FILES='test_(args|conformance_jax|decode|example|ffi_abi)' and
# PYTEST_FILES='test_(jax_op|memory_bound|readme|results_dashboard|ring|sharding|ulysses|user_errors)'.
# Logs go to $OUT (default ./gpu-check-out): py_install.log pytest.log example.log example_bench.log.
set -u
cd "$(dirname "$0")/.."
. tools/gpu-log.sh
# SITE_DIR: a package already installed with `pip install --target SITE_DIR .` (for example built on a machine
# without a GPU and carried here); otherwise the package is built and installed here into /tmp/sinkattn-site.
. tools/gpu-py-site.sh
sinkattn_site || exit 1
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
status=0
if [[ " ${PY_STEPS:-pytest example bench} " == *" pytest "* ]]; then
  t0=$(date +%s)
  # The PyTorch tests run in tools/gpu-torch-check.sh (their own device call).
  # The files by name (pytest's --ignore-glob did not keep the torch files out of a directory run).
  files=$(ls "$PWD"/tests/python/test_*.py | grep -v '/test_torch_' | grep -E "${PYTEST_FILES:-.}")
  (cd /tmp && timeout "${PYTEST_TIMEOUT:-540}" $PY -m pytest -v -rfE --durations=15 -p no:cacheprovider ${PYTEST_ARGS:-} \
    $files) >"$OUT/pytest.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  note "pytest (GPU): rc=$rc in $(($(date +%s) - t0)) s; $(tail -1 "$OUT/pytest.log")"
  grep -E "(FAILED|ERROR)" "$OUT/pytest.log" | head -30 | tee -a "$SUMMARY"
fi
if [[ " ${PY_STEPS:-pytest example bench} " == *" example "* ]]; then
  timeout 240 $PY examples/train_sink_lm.py --steps 60 >"$OUT/example.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  note "example (GPU, 60 steps): rc=$rc; $(grep -iE 'loss|sink|match' "$OUT/example.log" | tail -4 | tr '\n' ' ')"
fi
if [[ " ${PY_STEPS:-pytest example bench} " == *" bench "* ]]; then
  timeout 240 $PY examples/train_sink_lm.py --benchmark --context 4096 --batch 4 --d-model 512 --heads 8 --kv-heads 2 \
    --head-dim 64 --json "$OUT/jax_bench.json" >"$OUT/example_bench.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  note "example benchmark (context 4096): rc=$rc"; tail -8 "$OUT/example_bench.log" | tee -a "$SUMMARY"
fi
exit $status
