#!/usr/bin/env bash
# Throughput of mnist_dist, measured in one run on this machine:
#  1. the same engine in one process (--local) against 1 server + 1 worker
#     at per-worker batch 32, 64 and 128, with the ratio (the bar: >= 0.90
#     at batch 64);
#  2. train samples/s of the whole job for S in {1, 2} x W in {1, 2} at
#     batch 64 (every worker's rate summed);
#  3. 1 server + 1 worker at batch 64 with --overlap off and on (the fc keys
#     exchanged during the conv backward pass), at THREADS and at 1 thread
#     per process (a core left for communication), each against --local.
#  4. the cost of encryption: 1 server + 1 worker at batch 64 with --insecure
#     and with the launcher's default job key (sealed frames), alternated in PAIRS
#     back-to-back pairs, with each pair's ratio keyed/plain; once as jobs
#     run here (co-located nodes pass the values through shared memory, only
#     headers go through the encrypted sockets) and once with PS_SHM=0 (all
#     values through the sockets, as between hosts).
# Sections 1 and 2 run with --overlap auto. Sections 1-3 run their jobs with
# --insecure (plain TCP), as they did before jobs were keyed by default.
# Usage: bench/mnist/run.sh BUILD_DIR   (env: STEPS per run, default 60;
# THREADS per process, default 0 = all cores; DATA_DIR, default data/mnist;
# PAIRS, default 3; ONLY=encryption runs section 4 alone)
set -euo pipefail

build="${1:?usage: bench/mnist/run.sh BUILD_DIR}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="$build/examples/mnist/mnist_dist"
[ -x "$bin" ] || { echo "run.sh: $bin not built (cmake --build $build --target mnist_dist)" >&2; exit 1; }
steps="${STEPS:-60}"
threads="${THREADS:-0}"
data="${DATA_DIR:-$root/data/mnist}"
pairs="${PAIRS:-3}"
only="${ONLY:-}"
common=(--data_dir "$data" --threads "$threads" --test_limit 100 --epochs 1
        --optimizer adam --lr 1e-3 --log_every_s 1000)

# samples/s from the final line(s): one number per worker; summed.
rate() { grep -oE '([0-9]+) train samples/s' | awk '{s += $1} END {print s + 0}'; }

extra=()  # more flags for local_rate and dist_rate (a later flag wins)
keys=(--insecure)  # launcher flags for dist_rate; () = a new job key
launch=()  # more launcher flags for dist_rate

local_rate() {  # batch
  "$bin" --local "${common[@]}" "${extra[@]}" --batch_size "$1" \
    --train_limit $(( $1 * steps )) | rate
}

dist_rate() {  # servers workers batch
  python3 "$root/tracker/launch.py" -s "$1" -w "$2" --timeout 300 \
    "${keys[@]}" "${launch[@]}" -- "$bin" \
    "${common[@]}" "${extra[@]}" --batch_size "$3" \
    --train_limit $(( $2 * $3 * steps )) 2>/dev/null | rate
}

encryption() {  # title, launcher flags
  launch=("${@:2}")
  echo "cost of encryption, 1S+1W at batch 64, $1:"
  echo "train samples/s with --insecure and with the job key ($pairs pairs,"
  echo "the order swapped every pair):"
  printf '%-6s %12s %12s %12s\n' pair 'plain samp/s' 'sealed samp/s' sealed/plain
  local i p k ratios=()
  for (( i = 0; i < pairs; i++ )); do
    if (( i % 2 == 0 )); then
      keys=(--insecure); p=$(dist_rate 1 1 64)
      keys=(); k=$(dist_rate 1 1 64)
    else
      keys=(); k=$(dist_rate 1 1 64)
      keys=(--insecure); p=$(dist_rate 1 1 64)
    fi
    ratios+=("$(awk -v k="$k" -v p="$p" 'BEGIN {printf "%.3f", (p > 0 ? k / p : 0)}')")
    printf '%-6s %12.0f %12.0f %12.2f\n' "$i" "$p" "$k" "${ratios[-1]}"
  done
  printf 'median sealed/plain: %s\n' \
    "$(printf '%s\n' "${ratios[@]}" | sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}')"
  keys=(--insecure)
  launch=()
}

encryption_both() {
  encryption "values through shared memory (default)"
  echo
  encryption "PS_SHM=0: values through the sockets" --env PS_SHM=0
}

echo "mnist_dist throughput: $steps steps per run, threads=$threads, $(nproc) cores"
echo
if [ "$only" = encryption ]; then encryption_both; exit 0; fi
[ -z "$only" ] || { echo "run.sh: ONLY=$only: only 'encryption' is known" >&2; exit 2; }
printf '%-7s %14s %14s %7s\n' batch 'local samp/s' '1S+1W samp/s' ratio
for b in 32 64 128; do
  l=$(local_rate "$b")
  d=$(dist_rate 1 1 "$b")
  printf '%-7s %14.0f %14.0f %7.2f\n' "$b" "$l" "$d" \
    "$(awk -v d="$d" -v l="$l" 'BEGIN {print (l > 0 ? d / l : 0)}')"
done
echo
echo "job samples/s at batch 64 (per worker), all workers summed:"
printf '%-9s %10s %10s\n' '' 'W=1' 'W=2'
for s in 1 2; do
  printf '%-9s' "S=$s"
  for w in 1 2; do printf ' %10.0f' "$(dist_rate "$s" "$w" 64)"; done
  echo
done
echo
echo "overlap of the exchange with the backward pass, 1S+1W at batch 64:"
printf '%-8s %8s %12s %12s %7s %7s\n' threads local 'overlap off' 'overlap on' \
  off on
for t in "$threads" 1; do
  extra=(--threads "$t")
  l=$(local_rate 64)
  extra=(--threads "$t" --overlap off)
  off=$(dist_rate 1 1 64)
  extra=(--threads "$t" --overlap on)
  on=$(dist_rate 1 1 64)
  printf '%-8s %8.0f %12.0f %12.0f %7.2f %7.2f\n' "$t" "$l" "$off" "$on" \
    "$(awk -v d="$off" -v l="$l" 'BEGIN {print (l > 0 ? d / l : 0)}')" \
    "$(awk -v d="$on" -v l="$l" 'BEGIN {print (l > 0 ? d / l : 0)}')"
done
echo
encryption_both
