"""A job for test_pytorch_options.py: under the job's PS_REPLICAS=1 or
PS_MAX_RESTARTS, a DenseServer made without what they need is refused,
naming the setting, and so is a Python handler KVServer under
PS_REPLICAS=1. Each server prints `server: <label>: <Exception>:
<message>`; every process ends well."""

import numpy as np

import ps

ps.start()
if ps.is_server():
    layout, zeros = ps.DenseLayout(4, 2), np.zeros(4, np.float32)
    for label, kw in (("no replica", {}),
                      ("stop", {"on_worker_failure": "stop"})):
        try:
            ps.DenseServer(layout, 0, 2, zeros, ps.OptimizerConfig(), **kw)
            print(f"server: {label}: no error", flush=True)
        except Exception as e:  # noqa: BLE001 -- the type is checked
            print(f"server: {label}: {type(e).__name__}: {e}", flush=True)
    try:
        ps.KVServer(print, app_id=1).close()
        print("server: KVServer: no error", flush=True)
    except ValueError as e:
        print(f"server: KVServer: ValueError: {e}", flush=True)
ps.finalize()
