#!/usr/bin/env bash
# Tests what users install, with no compiler on PATH: a fresh virtual environment (build/wheel-venv) gets the wheel's
# requirements with its [hf] extra (jax, torch, transformers), pytest and pytest-xdist from uv (its cache, filled by
# tools/setup-deps.sh, makes this seconds), then the wheel from pip as users install it
# (`pip install 'dist/sinkattn-...whl[hf]'`); then `sinkattn info`, `sinkattn check` on a preset, and the Python tests
# (tests/python: JAX, PyTorch on CPU tensors, HF GPT-OSS) against the installed package. PATH holds no nvcc, gcc, g++, cc, c++, cpp, clang, cmake, ccache
# (build/no-compiler-bin: the system's tools less those). Two tests compile on purpose and get a compiler by name:
# the C layout probe of test_ffi_abi.py ($CC) and torch.compile's inductor, which generates C++ on the CPU ($CXX).
# Run by tools/test.sh after tools/build-wheel.sh; extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
whl=$(ls dist/sinkattn-*.whl)
venv=$PWD/build/wheel-venv
bin=$PWD/build/no-compiler-bin
cc=$(command -v cc) cxx=$(command -v g++)

rm -rf "$bin"
mkdir -p "$bin"
for dir in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
  for f in "$dir"/*; do
    name=${f##*/}
    case $name in
      gcc*|g++*|cc|c++|cpp|cpp-*|c89*|c99*|*-linux-gnu-gcc*|*-linux-gnu-g++*|*-linux-gnu-cpp*|clang*|nvcc) continue ;;
      cmake|ctest|cpack|ccmake|ccache) continue ;;
    esac
    [ -e "$bin/$name" ] || ln -s "$f" "$bin/$name"
  done
done
# What runs below sees only the fresh environment and these tools: no PYTHONPATH, no library overrides.
run() {
  env -u PYTHONPATH -u SINKATTN_JAX_FFI_LIBRARY -u SINKATTN_TORCH_LIBRARY \
    -u CC -u CXX -u CUDA_HOME -u VIRTUAL_ENV PATH="$venv/bin:$bin" PYTHONNOUSERSITE=1 "$@"
}
for tool in nvcc gcc g++ cc c++ clang cmake; do
  if run sh -c "command -v $tool" >/dev/null; then echo "test-wheel: $tool is still on PATH" >&2; exit 1; fi
done

# The interpreter of .venv (a real path: pyenv's shims need the PATH this script removes).
python=$(.venv/bin/python -c "import sys; print(sys._base_executable)")
uv=$PWD/.venv/bin/uv
rm -rf "$venv"
t0=$(date +%s)
run "$uv" venv -q --seed --python "$python" "$venv"
run "$uv" pip install -q --python "$venv/bin/python" "$whl[hf]" pytest pytest-xdist
run "$uv" pip uninstall -q --python "$venv/bin/python" sinkattn
t1=$(date +%s)
run "$venv/bin/python" -m pip install -q "$whl[hf]"
echo "test-wheel: fresh venv: requirements and pytest by uv in $((t1 - t0)) s, then" \
     "\`pip install '$(basename "$whl")[hf]'\` in $(($(date +%s) - t1)) s (no compiler on PATH)"

run "$venv/bin/python" - "$venv" <<'EOF'
import os, sys
import sinkattn
where = os.path.realpath(sinkattn.__file__)
assert where.startswith(os.path.realpath(sys.argv[1]) + os.sep), f"sinkattn imported from {where}, not the venv"
pkg = os.path.dirname(where)
libs = sorted(os.listdir(os.path.join(pkg, "lib")))
print("test-wheel: sinkattn from", pkg, "lib/:", " ".join(x for x in libs if x.endswith(".so") or ".so." in x))
assert [x for x in libs if x.startswith("libsinkattn.so")] == ["libsinkattn.so"], libs
EOF
run sinkattn info
run sinkattn check --preset gpt-oss-20b --seqlen 64 --seed 1 >/dev/null
echo "test-wheel: sinkattn check --preset gpt-oss-20b --seqlen 64: passed"

# One pytest worker per core, each taking whole files (--dist loadfile: a file's module-scoped groups, such as the
# spawned torch.distributed processes of test_torch_context_parallel.py, start once): 658 -> 464 s on 2 cores
# (2026-12-06, commit 158fe91, the 2-core development machine).
run CC="$cc" CXX="$cxx" XLA_FLAGS="${XLA_FLAGS:---xla_force_host_platform_device_count=8}" \
  "$venv/bin/python" -m pytest tests/python -q -n auto --dist loadfile "$@"
