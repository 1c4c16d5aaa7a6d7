#!/usr/bin/env bash
# Lint of the Python code with ruff (rules: pyproject.toml, [tool.ruff]), using the ruff of ./.venv
# (requirements-dev.txt pins it; tools/setup-deps.sh installs it). RUFF=<path> runs another ruff binary.
set -euo pipefail
cd "$(dirname "$0")/.."
"${RUFF:-.venv/bin/ruff}" check python/ tests/ bench/ examples/ tools/
