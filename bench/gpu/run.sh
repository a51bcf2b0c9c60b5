#!/usr/bin/env bash
# The CUDA backend on a real GPU, in one run:
#  1. cuda_ops_test: every GPU op against the CPU op;
#  2. mnist_local --device cuda: test accuracy after 2 epochs at batch 64,
#     and train samples/s at batch 32, 64, 128 and 512 (the second of two
#     epochs, after the warm-up),
#     and at 64 with --resident=false (the worker's host-side step);
#  3. PyTorch on the same GPU, same Net, batches and optimizer
#     (bench/gpu/torch_mnist.py), and ours over PyTorch's;
#  4. mnist_dist --device cuda, 2 servers + 2 workers sharing the GPU,
#     through the tracker, with the job key (the default) and
#     with --insecure: accuracy, samples/s and keyed/plain;
#  5. the CPU side: the kv bench (1+1 and 2+2 against raw ZeroMQ) and the
#     mnist_dist S x W table (S, W in 1, 2, 4) at batch 64 on the CPU.
# Logs go to LOG_DIR (default: a temporary folder); the summary is printed
# last. It prints; it never asserts.
# Usage: bench/gpu/run.sh BUILD_DIR   (env: DATA_DIR, default data/mnist;
# PYTHON, default python3 (needs torch with CUDA); ONLY=1,2,3,4,5 picks
# sections; STEPS per S x W run, default 60; RUN_TIMEOUT per run, default
# 600 s)
set -uo pipefail
build="$(cd "${1:?usage: bench/gpu/run.sh BUILD_DIR}" && pwd)"
root="$(cd "$(dirname "$0")/../.." && pwd)"
data="${DATA_DIR:-$root/data/mnist}"
py="${PYTHON:-python3}"
only="${ONLY:-1,2,3,4,5}"
steps="${STEPS:-60}"
logs="${LOG_DIR:-$(mktemp -d)}"
mkdir -p "$logs"
summary="$logs/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
want() { [[ ",$only," == *",$1,"* ]]; }
ex="$build/examples/mnist"
# Every run is bounded: RUN_TIMEOUT seconds (default 600).
bounded() { timeout "${RUN_TIMEOUT:-600}" "$@"; }

# Train samples/s and final accuracy from mnist_local/mnist_dist output.
rate() { grep -oE '([0-9]+) train samples/s' | awk '{s += $1} END {print s + 0}'; }
epoch_rate() { grep -oE '([0-9]+) epoch samples/s' | tail -1 | grep -oE '^[0-9]+'; }
acc() { grep -oE 'final: test accuracy [0-9.]+%' | tail -1 | grep -oE '[0-9.]+%'; }

if want 1; then
  bounded "$build/tests/model/cuda_ops_test" >"$logs/cuda_ops_test.log" 2>&1
  say "1. cuda_ops_test: rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' \
    "$logs/cuda_ops_test.log" | tr '\n' ' ')"
fi

declare -A ours
if want 2; then
  bounded "$ex/mnist_local" --device cuda --data_dir "$data" --epochs 2 \
    --batch_size 64 --log_every_s 1000 >"$logs/local_acc.log" 2>&1
  say "2. mnist_local --device cuda, 2 epochs, batch 64: rc=$?" \
    "accuracy $(acc <"$logs/local_acc.log")" \
    "$(rate <"$logs/local_acc.log") samples/s"
  # The second epoch's rate: warmed up (cuDNN's algorithm search, lazy
  # kernel loading), as torch_mnist.py times after its warm-up steps.
  for b in 32 64 128 512; do
    bounded "$ex/mnist_local" --device cuda --data_dir "$data" --epochs 2 \
      --batch_size "$b" --test_limit 1000 --log_every_s 1000 \
      >"$logs/local_b$b.log" 2>&1
    ours[$b]=$(epoch_rate <"$logs/local_b$b.log")
    say "   batch $b: ${ours[$b]} samples/s (second epoch)," \
      "$(rate <"$logs/local_b$b.log") over both"
  done
  # The worker's way for comparison: parameters up and gradients down every
  # step, the optimizer and the dropout masks on the host.
  bounded "$ex/mnist_local" --device cuda --resident=false --data_dir "$data" \
    --epochs 2 --batch_size 64 --test_limit 1000 --log_every_s 1000 \
    >"$logs/local_host_b64.log" 2>&1
  say "   batch 64, --resident=false: $(epoch_rate <"$logs/local_host_b64.log")" \
    "samples/s (second epoch)"
