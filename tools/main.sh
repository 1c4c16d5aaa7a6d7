#!/usr/bin/env bash
# The main job on a built-in default: set up, build the wheel (tools/build-wheel.sh) and install it into ./.venv with
# its [hf] extra (the environment the README's JAX, PyTorch and HF snippets run in), check the library against
# float64 on the GPT-OSS-20B preset (both layer kinds) with the installed `sinkattn` command, then train a small
# GPT-OSS-style byte-level LM with sinkattn attention (CPU by default, a GPU when JAX finds one). Extra arguments go
# to the training example.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup-deps.sh
cuda=OFF; command -v nvcc >/dev/null && cuda=ON
tools/build-wheel.sh -DSINKATTN_ENABLE_CUDA=$cuda
.venv/bin/python -m pip uninstall -q -y sinkattn 2>/dev/null || true  # the same version number: replace it
.venv/bin/python -m pip install -q "$(ls dist/sinkattn-*.whl)[hf]"
.venv/bin/sinkattn info
.venv/bin/sinkattn check --preset gpt-oss-20b
.venv/bin/python examples/train_sink_lm.py "$@"
