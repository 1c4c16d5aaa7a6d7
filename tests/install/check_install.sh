#!/usr/bin/env bash
# Installs the build tree into a temporary prefix and builds + runs a separate project that uses
# find_package(sinkattn) and links sinkattn::sinkattn: `cmake --install` must give the headers, the library and the package config.
set -euo pipefail
build=$1; src=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/consumer" >/dev/null
out=$("$tmp/consumer/consumer")
echo "$out"
# lse = log(e^1 + 4 e^(0.5*0.5*8/sqrt(8))) for the call in main.cpp
grep -q "lse\[0\]=2.38238" <<<"$out"
