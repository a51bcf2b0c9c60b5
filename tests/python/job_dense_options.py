"""A job for test_pytorch_options.py: under the job's PS_REPLICAS=1 or
PS_MAX_RESTARTS, a DenseServer made without what they need is refused,
naming the setting, and so is a Python handler KVServer under
PS_REPLICAS=1. With the argument `schedule`, a DenseServer and serve_dense
with a bad learning-rate schedule are refused (the first also before
ps.start()). Each server prints `server: <label>: <Exception>: <message>`;
every process ends well."""

import sys

import numpy as np

import ps
import ps.dense

layout, zeros = ps.DenseLayout(4, 2), np.zeros(4, np.float32)


def attempt(label, make):
    try:
        make()
        print(f"server: {label}: no error", flush=True)
    except Exception as e:  # noqa: BLE001 -- the type is checked
        print(f"server: {label}: {type(e).__name__}: {e}", flush=True)


def serve(**kw):
    # timeout_s: a schedule wrongly accepted ends in ps.Error, not a hang.
    return lambda: ps.dense.serve_dense(zeros, 2, timeout_s=5, **kw)


schedule = sys.argv[1:] == ["schedule"]
if schedule and ps.role() == "server":
    attempt("before start", lambda: ps.DenseServer(
        layout, 0, 2, zeros, ps.OptimizerConfig(), lr_schedule="onecycle"))
ps.start()
if ps.is_server() and schedule:
    attempt("lr_schedule", lambda: ps.DenseServer(
        layout, 0, 2, zeros, ps.OptimizerConfig(), lr_schedule="cosine"))
    attempt("total_steps", serve(lr_schedule="onecycle"))
    attempt("warmup_steps", serve(lr_schedule="onecycle", total_steps=10,
                                  warmup_steps=10))
    attempt("step with total_steps", serve(total_steps=10))
    attempt("onecycle with lr_step", serve(lr_schedule="onecycle",
                                           total_steps=10, lr_step=2))
elif ps.is_server():
    for label, kw in (("no replica", {}),
                      ("stop", {"on_worker_failure": "stop"})):
        attempt(label, lambda: ps.DenseServer(layout, 0, 2, zeros,
                                              ps.OptimizerConfig(), **kw))
    try:
        ps.KVServer(print, app_id=1).close()
        print("server: KVServer: no error", flush=True)
    except ValueError as e:
        print(f"server: KVServer: ValueError: {e}", flush=True)
ps.finalize()
