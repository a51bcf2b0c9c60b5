#!/usr/bin/env bash
# Builds ps-lite's own test programs (PSLITE/tests/test_*.cc, unchanged)
# against the installed package and runs each REPEAT times (4 by default,
# as ps-lite's CI does with its repeat.sh) two ways: with ps-lite's own
# tests/local.sh and tests/local_multi_workers.sh, unchanged, and through
# tracker/launch.py. ps-lite's scripts do not report a process's exit
# status (they end with a bare `wait`), so the program each starts is a
# wrapper that records it; every run must end with every process at 0 and
# print what the program prints when it passes.
# Usage: upstream.sh PSLITE_DIR BUILD_DIR PYTHON LAUNCH_PY [REPEAT]
# Exits 77 (skipped) when PSLITE_DIR is empty.
set -euo pipefail
pslite=$1
build=$2
python=$3
launch=$4
repeat=${5:-4}
if [ -z "$pslite" ]; then
  echo "skipped: no ps-lite checkout given (configure with" \
    "-DPS_PSLITE_SOURCE_DIR=/path/to/ps-lite to run its own tests)"
  exit 77
fi
programs="test_connection test_kv_app test_kv_app_benchmark test_simple_app
          test_kv_app_multi_workers"
for p in $programs; do
  [ -f "$pslite/tests/$p.cc" ] || {
    echo "no $pslite/tests/$p.cc: not a ps-lite checkout" >&2
    exit 1
  }
done
tmp=$(mktemp -d)
group=""  # the session of the ps-lite script running, if any
kill_group() {
  if [ -n "$group" ]; then
    kill -KILL -- "-$group" 2> /dev/null || true
    group=""
  fi
}
trap 'kill_group; rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
mkdir "$tmp/src"
{
  echo "cmake_minimum_required(VERSION 3.22)"
  echo "project(pslite_upstream LANGUAGES CXX)"
  echo "set(CMAKE_CXX_STANDARD 17)"
  echo "find_package(ps CONFIG REQUIRED)"
  for p in $programs; do
    echo "add_executable($p $pslite/tests/$p.cc)"
    echo "target_link_libraries($p PRIVATE ps::ps)"
  done
} > "$tmp/src/CMakeLists.txt"
cmake -S "$tmp/src" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$tmp/configure.log"
cmake --build "$tmp/build" -j2 > "$tmp/build.log" 2>&1 || {
  cat "$tmp/build.log"
  exit 1
}
echo "built" $programs "unchanged"

# The wrapper ps-lite's scripts start: runs the program, records its status.
cat > "$tmp/wrap.sh" << 'WRAP'
#!/usr/bin/env bash
"$PSLITE_PROGRAM" "$@"
status=$?
echo "$DMLC_ROLE $status" >> "$PSLITE_STATUS"
exit $status
WRAP
chmod +x "$tmp/wrap.sh"

# check LOG PROCESSES MARKER COUNT: PROCESSES processes exited 0 (ps-lite's
# scripts: from the status file; skipped when empty), and LOG has COUNT
# lines matching MARKER (skipped when MARKER is -: the program prints
# nothing when it passes).
# shellcheck source=expect.sh
source "$(dirname "$0")/expect.sh"
check() {
  local log=$1 processes=$2 marker=$3 count=$4
  if [ -n "$processes" ]; then
    expect "$tmp/status" ' 0$' "$processes"
  fi
  [ "$marker" = - ] || expect "$log" "$marker" "$count"
}

# run PROGRAM SCRIPT W_PROCESSES K MARKER COUNT
run() {
  local prog=$1 script=$2 wprocs=$3 k=$4 marker=$5 count=$6 i
  for ((i = 1; i <= repeat; ++i)); do
    echo "== $prog, run $i of $repeat: ps-lite's $script 2 2"
    : > "$tmp/status"
    # ps-lite's scripts set DMLC_PS_ROOT_PORT=8000 themselves and start
    # the processes in the background: the script runs in a session of its
    # own, so that a run past 300 s is ended whole (kill_group).
    (cd "$pslite/tests" &&
      PSLITE_PROGRAM="$tmp/build/$prog" PSLITE_STATUS="$tmp/status" \
        exec setsid bash "./$script" 2 2 "$tmp/wrap.sh") \
      > "$tmp/out.log" 2>&1 &
    group=$!
    local t
    for ((t = 0; t < 3000; ++t)); do
      kill -0 "$group" 2> /dev/null || break
      sleep 0.1
    done
    if kill -0 "$group" 2> /dev/null; then
      kill_group
      echo "FAIL: $script ran past 300 s" >&2
      cat "$tmp/out.log" >&2
      exit 1
    fi
    wait "$group" || {
      echo "FAIL: $script exited $?" >&2
      cat "$tmp/out.log" >&2
      exit 1
    }
    group=""
    check "$tmp/out.log" $((3 + wprocs)) "$marker" "$count"
    echo "== $prog, run $i of $repeat: launch.py -s 2 -w 2" \
      "--worker-customers $k"
    "$python" "$launch" -s 2 -w 2 --worker-customers "$k" --timeout 300 \
      -- /bin/sh -c 'exec "$0" "$DMLC_ROLE"' "$tmp/build/$prog" \
      > "$tmp/out.log" 2>&1 || {
      cat "$tmp/out.log" >&2
      exit 1
    }
    check "$tmp/out.log" "" "$marker" "$count"  # launch.py exited 0
  done
}

run test_connection local.sh 2 1 - 0
run test_kv_app local.sh 2 1 "error: 0, 0" 2
run test_kv_app_benchmark local.sh 2 1 "num = 10000000, Pull" 2
run test_simple_app local.sh 2 1 - 0
run test_kv_app_multi_workers local_multi_workers.sh 1 2 "error: 0, 0" 2
echo "ps-lite's five test programs passed, $repeat times each, both ways"
