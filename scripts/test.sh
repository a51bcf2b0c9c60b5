#!/usr/bin/env bash
# Installs what is missing, fetches MNIST, builds, and runs every test:
# first the Release build (with the CUDA backend compiled where the toolkit
# is present), then the core suites again under AddressSanitizer + UBSan and
# under ThreadSanitizer, then each libFuzzer target for a bounded time.
# After the Release tests, clang-tidy checks the C++ files changed since the
# base (scripts/tidy.sh); a finding fails the run.
# Usage: scripts/test.sh            (from anywhere in the checkout)
# Env: PS_FUZZ_SECONDS (default 60): how long each fuzz target runs.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
fuzz_seconds=${PS_FUZZ_SECONDS:-60}

# Seconds since the previous phase ended, so that CI logs show where the
# time goes.
phase_start=$SECONDS
phase_done() {
  echo "== $1: $((SECONDS - phase_start)) s"
  phase_start=$SECONDS
}

PS_PYTHON_DEPS=1 PS_CLUSTER_DEPS=1 bash scripts/install_deps.sh
bash scripts/fetch_mnist.sh data/mnist
phase_done "dependencies and MNIST"

echo "== Release build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DPS_WERROR=ON \
  -DPS_BUILD_TESTS=ON -DPS_BUILD_BENCH=ON -DPS_BUILD_EXAMPLES=ON
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs" --timeout 600)
phase_done "Release build and tests"

echo "== clang-tidy on the C++ files changed (scripts/tidy.sh, .clang-tidy)"
bash scripts/tidy.sh build
phase_done "clang-tidy"

echo "== AddressSanitizer + UBSan build (core suites)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPS_SANITIZE=ON \
  -DPS_WITH_CUDA=OFF -DPS_BUILD_TESTS=ON -DPS_BUILD_BENCH=OFF \
  -DPS_BUILD_EXAMPLES=OFF -DPS_WERROR=ON
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 \
   ctest --output-on-failure -j"$jobs" --timeout 600 -L sanitize)
phase_done "ASan + UBSan build and tests"

echo "== ThreadSanitizer build (core unit + inproc suites)"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPS_TSAN=ON \
  -DPS_WITH_CUDA=OFF -DPS_BUILD_TESTS=ON -DPS_BUILD_BENCH=OFF \
  -DPS_BUILD_EXAMPLES=OFF -DPS_WERROR=ON
# Only the programs of the suites labelled tsan (tests/core/CMakeLists.txt).
cmake --build build-tsan -j"$jobs" \
  --target core_unit_test core_membership_test core_inproc_test \
  core_rendezvous_test core_trust_test core_filter_test core_dense_parts_test \
  core_compress_test core_sparse_test
(cd build-tsan &&
   TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/../scripts/tsan_suppressions.txt" \
   ctest --output-on-failure -j"$jobs" --timeout 600 -L tsan)
phase_done "TSan build and tests"

echo "== libFuzzer targets (clang, ASan + UBSan): ${fuzz_seconds} s each"
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPS_FUZZ=ON -DPS_WITH_CUDA=OFF \
  -DPS_BUILD_TESTS=OFF -DPS_BUILD_BENCH=OFF -DPS_BUILD_EXAMPLES=OFF
cmake --build build-fuzz -j"$jobs" --target fuzz_decode fuzz_kv_pairs fuzz_open fuzz_compress fuzz_codecs
for target in fuzz_decode fuzz_kv_pairs fuzz_open fuzz_compress fuzz_codecs; do
  # New inputs go to a scratch corpus; the committed seeds stay as they are.
  corpus=build-fuzz/corpus/$target
  mkdir -p "$corpus"
  log=build-fuzz/$target.log
  if ! build-fuzz/tests/fuzz/$target -max_total_time="$fuzz_seconds" \
      -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="build-fuzz/$target-" \
      "$corpus" "tests/fuzz/corpus/$target" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "== $target failed; the input is build-fuzz/$target-* (see $log)"
    exit 1
  fi
  grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | sed "s/^/$target: /" || true
done
phase_done "fuzz build and runs"

echo "== clang -Wthread-safety build (core library and in-process suites)"
# The lock annotations (src/van/sync.h) checked by clang: a member read or
# written without the lock that GUARDED_BY names fails the build.
cmake -S . -B build-clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
  -DPS_THREAD_SAFETY=ON -DPS_WERROR=ON -DPS_WITH_CUDA=OFF -DPS_BUILD_BENCH=OFF \
  -DPS_BUILD_EXAMPLES=OFF -DPS_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release
cmake --build build-clang -j"$jobs" --target ps core_unit_test \
  core_membership_test core_inproc_test core_rendezvous_test core_trust_test \
  core_filter_test core_dense_parts_test core_compress_test core_sparse_test
(cd build-clang && ctest --output-on-failure -j"$jobs" --timeout 600 \
   -R '^(Membership|ReplicaChain|BarrierCoordinatorTest|RendezvousCoordinator|InProc|Trust|Rendezvous|Filters|Compress|DenseAggregator|DenseSlice|CheckpointSets|CheckpointSchedule|CheckpointerFiles|Sparse|SparseUnit|All/SparseOptimizerTest)[.]')
phase_done "clang thread-safety build and tests"

echo "== Python module and its tests (pytest, Debian's /usr/bin/python3)"
# The extension built in the Release tree (target ps_python), then the jobs
# of tests/python run through the tracker against it.
cmake -S . -B build -DPS_BUILD_PYTHON=ON -DPython3_EXECUTABLE=/usr/bin/python3
cmake --build build -j"$jobs" --target ps_python
PS_PYTHONPATH="$PWD/build/python/pkg" /usr/bin/python3 -m pytest -q tests/python
phase_done "Python module and tests"

# --- launchers: ssh, mpi and slurm through the real tools (tests/tracker)
echo "== Launchers through a real sshd, mpirun and a one-node Slurm"
# The tests start (and always stop) their own sshd (in a network namespace
# of its own), munged, slurmctld and slurmd (on unused loopback ports); the
# jobs are the Release build's kv_job and mnist_dist.
(top=$PWD && cd tests/tracker && PS_REQUIRE_CLUSTER_TOOLS=1 \
   PS_KV_JOB="$top/build/tests/core/kv_job" \
   PS_MNIST_DIST="$top/build/examples/mnist/mnist_dist" \
   PS_MNIST_DATA="$top/data/mnist" \
   timeout 600 python3 -B -m unittest -v test_launchers_ssh \
   test_launchers_mpi test_launchers_slurm)
phase_done "launchers (ssh, mpi, slurm)"
# --- end launchers
