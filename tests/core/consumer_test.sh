#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then configures, builds
# and runs tests/core/consumer against it (find_package(ps) + ps::ps).
# Usage: consumer_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
cmake -S "$src" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$tmp/configure.log"
cmake --build "$tmp/build" -j2 > "$tmp/build.log" || {
  cat "$tmp/build.log"
  exit 1
}
"$tmp/build/consumer"
