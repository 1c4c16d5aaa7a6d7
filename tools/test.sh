#!/usr/bin/env bash
# The test command: set up, build (CUDA code included when nvcc is found), run the C++ tests (CTest), install the
# Python package into ./.venv (with its PyTorch operators: built against the .venv's torch, hence no build isolation)
# and run the Python tests (JAX on its CPU backend with 8 virtual devices, PyTorch on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup-deps.sh
tools/lint.sh  # ruff over the Python code (pyproject.toml, [tool.ruff])
tools/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
tools/ci-sanitizers.sh  # the CPU backend under ASan + UBSan (its CTest suites) and TSan (the concurrency test)
# The Python package builds its own copy of the library (CPU only here: the CUDA code was built above).
.venv/bin/python -m pip install -q --no-build-isolation . --config-settings=cmake.define.SINKATTN_ENABLE_CUDA=OFF \
  --config-settings=cmake.define.SINKATTN_BUILD_TORCH=ON
XLA_FLAGS="${XLA_FLAGS:---xla_force_host_platform_device_count=8}" .venv/bin/python -m pytest tests/python -q
tools/test-maxtext.sh  # the MaxText route (sinkattn.jax.maxtext) in its own Python 3.12 environment
