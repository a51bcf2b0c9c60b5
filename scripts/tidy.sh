#!/usr/bin/env bash
# Runs clang-tidy (.clang-tidy at the root) on the C++ files that differ
# from a base commit, with the compile commands of a build tree; exits 1 on
# any finding (the checks are errors), 0 when there is nothing to check.
# Usage: scripts/tidy.sh [BUILD_DIR [BASE]]
#   BUILD_DIR  default build (needs BUILD_DIR/compile_commands.json; CMake
#              writes it: CMAKE_EXPORT_COMPILE_COMMANDS is on)
#   BASE       default: `git merge-base HEAD origin/main` when origin/main
#              exists and HEAD is ahead of it, else HEAD~1 (a clone of the
#              commit: the last commit's change); a checkout of one commit
#              (a shallow clone: no HEAD~1) checks nothing, saying so.
# Only files with a compile command are checked; a changed header is
# checked through the changed files that include it (.clang-tidy's
# HeaderFilterRegex), not on its own.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
base=${2:-}
commands=$build/compile_commands.json
if [ ! -f "$commands" ]; then
  echo "tidy: no $commands: configure the build first (cmake -S . -B $build)" >&2
  exit 1
fi
if ! command -v clang-tidy > /dev/null; then
  echo "tidy: clang-tidy not found (scripts/install_deps.sh installs it)" >&2
  exit 1
fi
if [ -z "$base" ]; then
  if git rev-parse -q --verify origin/main > /dev/null; then
    base=$(git merge-base HEAD origin/main)
  fi
  # A clone of the commit itself (CI's) has origin/main at HEAD: then the
  # change checked is the last commit's.
  if { [ -z "$base" ] || [ "$base" = "$(git rev-parse HEAD)" ]; } &&
     git rev-parse -q --verify HEAD~1 > /dev/null; then
    base=HEAD~1
  fi
fi
if [ -z "$base" ]; then
  echo "tidy: a checkout of one commit, no base to compare with: nothing checked"
  exit 0
fi
# Changed, added or renamed since BASE, committed or not; never deleted.
mapfile -t changed < <(git diff --name-only --diff-filter=d "$base" -- \
                         '*.cc' '*.h')
echo "tidy: files changed since $(git rev-parse --short "$base")"
# The changed files that have a compile command.
mapfile -t files < <(/usr/bin/python3 - "$commands" "${changed[@]}" <<'PY'
import json, os, sys
known = {os.path.realpath(e["file"]) for e in json.load(open(sys.argv[1]))}
for f in sys.argv[2:]:
    if os.path.realpath(f) in known:
        print(f)
PY
)
if [ ${#files[@]} -eq 0 ]; then
  echo "tidy: nothing to check"
  exit 0
fi
echo "tidy: ${#files[@]} file(s): ${files[*]}"
status=0
for f in "${files[@]}"; do
  # The build's flags are GCC's: clang, which clang-tidy parses with, does
  # not know some (-Wshadow=local), and that is no finding.
  clang-tidy -p "$build" --quiet --extra-arg=-Wno-unknown-warning-option \
    "$f" 2> /dev/null || status=1
done
if [ $status -ne 0 ]; then
  echo "tidy: findings above (.clang-tidy)" >&2
fi
exit $status
