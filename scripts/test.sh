#!/usr/bin/env bash
# Installs what is missing, fetches MNIST, builds, and runs every test:
# first the Release build (with the CUDA backend compiled where the toolkit
# is present), then the core suites again under AddressSanitizer + UBSan.
# Usage: scripts/test.sh            (from anywhere in the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash scripts/install_deps.sh
bash scripts/fetch_mnist.sh data/mnist

echo "== Release build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DPS_WERROR=ON \
  -DPS_BUILD_TESTS=ON -DPS_BUILD_BENCH=ON -DPS_BUILD_EXAMPLES=ON
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs" --timeout 600)

echo "== AddressSanitizer + UBSan build (core suites)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPS_SANITIZE=ON \
  -DPS_WITH_CUDA=OFF -DPS_BUILD_TESTS=ON -DPS_BUILD_BENCH=OFF \
  -DPS_BUILD_EXAMPLES=OFF -DPS_WERROR=ON
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 \
   ctest --output-on-failure -j"$jobs" --timeout 600 -L sanitize)

echo "== clang -Wthread-safety build"
# The lock annotations (src/van/sync.h) checked by clang: a member read or
# written without the lock that GUARDED_BY names fails the build.
cmake -S . -B build-clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
  -DPS_THREAD_SAFETY=ON -DPS_WITH_CUDA=OFF -DPS_BUILD_BENCH=OFF \
  -DPS_BUILD_EXAMPLES=OFF -DPS_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release
cmake --build build-clang -j"$jobs"
(cd build-clang && ctest --output-on-failure -j"$jobs" --timeout 600 -L inproc)

echo "== Python module and its tests (pytest, Debian's /usr/bin/python3)"
# The extension built in the Release tree (target ps_python), then the jobs
# of tests/python run through the tracker against it.
cmake -S . -B build -DPS_BUILD_PYTHON=ON -DPython3_EXECUTABLE=/usr/bin/python3
cmake --build build -j"$jobs" --target ps_python
PS_PYTHONPATH="$PWD/build/python/pkg" /usr/bin/python3 -m pytest -q tests/python
