#!/usr/bin/env bash
# The main job on a built-in default: set up, build, check the library against float64 on the GPT-OSS-20B preset
# (both layer kinds), then install the Python package and train a small GPT-OSS-style byte-level LM with sinkattn
# attention (CPU by default, a GPU when JAX finds one). Extra arguments go to the training example.
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
    echo "PASS: set up, built, checked against float64, installed and trained (log: $LOG)"
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
step build "the library, the sinkattn command and the tests into build/ (tools/build.sh, a few minutes)"
logged tools/build.sh
step check "backends and kernels (sinkattn info), then the GPT-OSS-20B preset against float64"
build/cli/sinkattn info
build/cli/sinkattn check --preset gpt-oss-20b
cuda=OFF; nvidia-smi >/dev/null 2>&1 && cuda=ON   # the package gets the CUDA backend only where a GPU is
step install "the Python package into .venv (CUDA backend: $cuda)"
logged .venv/bin/python -m pip install -q . --config-settings=cmake.define.SINKATTN_ENABLE_CUDA=$cuda
step training "a small GPT-OSS-style byte-level LM with sinkattn attention (examples/train_sink_lm.py $*)"
.venv/bin/python examples/train_sink_lm.py "$@"
