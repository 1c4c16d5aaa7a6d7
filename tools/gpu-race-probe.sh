#!/usr/bin/env bash
# compute-sanitizer racecheck on one GPU-suite configuration under several kernel switches and sanitizer options,
# each with its own time limit: which kernel / which option a racecheck hang or hazard follows
# (bench/log/2026-12-03-forward-l2-sections.md: `--small --no-cases --sweep 4 --seed 121303 --only 1` did not finish
# under racecheck on one machine).
# Env: BUILD_DIR (default build-cuda; its tests/gpu/sinkattn_gpu_suite and libsinkattn), SUITE_ARGS (the suite's
# arguments that select the configuration; default the case above), LIMIT (seconds per run, default 40), VARIANTS
# (space-separated; each "name:ENV=V,ENV=V" or "name:" for none; an entry whose name starts with "opt-" passes its
# value to compute-sanitizer instead, e.g. "opt-nomemcpy:--racecheck-memcpy-async=no"), OUT (logs; default
# ./race-probe-out). Prints one line per variant: rc, seconds, the sanitizer's summary.
set -u
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
OUT=${OUT:-$PWD/race-probe-out}
mkdir -p "$OUT"
SUITE=$BUILD_DIR/tests/gpu/sinkattn_gpu_suite
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
SUITE_ARGS=${SUITE_ARGS:---small --no-cases --sweep 4 --seed 121303 --only 1}
LIMIT=${LIMIT:-40}
VARIANTS=${VARIANTS:-"default: no90:SINKATTN_CUDA_NO_SM90=1 notma:SINKATTN_CUDA_NO_TMA=1 nopdl:SINKATTN_CUDA_NO_PDL=1 opt-nomemcpy:--racecheck-memcpy-async=no"}
export LD_LIBRARY_PATH="$PWD/$BUILD_DIR:${LD_LIBRARY_PATH:-}"
# shellcheck disable=SC2086
"$SUITE" $SUITE_ARGS -v >"$OUT/plain.log" 2>&1
echo "without the sanitizer: rc=$? ($(grep -m1 -E 'configurations|failed' "$OUT/plain.log"))"
for v in $VARIANTS; do
  name=${v%%:*}
  val=${v#*:}
  envs=()
  opts=()
  if [[ $name == opt-* ]]; then
    opts=("$val")
  elif [ -n "$val" ]; then
    IFS=, read -r -a envs <<<"$val"
  fi
  t0=$(date +%s)
  # shellcheck disable=SC2086
  env "${envs[@]}" timeout "$LIMIT" "$CS" --tool racecheck "${opts[@]}" --error-exitcode 3 "$SUITE" $SUITE_ARGS -v \
    >"$OUT/race_$name.log" 2>&1
  rc=$?
  echo "$name (${val:-no switch}): rc=$rc in $(($(date +%s) - t0)) s; $(grep -E 'RACECHECK SUMMARY|forward ran on|Error' "$OUT/race_$name.log" | head -3 | tr '\n' ' ')"
done
