#!/usr/bin/env bash
# A/B timing of several builds of the library in one device call (same GPU, alternating runs, so that clock and
# thermal drift hit every variant alike). Two steps:
#   here:   tools/gpu-ab.sh pack NAME [BUILD_DIR]   copies BUILD_DIR's library (the newer of libsinkattn.so.0.1.0
#           and libsinkattn.so; default build-cuda) to $AB_DIR/NAME.so.xz (default build-ab; a library of both
#           architectures is ~62 MB, ~8 MB compressed, so several fit in a carry), and the GPU bench binary beside
#           them once.
#   device: tools/gpu-ab.sh run [REPS] [ROUNDS] [SHAPE]   (carry $AB_DIR) unpacks every NAME.so.xz and runs
#           `sinkattn_gpu_bench REPS [SHAPE]` against each library in turn, ROUNDS times (defaults 20, 2, all shapes),
#           printing "== NAME round" before each table. Library-level switches (SINKATTN_CUDA_NO_SM90=1,
#           SINKATTN_CUDA_NO_TMA=1) can be compared with VARIANT_ENV="NAME:VAR=1 ..." (a variant NAME that reuses the
#           first library with that environment; several variables as NAME:VAR=1,VAR2=2; NAME@LIB:VAR=1 runs library
#           LIB with it).
#   AB_OUT=DIR (run): each run's whole output to DIR/NAME_ROUND.txt and `--json DIR/NAME_ROUND.json` (both benches
#           take it) instead of the table on stdout. BENCH_BIN=NAME (pack): the bench program of build/tests/gpu to copy
#           (default sinkattn_gpu_bench; e.g. sinkattn_gpu_bench_decode, then run with BENCH=$AB_DIR/that name).
#   device: tools/gpu-ab.sh unpack   unpacks every NAME.so.xz to $AB_DIR/NAME/libsinkattn.so.0 (what `run` does first;
#           tools/prof/kernel_times.sh uses it).
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.."
AB_DIR=$(realpath -m "${AB_DIR:-build-ab}")
cmd=${1:-}
# Every NAME.so.xz to $AB_DIR/NAME/libsinkattn.so.0 (and libsinkattn.so).
unpack() {
  local f name
  for f in "$AB_DIR"/*.so.xz; do
    name=$(basename "$f" .so.xz)
    mkdir -p "$AB_DIR/$name"
    python3 -c "import lzma, sys; open(sys.argv[2], 'wb').write(lzma.open(sys.argv[1]).read())" \
      "$f" "$AB_DIR/$name/libsinkattn.so.0"
    ln -sf libsinkattn.so.0 "$AB_DIR/$name/libsinkattn.so"  # a bench linked to the unversioned name
  done
}
case "$cmd" in
  pack)
    name=${2:?name}
    build=${3:-build-cuda}
    mkdir -p "$AB_DIR"
    # the newer of the versioned file and the plain name (a build that once set a version keeps its stale file)
    # either may be missing (ls then fails)
    lib=$(ls -t "$build/libsinkattn.so.0.1.0" "$build/libsinkattn.so" 2>/dev/null | head -1 || true)
    xz -T0 -6 -c "$lib" >"$AB_DIR/$name.so.xz"
    bin=${BENCH_BIN:-sinkattn_gpu_bench}
    # a library-only build (no tests) reuses the bench an earlier pack copied
    if [[ -x "$build/tests/gpu/$bin" ]]; then
      cp "$build/tests/gpu/$bin" "$AB_DIR/$bin"
    elif [[ ! -x "$AB_DIR/$bin" ]]; then
      echo "gpu-ab: no $build/tests/gpu/$bin and none in $AB_DIR" >&2
      exit 1
    fi
    ls -la "$AB_DIR"
    ;;
  unpack)
    unpack
    ;;
  run)
    reps=${2:-20}
    rounds=${3:-2}
    shape=${4:-}
    bench=${BENCH:-$AB_DIR/sinkattn_gpu_bench}
    unpack
    names=()
    for f in "$AB_DIR"/*.so.xz; do
      names+=("$(basename "$f" .so.xz)")
    done
    [ ${#names[@]} -gt 0 ] || { echo "no $AB_DIR/*.so.xz: run 'tools/gpu-ab.sh pack NAME' first" >&2; exit 2; }
    declare -A envs=() libs=()
    for spec in ${VARIANT_ENV:-}; do
      name=${spec%%:*}
      if [[ $name == *@* ]]; then
        libs[${name%@*}]=${name#*@}
        name=${name%@*}
      fi
      envs[$name]=${spec#*:}
      names+=("$name")
    done
    for ((round = 1; round <= rounds; round++)); do
      for name in "${names[@]}"; do
        lib=$AB_DIR/${libs[$name]:-$name}
        [ -d "$lib" ] || lib=$AB_DIR/${names[0]}
        echo "== $name $round"
        e=${envs[$name]:-}
        if [ -n "${AB_OUT:-}" ]; then
          mkdir -p "$AB_OUT"
          env ${e//,/ } LD_LIBRARY_PATH="$lib" timeout 300 "$bench" "$reps" $shape \
            --json "$AB_OUT/${name}_$round.json" >"$AB_OUT/${name}_$round.txt" 2>&1 ||
            echo "FAILED: $name round $round (exit $?)"
        else
          env ${e//,/ } LD_LIBRARY_PATH="$lib" timeout 120 "$bench" "$reps" $shape | tail -n +3
        fi
      done
    done
    ;;
  *)
    sed -n '2,15p' "$0"
    exit 2
    ;;
esac
