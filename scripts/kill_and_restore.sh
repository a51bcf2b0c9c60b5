#!/usr/bin/env bash
# Trains mnist_dist twice with checkpoints: once to the end, once killed
# (SIGKILL to every process of the job) after a file of step KILL_AT or
# later exists plus a random 0-2 s, then relaunched with --restore. Prints
# both final accuracies, the step resumed from, and whether the final
# weights are the same bytes.
# Usage: scripts/kill_and_restore.sh S W KILL_AT [mnist_dist flags...]
# e.g.   scripts/kill_and_restore.sh 2 3 150 --train_limit 30000
set -euo pipefail
cd "$(dirname "$0")/.."
s=$1 w=$2 kill_at=$3
shift 3
prog=build/examples/mnist/mnist_dist
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(--checkpoint_every_steps 50 "$@")
launch() { python3 tracker/launch.py -s "$s" -w "$w" --timeout 1800 -- "$prog" "$@"; }

mkdir "$work/whole" "$work/killed"
launch "${flags[@]}" --checkpoint_dir "$work/whole" \
  --dump_weights "$work/whole.bin" > "$work/whole.log" 2>&1
grep -h "final: test accuracy" "$work/whole.log"

# Not through launch(): $! must be the launcher, the job's parent.
python3 tracker/launch.py -s "$s" -w "$w" --timeout 1800 -- "$prog" \
  "${flags[@]}" --checkpoint_dir "$work/killed" > "$work/killed.log" 2>&1 &
launcher=$!
newest() {
  ls "$work/killed" | sed -n 's/^step-0*\([0-9]*\)\..*/\1/p' | sort -n | tail -1
}
for _ in $(seq 1 36000); do  # bounded: 36000 x 0.05 s
  n=$(newest)
  [ -n "$n" ] && [ "$n" -ge "$kill_at" ] && break
  sleep 0.05
done
sleep "$(awk 'BEGIN { srand(); printf "%.2f", 2 * rand() }')"
for p in $(ps -o pid= --ppid "$launcher"); do kill -KILL "$p" 2>/dev/null || true; done
kill -KILL "$launcher" 2>/dev/null || true
wait "$launcher" 2>/dev/null || true
echo "killed at: newest file of step $(newest)"

launch "${flags[@]}" --checkpoint_dir "$work/killed" --restore \
  --dump_weights "$work/restored.bin" > "$work/restored.log" 2>&1
grep -h "worker 0\] restore: resuming" "$work/restored.log"
grep -h "final: test accuracy" "$work/restored.log"
if cmp -s "$work/whole.bin" "$work/restored.bin"; then
  echo "final weights: the same bytes"
else
  echo "final weights: differ"
fi
