#!/usr/bin/env bash
# The layers of src/CMakeLists.txt, checked on the built tree:
# 1. an include that crosses a layer upwards does not compile (the flags of
#    a postoffice file, from compile_commands.json, cannot find "kv/..."),
#    while the same include compiles with a kv file's flags;
# 2. a program that only pushes and pulls (tests/core/consumer/main.cc),
#    linked with ps::kv alone, pulls exactly what it pushed and links no
#    prometheus-cpp and no abseil (ldd: no such library; nm: no such
#    symbol), while the same program linked with ps::ps links
#    prometheus-cpp (the exporter is always linked; the sparse tables, and
#    with them abseil, only when a program uses them).
# Usage: layers_test.sh BUILD_DIR KV_ONLY_PROGRAM FULL_PROGRAM
set -euo pipefail
build=$1
kv_only=$2
full=$3
fail() {
  echo "layers_test: $*" >&2
  exit 1
}

# The -I/-isystem flags of the first compile command whose file ends in $1.
include_flags() {
  /usr/bin/python3 - "$build/compile_commands.json" "$1" <<'PY'
import json, shlex, sys
for entry in json.load(open(sys.argv[1])):
    if entry["file"].endswith(sys.argv[2]):
        args = shlex.split(entry["command"])
        out = []
        for i, a in enumerate(args):
            if a in ("-I", "-isystem"):
                out += [a, args[i + 1]]
            elif a.startswith("-I"):
                out.append(a)
        print("\n".join(out))
        sys.exit(0)
sys.exit("no compile command for " + sys.argv[2])
PY
}

compiles() {  # compiles SOURCE_FILE_OF_LAYER HEADER
  local flags
  mapfile -t flags < <(include_flags "$1")
  echo "#include \"$2\"" |
    "${CXX:-c++}" -std=c++17 -fsyntax-only -x c++ - "${flags[@]}" 2>&1
}

compiles src/kv/dedup.cc kv/dedup.h > /dev/null ||
  fail "kv/dedup.h does not compile with a kv file's flags"
if out=$(compiles src/postoffice/node.cc kv/dedup.h); then
  fail "kv/dedup.h compiles with a postoffice file's flags"
fi
grep -q 'kv/dedup.h: No such file' <<< "$out" ||
  fail "postoffice including kv/dedup.h failed otherwise: $out"
if compiles src/van/codec.cc postoffice/options.h > /dev/null; then
  fail "postoffice/options.h compiles with a van file's flags"
fi
if compiles src/kv/dedup.cc exporter/prometheus_metrics.h > /dev/null; then
  fail "exporter/prometheus_metrics.h compiles with a kv file's flags"
fi
echo "layers_test: upward includes do not compile"

"$kv_only" || fail "$kv_only (ps::kv only) did not pull what it pushed"
"$full" || fail "$full (ps::ps) did not pull what it pushed"

libs_kv=$(ldd "$kv_only")
syms_kv=$(nm -C "$kv_only")
if grep -E 'prometheus|absl' <<< "$libs_kv"; then
  fail "$kv_only links the libraries above"
fi
if grep -E 'prometheus::|absl::|PrometheusMetrics|SparseTable' <<< "$syms_kv" |
    head -5; then
  fail "$kv_only holds the symbols above"
fi
grep -q prometheus <<< "$(ldd "$full")" ||
  fail "$full (ps::ps) does not link prometheus-cpp: the check sees nothing"
echo "layers_test: ps::kv alone links no prometheus-cpp and no abseil"
