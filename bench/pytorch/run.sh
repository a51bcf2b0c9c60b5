#!/usr/bin/env bash
# Side by side on this machine: the ps PyTorch trainer (S = 1, 2; W = 1, 2),
# PyTorch's RPC parameter-server tutorial (W = 1, and W = 2) and DDP with gloo (2
# processes); same Net, batch 32, SGD(lr 0.01, momentum 0.9). Prints one
# table row per run (wall = the whole job, start to exit).
# Usage: bench/pytorch/run.sh [extra trainer args, e.g. --train-limit 12800]
# Needs the module: PS_PYTHONPATH (default build/python/pkg) or an installed ps.
# One run on a 2-core machine, PS_PYTHONPATH=build/python/pkg
# bench/pytorch/run.sh --train-limit 9600 --test-limit 2000 (samples/s,
# test accuracy): ps S1 W1 1453, 0.9335; ps S1 W2 1032, 0.914; ps S2 W1 860,
# 0.9335; ps S2 W2 672, 0.914; RPC tutorial W1 653, 0.924 (602 with
# --threads 1); DDP gloo 2 processes 1077, 0.914. ps at W = 1: 2.2x the
# tutorial (weights and gradients in ps.shared_array memory, one torch
# thread; the summary line counts the frames that went by reference).
set -uo pipefail
cd "$(dirname "$0")/../.."
py=/usr/bin/python3
export PYTHONPATH="${PS_PYTHONPATH:-$PWD/build/python/pkg}${PYTHONPATH:+:$PYTHONPATH}"
out=$(mktemp -d)
row() {  # name, command...
  local name=$1; shift
  local t0=$(date +%s.%N)
  "$@" > "$out/$name.log" 2>&1
  local rc=$? t1=$(date +%s.%N)
  local json=$(grep -o '{"trainer".*}' "$out/$name.log" | tail -1)
  printf '%-22s rc=%d wall=%6.1fs %s\n' "$name" "$rc" \
    "$(echo "$t1 - $t0" | bc)" "${json:-(no summary; see $out/$name.log)}"
}
for s in 1 2; do
  for w in 1 2; do
    row "ps_S${s}_W${w}" $py tracker/launch.py -s $s -w $w -- \
      $py examples/pytorch/mnist_ps.py "$@"
  done
done
row rpc_tutorial_W1 $py bench/pytorch/rpc_ps.py --trainers 1 "$@"
# The tutorial with two trainers: its server's in-place optimizer step races
# the other trainer's backward. rc and the log say what happened.
row rpc_tutorial_W2 $py bench/pytorch/rpc_ps.py --trainers 2 "$@"
row ddp_gloo_2 $py bench/pytorch/ddp.py --procs 2 "$@"
echo "logs: $out"
