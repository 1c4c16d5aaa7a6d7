#!/usr/bin/env bash
# On the GPU machine (no network): FlashAttention-4 (flash-attn-4==4.0.0b40, `flash_attn.cute`) from the wheels of
# tools/fa4-wheels.sh. A GPU machine without network takes at most 64 MiB of files with each command it runs, and a
# folder sent with one command replaces the one sent before, while /tmp stays as long as the machine is kept (30 s
# after a command): so the wheels go in two halves, each staged into /tmp by the command that brings it:
#
#   tools/fa4-install.sh stage     copy the carried .whl/fa4-a and/or .whl/fa4-b into /tmp/fa4-stage (with each half),
#                                  checking each piece against fa4-SHA256SUMS as it arrives
#   tools/fa4-install.sh install   join the two pieces of nvidia-cutlass-dsl-libs-cu13, check every wheel's sha256,
#                                  `pip install --no-index --no-deps --target /tmp/fa4-site`, write
#                                  /tmp/fa4-site/env.sh (PYTHONPATH: the site and its nvidia_cutlass_dsl/dsl_packages,
#                                  which the package's .pth file adds in a real site-packages but not from a --target
#                                  folder) and try `import flash_attn.cute`
#   tools/fa4-install.sh check     on the GPU: one small FA4 forward + backward with a learnable sink (after install)
#
# The commands. On the build machine first: tools/fa4-wheels.sh (writes .whl/fa4-a and .whl/fa4-b, git-ignored, and
# prints the size of each half with the tracked tree) and the sinkattn wheel in dist/ (tools/build-wheel.sh; it goes
# with the second half, and tools/gpu-wheel-check.sh installs it with
# `pip install --no-deps --no-index --target /tmp/sinkattn-wheel-site`, as its other steps do). Then on the GPU
# machine, each command at most 600 s:
#   1. with .whl/fa4-a:           tools/fa4-install.sh stage
#   2. on the same machine within 30 s, with .whl/fa4-b and dist:
#                                 tools/fa4-install.sh stage && tools/fa4-install.sh install && WHEEL_STEPS=fa4 \
#                                   tools/gpu-wheel-check.sh
# The second runs bench/bench_torch.py --methods sdpa,sinkattn,fa4 (every layer: forward, backward, deterministic
# backward; at most 360 s) and examples/finetune_gpt_oss_hf.py --benchmark --impls sinkattn,eager,flash_attention_4
# (at most 130 s); logs and JSON in $OUT: bench_torch_fa4.{log,json}, hf_bench_fa4.{log,json}, wheel_install.log,
# summary.txt (tools/results_dashboard.py add takes the two JSON files with the sinkattn_gpu_bench JSON of the same
# machine). Should the bench need more time, split it over further commands on the same machine, each with dist
# (FA4 stays in /tmp/fa4-site while the machine is kept), e.g.
#   command: FA4_PARTS=bench FA4_BENCH_ARGS="16k" WHEEL_STEPS=fa4 tools/gpu-wheel-check.sh     (the s 16384 layers)
#   command: FA4_PARTS=hf WHEEL_STEPS=fa4 tools/gpu-wheel-check.sh                             (the HF benchmark)
# Without /tmp/fa4-site (the two commands did not run on one machine: `install` then says a piece is missing; or the
# install failed) the FA4 rows and the flash_attention_4 line say "not available" and the rest still runs.
# Elsewhere: `. /tmp/fa4-site/env.sh` before Python starts (or bench_torch.py --fa4-site /tmp/fa4-site).
# Environment: PYTHON (default python3), FA4_STAGE (default /tmp/fa4-stage), FA4_SITE (absolute; default /tmp/fa4-site),
# FA4_CARRIED (default ".whl/fa4-a .whl/fa4-b"), FA4_PIP_ARGS (extra pip arguments, e.g. --python-version 3.11 ...
# to try the install on a machine of another Python).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
STAGE=${FA4_STAGE:-/tmp/fa4-stage}
SITE=${FA4_SITE:-/tmp/fa4-site}
CARRIED=${FA4_CARRIED:-.whl/fa4-a .whl/fa4-b}
MANIFEST=fa4-SHA256SUMS

