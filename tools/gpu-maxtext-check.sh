#!/usr/bin/env bash
# The MaxText route on a GPU machine (no network): MaxText 0.2.5's packages from carried wheels, sinkattn with its
# CUDA backend, then examples/maxtext_gpt_oss.py: its training run (the first step's loss with attention=sinkattn
# against attention=dot_product, loss going down, sinks moving) and its --benchmark (training tokens/s of a small
# GPT-OSS-like MaxText model at context 4096, sinkattn against MaxText's dot_product path, in one run).
#
# Wheels: tools/maxtext-wheels.sh (run where there is network) writes .whl/maxtext/part1, part2, ...; carry them
# (one or more parts per call, 64 MiB a call) in consecutive calls to the same warm machine: each call installs the
# parts it finds into MT_SITE (default .whl/maxtext-site, kept between calls) and stops with status 3 while MaxText
# does not import yet. Python: the machine's (PYTHON, default python3; MaxText needs >= 3.12, and the wheels must
# be downloaded for its version: PYVER of tools/maxtext-wheels.sh).
# Environment: SITE_DIR and CUDA_ARCHS (tools/gpu-py-site.sh), MT_STEPS (default "example bench"), BENCH_ARGS
# (extra arguments of the benchmark). Logs go to $OUT (default ./gpu-check-out): maxtext_install.log,
# maxtext_example.log, maxtext_bench.log, lines in summary.txt.
set -u
cd "$(dirname "$0")/.."
. tools/gpu-log.sh
note "gpu-maxtext-check $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo none);" \
  "$($PY -c 'import sys, jax; print("Python", sys.version.split()[0], "jax", jax.__version__)' 2>&1 | tail -1)"
MT_SITE=${MT_SITE:-$PWD/.whl/maxtext-site}
mkdir -p "$MT_SITE"
for part in .whl/maxtext/part*; do
  [ -d "$part" ] || continue
  stamp="$MT_SITE/.installed-$(basename "$part")-$(ls "$part" | sha256sum | cut -c1-12)"
  [ -e "$stamp" ] && continue
  $PY -m pip install -q --disable-pip-version-check --no-deps --no-index --no-compile --upgrade --target "$MT_SITE" \
    "$part"/*.whl >>"$OUT/maxtext_install.log" 2>&1
  rc=$?
  note "maxtext wheels $part: $(ls "$part" | wc -l) installed into $MT_SITE, rc=$rc"
  [ $rc -eq 0 ] && touch "$stamp" || { tail -20 "$OUT/maxtext_install.log"; exit 1; }
done
. tools/gpu-py-site.sh
sinkattn_site reuse || exit 1
export PYTHONPATH=$SITE:$MT_SITE${PYTHONPATH:+:$PYTHONPATH}
# the package's Python files from this tree (a prebuilt install may predate them); its libraries from SITE
rm -rf /tmp/sinkattn-mt-py && mkdir -p /tmp/sinkattn-mt-py && cp -r "$SITE/sinkattn" /tmp/sinkattn-mt-py/ &&
  cp python/sinkattn/jax/*.py /tmp/sinkattn-mt-py/sinkattn/jax/ && export PYTHONPATH=/tmp/sinkattn-mt-py:$PYTHONPATH
if ! missing=$($PY -c "import maxtext.trainers.pre_train.train" 2>&1); then
  note "MaxText does not import yet (carry the next wheel part): $(echo "$missing" | tail -1)"
  exit 3
fi
status=0
STEPS=${MT_STEPS:-example bench}
if [[ " $STEPS " == *" example "* ]]; then
  timeout 480 $PY examples/maxtext_gpt_oss.py --steps 40 >"$OUT/maxtext_example.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  note "maxtext example (GPU, 40 steps): rc=$rc; $(grep -E '^(step 0|loss )' "$OUT/maxtext_example.log" | tr '\n' ' ')"
fi
if [[ " $STEPS " == *" bench "* ]]; then
  timeout 540 $PY examples/maxtext_gpt_oss.py --benchmark ${BENCH_ARGS:-} >"$OUT/maxtext_bench.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  note "maxtext benchmark (context 4096): rc=$rc"
  grep -E '^(benchmark|  |RESULT)' "$OUT/maxtext_bench.log" | tee -a "$SUMMARY"
  [ $rc -eq 0 ] || tail -20 "$OUT/maxtext_bench.log"
fi
exit $status
