# Sourced by tools/gpu-python-check.sh and tools/gpu-cp-check.sh (GPU machines, no network). sinkattn_site [reuse]
# sets SITE to an install of the Python package with the CUDA backend: SITE_DIR when it holds one (prebuilt with
# `pip install --target SITE_DIR .`, e.g. on a machine without a GPU, and carried), else /tmp/sinkattn-site, built
# here from this tree (with "reuse": an install already there from an earlier script of the same call is used as
# is). Needs PY, OUT and note(); returns 1 (after printing the log's tail) when the install fails.
sinkattn_site() {
  if [ -n "${SITE_DIR:-}" ] && [ -d "$SITE_DIR/sinkattn" ]; then
    SITE=$(cd "$SITE_DIR" && pwd)
    note "python package: using the prebuilt install in $SITE_DIR"
    return 0
  fi
  SITE=/tmp/sinkattn-site
  if [ "${1:-}" = reuse ] && [ -d "$SITE/sinkattn" ]; then
    note "python package: using $SITE (installed earlier in this call)"
    return 0
  fi
  local t0 rc
  t0=$(date +%s)
  $PY -m pip install -q --no-build-isolation --no-deps --target "$SITE" . \
    --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" >"$OUT/py_install.log" 2>&1
  rc=$?
  note "python package install (CUDA): rc=$rc in $(($(date +%s) - t0)) s"
  [ $rc -eq 0 ] || { tail -30 "$OUT/py_install.log"; return 1; }
}
