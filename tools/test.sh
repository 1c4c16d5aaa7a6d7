#!/usr/bin/env bash
# The test command: set up, build the wheel once (tools/build-wheel.sh: one CMake build in ./build, the tests and the
# CUDA code included when nvcc is found), run the C++ tests (CTest) on that build, then install the wheel into a fresh
# virtual environment with no compiler on PATH and run the Python tests against the installed package
# (tools/test-wheel.sh: JAX on its CPU backend with 8 virtual devices, PyTorch on the CPU, HF GPT-OSS).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup-deps.sh
tools/lint.sh  # ruff over the Python code (pyproject.toml, [tool.ruff])
cuda=OFF; command -v nvcc >/dev/null && cuda=ON
# SINKATTN_WARNINGS_AS_ERRORS: a new compiler warning in the project's code fails CI (cmake/warnings.cmake).
tools/build-wheel.sh -DSINKATTN_BUILD_TESTS=ON -DSINKATTN_ENABLE_CUDA=$cuda -DSINKATTN_WARNINGS_AS_ERRORS=ON
ctest --test-dir build --output-on-failure -j"$(nproc)"
tools/ci-sanitizers.sh  # the CPU backend under ASan + UBSan (its CTest suites) and TSan (the concurrency test)
tools/test-wheel.sh
SINKATTN_FROM=wheel tools/test-maxtext.sh  # the MaxText route (sinkattn.jax.maxtext), the wheel in its own Python 3.12 venv
