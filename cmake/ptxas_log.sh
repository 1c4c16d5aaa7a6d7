#!/usr/bin/env bash
# Compiler launcher of the CUDA backend's objects (src/cuda/CMakeLists.txt): ptxas_log.sh LOG_DIR COMMAND... runs
# the compile command and writes ptxas's report of each kernel (nvcc -Xptxas -v: registers, stack frame, spill
# stores and loads, per architecture) to LOG_DIR/<source>.log instead of the terminal, where dozens of lines of
# mangled names would bury what matters. Every other line of the compiler's output (errors, warnings) still goes
# to stderr, and the exit status is the compiler's. The build joins the logs into build/ptxas.log;
# tests/ptxas_spills.py checks the spills in it against tests/ptxas_spills.txt.
set -u
log_dir=$1
shift
obj=
prev=
for a in "$@"; do
  [ "$prev" = -o ] && obj=$a
  prev=$a
done
# The object src/cuda/CMakeFiles/sinkattn_cuda.dir/decode/decode.cu.o logs to LOG_DIR/decode_decode.cu.log.
name=${obj#*.dir/}
name=${name%.o}
name=${name//\//_}
mkdir -p "$log_dir"
out=$(mktemp)
"$@" >"$out" 2>&1
rc=$?
# ptxas's report: "ptxas info : ..." lines, its spill warnings and the indented "N bytes stack frame, ..." lines.
report='^ptxas info|^ptxas warning : Registers are spilled|^ +[0-9]+ bytes stack frame'
grep -E "$report" "$out" >"$log_dir/${name:-unknown}.log"
grep -v -E "$report" "$out" >&2
rm -f "$out"
exit $rc