stage() {
  mkdir -p "$STAGE"
  local d n=0
  for d in $CARRIED; do
    [ -d "$d" ] || continue
    cp -f "$d"/* "$STAGE"/ || return 1
    n=$((n + 1))
    echo "fa4 stage: $(ls "$d" | wc -l) files of $d -> $STAGE"
  done
  [ $n -gt 0 ] || { echo "fa4 stage: none of $CARRIED is here (send one with the command)"; return 1; }
  # the pieces that have arrived (so far) against the manifest
  (cd "$STAGE" && grep '\.part[0-9]*$' "$MANIFEST" | while read -r sum f; do
     [ -f "$f" ] || continue
     echo "$sum  $f" | sha256sum -c --quiet - || exit 1
     echo "fa4 stage: $f ok ($(stat -c %s "$f") bytes)"
   done) || { echo "fa4 stage: a piece does not match $MANIFEST"; return 1; }
  ls -l "$STAGE"
}

install() {
  [ -f "$STAGE/$MANIFEST" ] || { echo "fa4 install: no $STAGE/$MANIFEST: run 'stage' first"; return 1; }
  cd "$STAGE" || return 1
  local parts whole missing=0 p
  # join the pieces of each split wheel, in order (.part0, .part1, ...)
  for whole in $(grep '\.part0$' "$MANIFEST" | awk '{ print $2 }' | sed 's/\.part0$//'); do
    parts=$(grep -F "  $whole.part" "$MANIFEST" | awk '{ print $2 }' | sort -V)
    for p in $parts; do
      [ -f "$p" ] || {
        echo "fa4 install: no $STAGE/$p (both halves must reach one machine: run both commands again)"
        missing=1
      }
    done
    [ $missing -eq 0 ] || return 1
    # shellcheck disable=SC2086
    cat $parts >"$whole" || return 1
    echo "fa4 install: joined $whole ($(stat -c %s "$whole") bytes)"
  done
  grep -v '\.part[0-9]*$' "$MANIFEST" | sha256sum -c - || { echo "fa4 install: sha256 mismatch"; return 1; }
  local wheels
  wheels=$(grep -v '\.part[0-9]*$' "$MANIFEST" | awk '{ print $2 }')
  rm -rf "$SITE"
  local t0 rc
  t0=$(date +%s)
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" ${FA4_PIP_ARGS:-} $wheels
  rc=$?
  echo "fa4 install: pip install --no-index --no-deps --target $SITE: rc=$rc in $(($(date +%s) - t0)) s"
  [ $rc -eq 0 ] || return 1
  [ -d "$SITE/nvidia_cutlass_dsl/dsl_packages" ] || { echo "fa4 install: no nvidia_cutlass_dsl/dsl_packages"; return 1; }
  cat >"$SITE/env.sh" <<EOF
# FlashAttention-4 of tools/fa4-install.sh: source before Python starts.
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}
EOF
  echo "fa4 install: wrote $SITE/env.sh; PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages"
  cd - >/dev/null || return 1
  # the import (what the bench scripts need; no GPU work): a failure is reported, the install stays
  # shellcheck disable=SC1091
  if (. "$SITE/env.sh" && "$PY" -c "
import importlib.metadata as md
print('fa4 install: flash-attn-4', md.version('flash-attn-4'), '| nvidia-cutlass-dsl', md.version('nvidia-cutlass-dsl'),
      '| quack-kernels', md.version('quack-kernels'), '| apache-tvm-ffi', md.version('apache-tvm-ffi'))
import flash_attn.cute as fa
print('fa4 install: import flash_attn.cute ok:', fa.__file__)
" >"$SITE/import.log" 2>&1); then
    cat "$SITE/import.log"
  else
    tail -4 "$SITE/import.log"
    echo "fa4 install: import flash_attn.cute FAILED ($SITE/import.log): the FA4 rows will say not available"
  fi
  return 0
}

check() {
  [ -f "$SITE/env.sh" ] || { echo "fa4 check: no $SITE/env.sh (run install first)"; return 1; }
  # shellcheck disable=SC1091
  . "$SITE/env.sh"
  "$PY" - <<'EOF'
import math, time
import torch
from flash_attn.cute import flash_attn_func

b, s, hq, hkv, d = 1, 512, 8, 2, 64
q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
sink = torch.full((hq,), math.log(s), device="cuda", dtype=torch.float32, requires_grad=True)
t0 = time.perf_counter()
out, lse = flash_attn_func(q, k, v, causal=True, window_size=(127, 0), learnable_sink=sink)
out.float().square().sum().backward()
torch.cuda.synchronize()
# the reference: softmax over the visible keys and the sink column (a logit, not scaled)
qf = q.detach().float()
kf, vf = (x.detach().float().repeat_interleave(hq // hkv, 2) for x in (k, v))
sc = torch.einsum("bihd,bjhd->bhij", qf, kf) / math.sqrt(d)
i, j = torch.arange(s, device="cuda")[:, None], torch.arange(s, device="cuda")[None, :]
sc = sc.masked_fill(~((j <= i) & (i - j <= 127)), float("-inf"))
full = torch.cat([sc, sink.detach().view(1, hq, 1, 1).expand(b, hq, s, 1)], -1).softmax(-1)[..., :-1]
ref = torch.einsum("bhij,bjhd->bihd", full, vf)
err = (out.float() - ref).abs().max().item()
print(f"fa4 check: {torch.cuda.get_device_name()}, forward + backward with a sink and window (127, 0) in "
      f"{time.perf_counter() - t0:.1f} s (compilation included); max |out - ref| {err:.2e}; "
      f"d_sink finite: {bool(sink.grad.isfinite().all())}")
assert err < 2e-2 and sink.grad is not None
EOF
}

case "${1:-}" in
  stage) stage ;;
  install) install ;;
  check) check ;;
  *) echo "usage: $0 stage|install|check (see the header)" >&2; exit 2 ;;
esac
