#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, builds the ps-lite style
# programs of tests/pslite/programs against it (find_package(ps), no change
# to their source), and runs each both through tracker/launch.py and by
# hand (local.sh), checking every exit code and the lines each prints.
# Usage: pslite_test.sh BUILD_DIR SOURCE_DIR PYTHON LAUNCH_PY
set -euo pipefail
build=$1
src=$2
python=$3
launch=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
cmake -S "$src/programs" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$tmp/configure.log"
cmake --build "$tmp/build" -j2 > "$tmp/build.log" 2>&1 || {
  cat "$tmp/build.log"
  exit 1
}

# ps-lite's public names (built above); run without a job, it checks the
# ones that need no node.
"$tmp/build/api_names" > "$tmp/api_names.log" 2>&1 || {
  cat "$tmp/api_names.log"
  exit 1
}
grep -q "^api names ok$" "$tmp/api_names.log" || {
  cat "$tmp/api_names.log"
  exit 1
}

# shellcheck source=expect.sh
source "$src/expect.sh"

# run WAY S W PROGRAM [K]: runs one job, output in $tmp/out.log; with K,
# each worker process starts K worker customers (W/K processes).
run() {
  local way=$1 s=$2 w=$3 prog=$4 k=${5:-1}
  echo "== $prog, $s servers, $w workers, $((w / k)) worker processes, $way"
  if [ "$way" = tracker ]; then
    "$python" "$launch" -s "$s" -w "$w" --worker-customers "$k" \
      --timeout 120 -- "$tmp/build/$prog" \
      > "$tmp/out.log" 2>&1 || { cat "$tmp/out.log"; exit 1; }
  else
    PS_LOCAL_WORKER_PROCESSES=$((w / k)) bash "$src/local.sh" "$s" "$w" \
      "$tmp/build/$prog" > "$tmp/out.log" 2>&1 || {
      cat "$tmp/out.log"
      exit 1
    }
  fi
}

for way in tracker hand; do
  run $way 2 2 simple_app
  expect "$tmp/out.log" "simple_app ok 100 of 100" 5

  run $way 2 2 kv_app
  expect "$tmp/out.log" "worker [01] ok" 2
  expect "$tmp/out.log" "server [01] holds" 2

  # As ps-lite's local_multi_workers.sh: one worker process, two worker
  # customers, DMLC_NUM_WORKER=2; then two processes of two.
  run $way 2 2 multi_workers 2
  expect "$tmp/out.log" "worker [01] customer [01] ok, shared 2$" 2
  run $way 2 4 multi_workers 2
  expect "$tmp/out.log" "worker [0-3] customer [01] ok, shared 4$" 4

  run $way 2 2 benchmark
  expect "$tmp/out.log" "worker [01] pushed and pulled 10000000 keys exactly" 2

  run $way 2 2 slicer_app
  expect "$tmp/out.log" "worker [01] ok" 2
  expect "$tmp/out.log" "server [01] holds 500 keys" 2
done
echo "all ps-lite programs passed, both ways"
