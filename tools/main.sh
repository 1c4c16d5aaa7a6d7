#!/usr/bin/env bash
# The main job on a built-in default: set up, build the wheel (tools/build-wheel.sh) and install it into ./.venv with
# its [hf] extra (the environment the README's JAX, PyTorch and HF snippets run in), check the library against
# float64 on the GPT-OSS-20B preset (both layer kinds) with the installed `sinkattn` command, then train a small
# GPT-OSS-style byte-level LM with sinkattn attention (CPU by default, a GPU when JAX finds one). Extra arguments go
# to the training example.
# Each step prints its name first; the output of setup, build and install goes to build/main.log (ptxas's kernel
# report to build/ptxas.log); the last line is "PASS: ..." or "FAIL: ..." with the step that failed and the log.
set -euo pipefail
cd "$(dirname "$0")/.."
LOG=build/main.log
mkdir -p build
: >"$LOG"

STEP=start
step() {
  STEP=$1
  echo "== $1: $2"
  echo "== $1: $2" >>"$LOG"
}
IN_LOG=0
logged() {  # a step's output to the log, not the terminal
  IN_LOG=1
  "$@" >>"$LOG" 2>&1
  IN_LOG=0
}
finish() {
  local rc=$?
  if [ $rc -eq 0 ]; then
    echo "PASS: set up, built, installed, checked against float64 and trained (log: $LOG)"
  else
    if [ $IN_LOG -eq 1 ]; then
      echo "-- the last lines of $LOG:"
      tail -n 15 "$LOG" | sed 's/^/   /'
    fi
    echo "FAIL: step '$STEP' exited with status $rc (log: $LOG)"
  fi
}
trap finish EXIT

step setup "Debian packages and the Python tools in .venv (tools/setup-deps.sh)"
logged tools/setup-deps.sh
step build "the wheel: library, JAX and PyTorch bindings, the sinkattn command (tools/build-wheel.sh, minutes)"
cuda=OFF; command -v nvcc >/dev/null && cuda=ON
logged tools/build-wheel.sh -DSINKATTN_ENABLE_CUDA=$cuda
step install "$(ls dist/sinkattn-*.whl) with [hf] into .venv"
logged .venv/bin/python -m pip uninstall -q -y sinkattn  # the same version number: replace it
logged .venv/bin/python -m pip install -q "$(ls dist/sinkattn-*.whl)[hf]"
step check "backends and kernels (sinkattn info), then the GPT-OSS-20B preset against float64"
.venv/bin/sinkattn info
.venv/bin/sinkattn check --preset gpt-oss-20b
step training "a small GPT-OSS-style byte-level LM with sinkattn attention (examples/train_sink_lm.py $*)"
.venv/bin/python examples/train_sink_lm.py "$@"
