#!/usr/bin/env bash
# Downloads (here, with network) the wheels tools/gpu-maxtext-check.sh installs on a GPU machine (no network):
# those of tools/maxtext-requirements.txt except the ones a GPU machine with JAX already has (jax, jaxlib, numpy,
# ml_dtypes, scipy, opt_einsum) and pytest (with iniconfig and pluggy), for that machine's Python (PYVER, default
# 3.12; MaxText needs >= 3.12) on x86-64 Linux, into .whl/maxtext/ (git-ignored), split in parts of at most
# PART_MIB (default 56) MiB: .whl/maxtext/part1, part2, ... so that each fits one device call's carry (64 MiB);
# carry them in consecutive calls to the same warm machine (tools/gpu-maxtext-check.sh installs what each call
# brings). SKIP: more names (regex, e.g. 'flax|optax') the GPU machine already has.
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${PYVER:-3.12}
PART_MIB=${PART_MIB:-56}
skip="^(jax|jaxlib|numpy|ml[-_]dtypes|scipy|opt[-_]einsum|pytest|iniconfig|pluggy)${SKIP:+|^(${SKIP})}=="
dest=.whl/maxtext
rm -rf "$dest" && mkdir -p "$dest/all"
grep '==' tools/maxtext-requirements.txt | grep -viE "$skip" > "$dest/requirements.txt"
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version "$PYVER" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -r "$dest/requirements.txt" -d "$dest/all"
# greedy: largest first into the first part with room
python3 - "$dest" "$PART_MIB" <<'PY'
import os, sys
dest, limit = sys.argv[1], int(sys.argv[2]) << 20
files = sorted(os.listdir(f"{dest}/all"), key=lambda f: -os.path.getsize(f"{dest}/all/{f}"))
parts = []
for f in files:
    size = os.path.getsize(f"{dest}/all/{f}")
    for p in parts:
        if p[0] + size <= limit:
            p[0] += size; p[1].append(f); break
    else:
        parts.append([size, [f]])
for i, (size, names) in enumerate(parts, 1):
    os.makedirs(f"{dest}/part{i}")
    for f in names:
        os.rename(f"{dest}/all/{f}", f"{dest}/part{i}/{f}")
    print(f"{dest}/part{i}: {len(names)} wheels, {size / 2**20:.1f} MiB")
PY
rmdir "$dest/all"
