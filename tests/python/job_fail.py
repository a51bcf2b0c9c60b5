"""A job for test_failure.py: the server dies (no Finalize) on the second
push; the worker's wait must raise ps.Error instead of hanging."""

import os
import sys
import time

import numpy as np

import ps

ps.start()
if ps.is_server():
    seen = []

    def handler(meta, keys, vals, lens):
        seen.append(1)
        if len(seen) == 2:
            os._exit(0)  # dies without a word to anyone
        return None

    server = ps.KVServer(handler)
    while True:
        time.sleep(1)
elif ps.is_worker():
    kv = ps.KVWorker()
    keys = np.array([1], dtype=np.int64)
    vals = np.ones(4, dtype=np.float32)
    kv.wait(kv.push(keys, vals))
    start = time.time()
    try:
        kv.wait(kv.push(keys, vals))
        print("worker: no error", flush=True)
    except ps.Error as e:
        print(f"worker: raised ps.Error after {time.time() - start:.1f} s: {e}",
              flush=True)
    os._exit(3)  # the job is broken: let the tracker stop the rest
else:
    while True:
        time.sleep(1)
