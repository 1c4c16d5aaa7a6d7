# Sourced by tools/gpu-python-check.sh, tools/gpu-cp-check.sh and tools/gpu-torch-check.sh (GPU machines, no
# network). sinkattn_site [reuse] [torch] sets SITE to an install of the Python package with the CUDA backend:
# SITE_DIR when it holds one (prebuilt with `pip install --target SITE_DIR .`, e.g. on a machine without a GPU, and
# carried), else /tmp/sinkattn-site, built here from this tree (with "reuse": an install already there from an
# earlier script of the same call is used as is; with "torch": the PyTorch operators are built (SINKATTN_BUILD_TORCH
# =ON) and an install without them is not reused). Needs PY, OUT and note(); returns 1 (after printing the tail of
# py_install.log) when the install fails.
sinkattn_site() {
  if [ -n "${SITE_DIR:-}" ] && [ -d "$SITE_DIR/sinkattn" ]; then
    SITE=$(cd "$SITE_DIR" && pwd)
    note "python package: using the prebuilt install in $SITE_DIR"
    return 0
  fi
  SITE=/tmp/sinkattn-site
  local reuse=0 torch=0 arg
  for arg in "$@"; do
    case $arg in reuse) reuse=1 ;; torch) torch=1 ;; esac
  done
  local present=$SITE/sinkattn
  [ $torch -eq 1 ] && present=$SITE/sinkattn/lib/libsinkattn_torch.so
  if [ $reuse -eq 1 ] && [ -e "$present" ]; then
    note "python package: using $SITE (installed earlier in this call)"
    return 0
  fi
  local t0 rc torch_define=()
  [ $torch -eq 1 ] && torch_define=(--config-settings=cmake.define.SINKATTN_BUILD_TORCH=ON)
  t0=$(date +%s)
  $PY -m pip install -q --no-build-isolation --no-deps --target "$SITE" . \
    --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" ${torch_define[@]+"${torch_define[@]}"} \
    >"$OUT/py_install.log" 2>&1
  rc=$?
  note "python package install (CUDA$([ $torch -eq 1 ] && echo ', torch operators')): rc=$rc in $(($(date +%s) - t0)) s"
  [ $rc -eq 0 ] || { tail -30 "$OUT/py_install.log"; return 1; }
}
