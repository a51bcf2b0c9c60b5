#!/usr/bin/env bash
# The first command on a fresh Debian machine: installs the missing packages,
# builds mnist_dist (Release), fetches MNIST, and trains the ConvNet on a
# local job of 1 scheduler + 2 servers + 2 workers (BSP, batch 16 per worker
# = 32 a step) with the default recipe (examples/mnist/README.md: Adam on a
# one-cycle schedule over 3 epochs, an average of the weights for
# evaluation) until the test accuracy on all 10,000 test images reaches
# 99% (--target_accuracy 99), ending with the samples and seconds of training
# that took. Writes the metrics (JSON lines) and their plot (PNG, drawn by
# matplotlib with Debian's /usr/bin/python3) to out/demo/.
# Usage: scripts/demo.sh [extra mnist_dist flags]   (env: BUILD_DIR, OUT_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."

build="${BUILD_DIR:-build}"
out="${OUT_DIR:-out/demo}"
cores="$(nproc)"
jobs=$(( cores < 8 ? cores : 8 ))
# Two workers and two servers share the cores; each worker computes on half.
threads=$(( cores / 2 > 1 ? cores / 2 : 1 ))

scripts/install_deps.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$jobs" --target mnist_dist
scripts/fetch_mnist.sh data/mnist
mkdir -p "$out"
rm -f "$out"/worker*.jsonl
python3 tracker/launch.py -s 2 -w 2 -- "$build/examples/mnist/mnist_dist" \
  --data_dir data/mnist --consistency bsp --target_accuracy 99 \
  --threads "$threads" --metrics_dir "$out" "$@" \
  2>&1 | tee "$out/log.txt"
/usr/bin/python3 scripts/plot_metrics.py "$out"/worker*.jsonl \
  -o "$out/metrics.png"
echo "demo: $(grep -o 'final: test accuracy.*' "$out/log.txt" | head -1)"
echo "demo: $(grep -o -E '(reached|not reached).*' "$out/log.txt" | head -1)"
echo "demo: metrics in $out/worker*.jsonl, plot in $out/metrics.png"
