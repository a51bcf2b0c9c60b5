#!/usr/bin/env bash
# Side by side on this machine: the ps PyTorch trainer (S = 1, 2; W = 1, 2),
# PyTorch's RPC parameter-server tutorial (W = 1, and W = 2) and DDP with gloo (2
# processes); same Net, batch 32, SGD(lr 0.01, momentum 0.9). Prints one
# table row per run (wall = the whole job, start to exit).
# Usage: bench/pytorch/run.sh [extra trainer args, e.g. --train-limit 12800]
# Needs the module: PS_PYTHONPATH (default build/python/pkg) or an installed ps.
# One run on a 2-core machine, one full epoch, PS_PYTHONPATH=build/python/pkg
# bench/pytorch/run.sh (samples/s, test accuracy on 10,000 images): ps S1 W1
# 1040, 0.9826; ps S1 W2 1426, 0.9838; ps S2 W1 888, 0.9826; ps S2 W2 981,
# 0.9838; RPC tutorial W1 952, 0.9819; RPC tutorial W2 crashes (in-place
# update during backward); DDP gloo 2 processes 1845, 0.9833.
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
# The trainer's settings of the others, not its recipe's defaults.
recipe=(--epochs 1 --batch-size 32 --optimizer sgd --lr 0.01 --momentum 0.9
        --lr-schedule step --lr-ref-batch 0 --ema-decay 0 --max-shift 0)
for s in 1 2; do
  for w in 1 2; do
    row "ps_S${s}_W${w}" $py tracker/launch.py -s $s -w $w -- \
      $py examples/pytorch/mnist_ps.py "${recipe[@]}" "$@"
  done
done
row rpc_tutorial_W1 $py bench/pytorch/rpc_ps.py --trainers 1 "$@"
# The tutorial with two trainers: its server's in-place optimizer step races
# the other trainer's backward. rc and the log say what happened.
row rpc_tutorial_W2 $py bench/pytorch/rpc_ps.py --trainers 2 "$@"
row ddp_gloo_2 $py bench/pytorch/ddp.py --procs 2 "$@"
echo "logs: $out"
