#!/usr/bin/env bash
# ps-lite's own benchmark (tests/test_kv_app_benchmark.cc: one Push and one
# Pull of 10M keys, one float each), run against ps-lite built from its
# source and, compiled unchanged, against this package; the two alternated
# round by round on this machine. Our side runs twice a round: at its
# defaults (values between local processes through shared memory) and with
# PS_SHM=0 (values through the sockets, as between hosts). Prints the
# median push and pull ms of each and ps-lite's time over ours.
# Fetches nothing: PSLITE_DIR is a ps-lite checkout whose build holds the
# benchmark (PSLITE_BIN names the binary when it is elsewhere).
# Usage: run.sh [-r ROUNDS] [-s SERVERS] [-w WORKERS] [-t SECONDS]
#               [-k] PSLITE_DIR BUILD_DIR
#   -r rounds (5), -s/-w servers and workers (1 and 1), -t the limit on
#   each process (120 s), -k keep the logs (printed at the end).
set -euo pipefail
rounds=5 servers=1 workers=1 limit=120 keep=0
while getopts "r:s:w:t:k" opt; do
  case $opt in
    r) rounds=$OPTARG ;;
    s) servers=$OPTARG ;;
    w) workers=$OPTARG ;;
    t) limit=$OPTARG ;;
    k) keep=1 ;;
    *) sed -n '/^# Usage/,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0" >&2
       exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 2 ] || {
  echo "usage: $0 [-r N] [-s S] [-w W] [-t SEC] [-k] PSLITE_DIR BUILD_DIR" >&2
  exit 2
}
pslite=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
src=$pslite/tests/test_kv_app_benchmark.cc
[ -f "$src" ] || { echo "no $src: not a ps-lite checkout" >&2; exit 1; }
theirs=${PSLITE_BIN:-}
if [ -z "$theirs" ]; then
  # ps-lite's CMake build names it kv_app_benchmark_test, its Makefile
  # test_kv_app_benchmark.
  for f in "$pslite"/build/tests/kv_app_benchmark_test \
           "$pslite"/build/tests/test_kv_app_benchmark \
           "$pslite"/tests/build/test_kv_app_benchmark; do
    [ -x "$f" ] && { theirs=$f; break; }
  done
fi
if [ -z "$theirs" ] || [ ! -x "$theirs" ]; then
  echo "no ps-lite benchmark binary under $pslite/build/tests: build it" \
    "(cmake --build $pslite/build --target kv_app_benchmark_test) or set" \
    "PSLITE_BIN" >&2
  exit 1
fi

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2> /dev/null || true; done
  if [ "$keep" = 1 ]; then echo "logs kept in $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

# Ours: the program compiled unchanged against the installed package
# (as tests/pslite/upstream.sh does).
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
mkdir "$tmp/src"
cat > "$tmp/src/CMakeLists.txt" << CMAKE
cmake_minimum_required(VERSION 3.22)
project(pslite_bench LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(ps CONFIG REQUIRED)
add_executable(test_kv_app_benchmark $src)
target_link_libraries(test_kv_app_benchmark PRIVATE ps::ps)
CMAKE
cmake -S "$tmp/src" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$tmp/configure.log"
cmake --build "$tmp/build" > "$tmp/build.log" 2>&1 || {
  cat "$tmp/build.log" >&2
  exit 1
}
ours=$tmp/build/test_kv_app_benchmark

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# job NAME BIN [VAR=VALUE...]: one job, 1 scheduler, $servers servers and
# $workers workers on 127.0.0.1, its own scheduler port, every process
# bounded by the limit; appends the slowest worker's "push pull" ms to
# $tmp/NAME.times (nothing when the job failed: it is reported).
job() {
  local name=$1 bin=$2 log=$tmp/$1.$round.log role rc=0 p
  shift 2
  local port
  port=$(free_port)
  pids=()
  for role in scheduler $(yes server | head -n "$servers") \
              $(yes worker | head -n "$workers"); do
    env -u PS_KEY_FILE "$@" DMLC_NUM_SERVER="$servers" DMLC_NUM_WORKER="$workers" \
      DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT="$port" \
      DMLC_ROLE="$role" \
      timeout -s KILL "$limit" "$bin" >> "$log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  pids=()
  local push pull
  push=$(sed -n 's/.*Push average time cost: \([0-9.]*\) *ms.*/\1/p' "$log" |
    sort -g | tail -n 1)
  pull=$(sed -n 's/.*Pull average time cost: \([0-9.]*\) *ms.*/\1/p' "$log" |
    sort -g | tail -n 1)
  if [ "$rc" -ne 0 ] || [ -z "$push" ] || [ -z "$pull" ]; then
    echo "round $round, $name: failed (exit $rc); its log:" >&2
    tail -n 20 "$log" >&2
    return 0
  fi
  echo "$push $pull" >> "$tmp/$name.times"
  printf '  %-12s push %9.1f ms  pull %9.1f ms\n' "$name" "$push" "$pull"
}

echo "ps-lite: $theirs"
echo "ours:    $ours (built from $src, unchanged, against $build)"
echo "$servers server(s), $workers worker(s), $rounds rounds; $(uptime)"
for ((round = 1; round <= rounds; ++round)); do
  echo "round $round"
  job pslite "$theirs"
  job ours "$ours"
  job ours_noshm "$ours" PS_SHM=0
done
echo "after: $(uptime)"

# median FILE COLUMN
median() {
  [ -s "$1" ] || { echo nan; return; }
  awk -v c="$2" '{print $c}' "$1" | sort -g |
    awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
echo
printf '%-12s %6s %10s %10s %14s %14s\n' side runs "push ms" "pull ms" \
  "push ps-lite/x" "pull ps-lite/x"
tpush=$(median "$tmp/pslite.times" 1)
tpull=$(median "$tmp/pslite.times" 2)
for name in pslite ours ours_noshm; do
  push=$(median "$tmp/$name.times" 1)
  pull=$(median "$tmp/$name.times" 2)
  runs=$( (cat "$tmp/$name.times" 2> /dev/null || true) | wc -l)
  awk -v n="$name" -v r="$runs" -v a="$push" -v b="$pull" -v ta="$tpush" \
    -v tb="$tpull" 'BEGIN {
      printf "%-12s %6d %10.1f %10.1f %14.2f %14.2f\n", n, r, a, b, ta / a, tb / b }'
done