fi

if want 3; then
  bounded "$py" "$root/bench/gpu/torch_mnist.py" --data_dir "$data" \
    >"$logs/torch.log" 2>&1
  say "3. PyTorch on the same GPU: rc=$? $(head -1 "$logs/torch.log")"
  for b in 32 64 128 512; do
    fp32=$(grep -oE "setting=fp32 batch=$b samples_per_s=[0-9]+" \
      "$logs/torch.log" | grep -oE '[0-9]+$')
    tf32=$(grep -oE "setting=tf32 batch=$b samples_per_s=[0-9]+" \
      "$logs/torch.log" | grep -oE '[0-9]+$')
    line="   batch $b: torch fp32 ${fp32:-?} tf32 ${tf32:-?} samples/s"
    if [ -n "${ours[$b]:-}" ] && [ -n "$fp32" ]; then
      line+="; ours/torch-fp32 $(awk -v a="${ours[$b]}" -v b="$fp32" \
        'BEGIN {printf "%.2f", a / b}')"
      [ -n "$tf32" ] && line+=" ours/torch-tf32 $(awk -v a="${ours[$b]}" \
        -v b="$tf32" 'BEGIN {printf "%.2f", a / b}')"
    fi
    say "$line"
  done
fi

if want 4; then
  declare -A dist
  for mode in keyed insecure; do
    flags=()
    [ "$mode" = insecure ] && flags=(--insecure)
    bounded "$py" "$root/tracker/launch.py" -s 2 -w 2 --timeout 600 "${flags[@]}" \
      -- "$ex/mnist_dist" --device cuda --data_dir "$data" --epochs 2 \
      --batch_size 64 --log_every_s 1000 >"$logs/dist_$mode.log" 2>&1
    rc=$?
    dist[$mode]=$(rate <"$logs/dist_$mode.log")
    say "4. mnist_dist --device cuda -s 2 -w 2, $mode, 2 epochs, batch 64" \
      "per worker: rc=$rc accuracy $(acc <"$logs/dist_$mode.log")" \
      "${dist[$mode]} samples/s (both workers)"
  done
  say "   keyed/insecure: $(awk -v a="${dist[keyed]}" -v b="${dist[insecure]}" \
    'BEGIN {if (b > 0) printf "%.2f", a / b; else print "?"}')"
fi

if want 5; then
  bounded "$py" "$root/bench/kv/run.py" "$build" --enc_pairs 0 --resend_pairs 0 \
    >"$logs/kv.log" 2>&1
  say "5. kv bench (rc=$?), Push+Wait / Pull+Wait against raw ZeroMQ:"
  sed -n '/== Push+Wait/,/== One-key/p' "$logs/kv.log" | sed '$d' |
    tee -a "$summary"
  cores=$(nproc)
  say "   mnist_dist on the CPU, batch 64 per worker, $steps steps, --insecure," \
    "$cores cores, threads per process = cores / W (samples/s, all workers):"
  say "$(printf '   %-4s %10s %10s %10s' S W=1 W=2 W=4)"
  for s in 1 2 4; do
    row=$(printf '   %-4s' "$s")
    for w in 1 2 4; do
      t=$(( cores / w )); [ "$t" -lt 1 ] && t=1
      r=$(bounded "$py" "$root/tracker/launch.py" -s "$s" -w "$w" --timeout 300 \
        --insecure -- "$ex/mnist_dist" --data_dir "$data" --threads "$t" \
        --test_limit 100 --epochs 1 --batch_size 64 --log_every_s 1000 \
        --train_limit $(( w * 64 * steps )) 2>"$logs/sxw_${s}_$w.err" | rate)
      row+=$(printf ' %10s' "$r")
    done
    say "$row"
  done
fi
echo "== summary ($summary)"
cat "$summary"
