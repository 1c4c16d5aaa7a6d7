#!/usr/bin/env bash
# Sets up ./.venv-maxtext, the Python 3.12 environment of the MaxText route (sinkattn.jax.maxtext): maxtext==0.2.5
# and the packages its config, model and train step import, pinned in tools/maxtext-requirements.txt and installed
# with --no-deps (MaxText's extras would pull hundreds of packages it does not import here). Idempotent: when the
# venv already holds this requirements file's pins (a stamp of its hash), nothing is installed.
#
# How the venv gets sinkattn (SINKATTN_FROM):
#   source (default): nothing is installed; tools/test-maxtext.sh runs the package from ./python with the library
#                     of a build (SINKATTN_JAX_FFI_LIBRARY, see there).
#   wheel:            pip install --no-deps dist/sinkattn-*.whl into the venv.
# Environment: PYTHON312 (default: a working python3.12 on PATH, else pyenv's 3.12), VENV (default ./.venv-maxtext).
set -euo pipefail
cd "$(dirname "$0")/.."
SINKATTN_FROM=${SINKATTN_FROM:-source}
VENV=${VENV:-$PWD/.venv-maxtext}
REQS=tools/maxtext-requirements.txt

if [ ! -x "$VENV/bin/python" ]; then
  PY312=${PYTHON312:-}
  if [ -z "$PY312" ]; then
    for c in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12; do
      if "$c" -c "import sys; assert sys.version_info[:2] == (3, 12)" >/dev/null 2>&1; then PY312=$c; break; fi
    done
  fi
  [ -n "$PY312" ] || { echo "setup-maxtext: Python 3.12 not found (set PYTHON312)" >&2; exit 1; }
  echo "setup-maxtext: creating $VENV with $PY312"
  "$PY312" -m venv "$VENV"
fi
stamp="$VENV/.sinkattn-maxtext-requirements"
want=$(sha256sum "$REQS" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup-maxtext: installing $(grep -c '==' "$REQS") pinned packages into $VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-compile -r "$REQS"
  echo "$want" > "$stamp"
fi
case $SINKATTN_FROM in
  source) ;;
  wheel)
    whl=$(ls -t dist/sinkattn-*.whl 2>/dev/null | head -1)
    [ -n "$whl" ] || { echo "setup-maxtext: SINKATTN_FROM=wheel but no dist/sinkattn-*.whl" >&2; exit 1; }
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$whl" ;;
  *) echo "setup-maxtext: SINKATTN_FROM must be source or wheel, got $SINKATTN_FROM" >&2; exit 1 ;;
esac
