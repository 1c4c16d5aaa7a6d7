#!/usr/bin/env bash
# FlashAttention-4 (flash-attn-4==4.0.0b40, the CuTe DSL kernels, `flash_attn.cute`) and the wheels it needs, fetched
# here (a machine with network) for a GPU machine without one (Linux x86_64, CPython 3.12, torch 2.11 + CUDA 13, which
# already holds torch, einops, typing-extensions, cuda-bindings and protobuf), as two folders that can each go with
# one command to it (it takes 64 MiB of files a command, the working tree included): the anchor of
# bench/bench_torch.py's "fa4" rows and of examples/finetune_gpt_oss_hf.py --benchmark's
# attn_implementation="flash_attention_4".
#
#   tools/fa4-wheels.sh        download into .whl/fa4 (git-ignored), then split into .whl/fa4-a and .whl/fa4-b
#
# The versions: flash-attn-4's METADATA asks for nvidia-cutlass-dsl>=4.6.2 (its cu13 extra for CUDA 13),
# apache-tvm-ffi>=0.1.11,<0.2, torch-c-dlpack-ext and quack-kernels>=0.5.3; pinned below to the newest of each when
# 4.0.0b40 came out (2026-11-18), which are also the newest now. nvidia-cutlass-dsl's default libs wheel is -cu12;
# the -cu13 one replaces it (the GPU machine's torch is cu130), so -cu12 is not fetched.
# nvidia-cutlass-dsl-libs-cu13 alone is about 92 MB: it is cut into two byte pieces (.part0 in fa4-a, .part1 in
# fa4-b), fa4-a holding every other wheel too and about FA4_A_MIB MiB in all (default 58), so that fa4-b leaves room
# for dist/ (the sinkattn wheel, about 17 MB) with the second half. Both folders hold fa4-SHA256SUMS: the sha256 of
# every whole wheel and of each piece, which tools/fa4-install.sh checks on the GPU machine.
# Environment: PYTHON (default python3, with pip), FA4_PYVER (default 3.12: the GPU machine's Python; 3.11 etc. fetch
# the wheels for another Python, e.g. to try the install here), FA4_WHL (default .whl), FA4_A_MIB (default 58).
# The commands that take them to the GPU machine: tools/fa4-install.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PYVER=${FA4_PYVER:-3.12}
WHL=${FA4_WHL:-.whl}
A_MIB=${FA4_A_MIB:-58}
PINS=(
  flash-attn-4==4.0.0b40
  nvidia-cutlass-dsl==4.8.1
  nvidia-cutlass-dsl-libs-base==4.8.1
  nvidia-cutlass-dsl-libs-core==4.8.1
  nvidia-cutlass-dsl-libs-cu13==4.8.1
  apache-tvm-ffi==0.1.15.post2
  torch-c-dlpack-ext==0.1.5
  quack-kernels==0.6.5
)
BIG=nvidia_cutlass_dsl_libs_cu13-  # the wheel that is split
ALL=$WHL/fa4 A=$WHL/fa4-a B=$WHL/fa4-b

mkdir -p "$ALL"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$ALL" "${PINS[@]}"

# exactly one wheel per pin (a wheel of another version or Python left in $ALL by an earlier run is removed)
wheels=()
for pin in "${PINS[@]}"; do
  name=${pin%%==*} ver=${pin#*==}
  stem=$(echo "$name" | tr - _)-$ver
  tag=cp${PYVER/./}
  found=$(cd "$ALL" && ls "$stem"-py3-none-*.whl "$stem"-"$tag"-*.whl 2>/dev/null | head -1 || true)
  [ -n "$found" ] || { echo "no wheel for $pin in $ALL" >&2; exit 1; }
  wheels+=("$found")
done
for f in "$ALL"/*.whl; do
  keep=0
  for w in "${wheels[@]}"; do [ "$(basename "$f")" = "$w" ] && keep=1; done
  [ $keep -eq 1 ] || { echo "removing $f (not one of the pins)"; rm -f "$f"; }
done

echo "What the wheels' METADATA asks for (extras left out), beside what is fetched or already on the GPU machine:"
for w in "${wheels[@]}"; do
  "$PY" - "$ALL/$w" <<'EOF'
import sys, zipfile
path = sys.argv[1]
with zipfile.ZipFile(path) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    reqs = [l.split(":", 1)[1].strip() for l in z.read(meta).decode().splitlines() if l.startswith("Requires-Dist:")]
reqs = [r for r in reqs if "extra ==" not in r]
print(f"  {path.rsplit('/', 1)[-1]}: {', '.join(reqs) or '-'}")
EOF
done

rm -rf "$A" "$B"
mkdir -p "$A" "$B"
big=
small_bytes=0
for w in "${wheels[@]}"; do
  if [[ $w == $BIG* ]]; then
    big=$w
  else
    cp "$ALL/$w" "$A/"
    small_bytes=$((small_bytes + $(stat -c %s "$ALL/$w")))
  fi
done
[ -n "$big" ] || { echo "no $BIG wheel" >&2; exit 1; }
big_bytes=$(stat -c %s "$ALL/$big")
cut=$((A_MIB * 1024 * 1024 - small_bytes - 4096))
[ $cut -gt 0 ] && [ $cut -lt "$big_bytes" ] || { echo "FA4_A_MIB=$A_MIB leaves no sensible cut of $big" >&2; exit 1; }
head -c "$cut" "$ALL/$big" >"$A/$big.part0"
tail -c +"$((cut + 1))" "$ALL/$big" >"$B/$big.part1"
cmp <(cat "$A/$big.part0" "$B/$big.part1") "$ALL/$big"

# the manifest: whole wheels (checked after reassembly) and the two pieces (checked as each arrives)
(cd "$ALL" && sha256sum "${wheels[@]}") >"$A/fa4-SHA256SUMS"
(cd "$A" && sha256sum "$big.part0") >>"$A/fa4-SHA256SUMS"
(cd "$B" && sha256sum "$big.part1") >>"$A/fa4-SHA256SUMS"
cp "$A/fa4-SHA256SUMS" "$B/"

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
dist=$( (ls dist/sinkattn-*.whl 2>/dev/null || true) | head -1)
dist_bytes=0
[ -n "$dist" ] && dist_bytes=$(stat -c %s "$dist")
for d in "$A" "$B"; do
  echo "$d:"
  (cd "$d" && ls -l --time-style=+ | awk 'NR > 1 { printf "  %10d  %s\n", $5, $NF }')
done
a_bytes=$(du -cb "$A"/* | tail -1 | cut -f1)
b_bytes=$(du -cb "$B"/* | tail -1 | cut -f1)
echo "$A: $(mib "$a_bytes"); $B: $(mib "$b_bytes"); the tracked tree: $(mib "$tree")"
echo "first half ($A, with the tracked tree): about $(mib $((a_bytes + tree))) of the 64 MiB a GPU command takes"
dist_text="no dist/sinkattn-*.whl here yet"
[ -n "$dist" ] && dist_text="dist: $(basename "$dist"), $(mib "$dist_bytes")"
echo "second half ($B and dist, with the tracked tree):" \
  "about $(mib $((b_bytes + tree + dist_bytes))) of 64 MiB ($dist_text)"
