#!/usr/bin/env bash
# CI step: the CPU backend under sanitizers (CPU-only builds, no CUDA), called by tools/test.sh.
#   1. AddressSanitizer + UndefinedBehaviorSanitizer (GCC, -fno-sanitize-recover=all: the first report fails), into
#      ./build-asan: the library, the command and every CTest suite of the CPU backend (C ABI, CLI), run by CTest. The
#      float64 reference the suites judge by (tests/reference) is built without instrumentation: it is the tests'
#      independent judge, not the library under test, and its naive loops would take most of the time. Not run there:
#      install_find_package, which builds a separate consumer project against the installed library without the
#      sanitizer runtime.
#   2. ThreadSanitizer, into ./build-tsan: the concurrency test (tests/test_concurrency.cpp: 8 threads, forward and
#      backward on different and shared inputs, bitwise equal to single-threaded runs, sinkattn_last_error per
#      thread). The CPU backend runs each call on an OpenMP team. GCC's libgomp is not instrumented, so TSan would
#      see its barriers and task hand-offs as races (or miss them); this build uses clang with LLVM's OpenMP runtime
#      (libomp) and its Archer tool (OMP_TOOL_LIBRARIES=libarcher.so), which tells TSan about every OpenMP
#      synchronisation, so that the library's own code is checked inside the OpenMP regions too, not only between
#      the host threads. No suppressions.
# Usage: tools/ci-sanitizers.sh [asan|tsan]... (default: both). Extra cmake flags: $SINKATTN_SANITIZER_CMAKE_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup-deps.sh clang libomp-dev  # clang and LLVM's OpenMP runtime (with Archer) for the TSan build

jobs=()
(($#)) && jobs=("$@") || jobs=(asan tsan)
extra=(${SINKATTN_SANITIZER_CMAKE_ARGS:-})
common=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DSINKATTN_ENABLE_CUDA=OFF -DSINKATTN_BUILD_JAX_FFI=OFF
        -DSINKATTN_BUILD_TORCH=OFF)

for job in "${jobs[@]}"; do
  start=$SECONDS
  case "$job" in
    asan)
      flags="-g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all"
      cmake -S . -B build-asan "${common[@]}" "${extra[@]}" -DCMAKE_CXX_COMPILER=g++ -DCMAKE_C_COMPILER=gcc \
        -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
        -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
        -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
        -DSINKATTN_REFERENCE_COMPILE_OPTIONS="-fno-sanitize=all" >/dev/null
      cmake --build build-asan -j"$(nproc)"
      ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1" \
      UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
        ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -E '^install_find_package$'
      ;;
    tsan)
      flags="-g -fno-omit-frame-pointer -fsanitize=thread"
      cmake -S . -B build-tsan "${common[@]}" "${extra[@]}" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
        -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
        -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" >/dev/null
      cmake --build build-tsan -j"$(nproc)" --target test_concurrency
      llvm_lib="$(dirname "$(readlink -f "$(clang++ -print-file-name=libomp.so.5)")")"
      [ -f "$llvm_lib/libarcher.so" ] || llvm_lib="/usr/lib/llvm-$(clang++ -dumpversion | cut -d. -f1)/lib"
      archer="$llvm_lib/libarcher.so"
      [ -f "$archer" ] || { echo "ci-sanitizers: libarcher.so not found (libomp-dev)"; exit 1; }
      OMP_TOOL_LIBRARIES="$archer" ARCHER_OPTIONS="verbose=1" \
      TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1" \
        build-tsan/tests/test_concurrency
      ;;
    *) echo "usage: $0 [asan|tsan]..." >&2; exit 2 ;;
  esac
  echo "ci-sanitizers: $job passed in $((SECONDS - start)) s"
done
