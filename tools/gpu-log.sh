# Sourced by the tools/gpu-*-check.sh scripts (GPU machines, no network): where their steps write. OUT (default
# ./gpu-check-out, created), PY (python3, or $PYTHON), SUMMARY ($OUT/summary.txt, appended to), note (a line to the
# terminal and the summary), has STEP (whether $STEPS names STEP).
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SUMMARY=$OUT/summary.txt
note() { echo "$*" | tee -a "$SUMMARY"; }
has() { [[ " ${STEPS:-} " == *" $1 "* ]]; }
