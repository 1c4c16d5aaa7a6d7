#!/usr/bin/env bash
# The MaxText route's tests (tests/python_maxtext): sets up ./.venv-maxtext (tools/setup-maxtext.sh) and runs them on
# JAX's CPU backend with 8 virtual devices. With SINKATTN_FROM=source (default) the package comes from ./python and
# its library from SINKATTN_JAX_FFI_LIBRARY, else the first of: a CPU build's build*/python/ffi/, the package that
# tools/test.sh installs into ./.venv (the library is not tied to a Python version).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup-maxtext.sh
export SINKATTN_FROM=${SINKATTN_FROM:-source}
if [ "$SINKATTN_FROM" = source ]; then
  if [ -z "${SINKATTN_JAX_FFI_LIBRARY:-}" ]; then
    SINKATTN_JAX_FFI_LIBRARY=$(ls build*/python/ffi/libsinkattn_jax_ffi.so \
      .venv/lib/python3*/site-packages/sinkattn/lib*/libsinkattn_jax_ffi.so 2>/dev/null | head -1 || true)
    [ -n "$SINKATTN_JAX_FFI_LIBRARY" ] || { echo "test-maxtext: no libsinkattn_jax_ffi.so built" >&2; exit 1; }
  fi
  export SINKATTN_JAX_FFI_LIBRARY PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
  echo "test-maxtext: sinkattn from ./python with $SINKATTN_JAX_FFI_LIBRARY"
fi
XLA_FLAGS="${XLA_FLAGS:---xla_force_host_platform_device_count=8}" JAX_PLATFORMS=cpu \
  .venv-maxtext/bin/python -m pytest tests/python_maxtext -q -p no:cacheprovider -p no:warnings
