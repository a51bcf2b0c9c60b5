#!/usr/bin/env bash
# Starts a job by hand the ps-lite way (its tests/local.sh): DMLC_*
# variables, the scheduler, then the servers, then the workers, all on
# 127.0.0.1, no key file. Every process is bounded by `timeout`; exits 0
# only when every process did, else names the first that did not.
# PS_LOCAL_WORKER_PROCESSES=N starts N worker processes instead of
# NUM_WORKERS, for programs whose worker processes start several worker
# customers each (ps-lite's local_multi_workers.sh is N=1).
# Usage: local.sh NUM_SERVERS NUM_WORKERS PROGRAM [ARGS...]
set -u
export DMLC_NUM_SERVER=$1
export DMLC_NUM_WORKER=$2
bin=$3
shift 3
export DMLC_PS_ROOT_URI=127.0.0.1
export DMLC_PS_ROOT_PORT=${DMLC_PS_ROOT_PORT:-$(python3 -c \
  'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
unset PS_KEY_FILE
limit=${PS_LOCAL_TIMEOUT:-120}
pids=()
names=()
DMLC_ROLE=scheduler timeout "$limit" "$bin" "$@" &
pids+=($!); names+=(scheduler)
for ((i = 0; i < DMLC_NUM_SERVER; ++i)); do
  DMLC_ROLE=server timeout "$limit" "$bin" "$@" &
  pids+=($!); names+=("server process $i")
done
for ((i = 0; i < ${PS_LOCAL_WORKER_PROCESSES:-$DMLC_NUM_WORKER}; ++i)); do
  DMLC_ROLE=worker timeout "$limit" "$bin" "$@" &
  pids+=($!); names+=("worker process $i")
done
status=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
    echo "local.sh: ${names[$i]} exited with $rc" >&2
    status=1
  fi
done
exit $status
