#!/usr/bin/env bash
# The main job on a built-in default: set up, build, check the library against float64 on the GPT-OSS-20B preset
# (both layer kinds), then install the Python package and train a small GPT-OSS-style byte-level LM with sinkattn
# attention (CPU by default, a GPU when JAX finds one). Extra arguments go to the training example.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup-deps.sh
tools/build.sh
build/cli/sinkattn info
build/cli/sinkattn check --preset gpt-oss-20b
cuda=OFF; nvidia-smi >/dev/null 2>&1 && cuda=ON   # the package gets the CUDA backend only where a GPU is
.venv/bin/python -m pip install -q . --config-settings=cmake.define.SINKATTN_ENABLE_CUDA=$cuda
.venv/bin/python examples/train_sink_lm.py "$@"
