"""A job for test_errors.py: bad arguments and calls out of turn raise a
Python exception naming the thing and the value, and the process goes on.

`pure`: no node (run without the tracker): Placement, DenseLayout and the
calls that need ps.start(). `node`: 1 server, 1 worker through the tracker;
barriers, duplicate ids, bad key arrays, array.array buffers held exported
while a request is in flight, and calls after ps.finalize(). Each checked
call prints one line `<role>: <label>: <ExceptionType>: <message>` (or
`<label>: no error`) for the test to read; the process prints `<role>:
alive` at its end.
"""

import array
import sys

import numpy as np

import ps


def expect(label, fn):
    """Runs fn and prints what it raised (or that it did not)."""
    who = ps.role() if mode == "node" else "pure"
    try:
        fn()
        print(f"{who}: {label}: no error", flush=True)
    except Exception as e:  # noqa: BLE001 -- the type is what is checked
        print(f"{who}: {label}: {type(e).__name__}: {e}", flush=True)


mode = sys.argv[1]

if mode == "pure":
    even = ps.Placement.even_keys(1, 10)
    expect("even_keys(0, 10)", lambda: ps.Placement.even_keys(0, 10))
    expect("even_keys(-2, 10)", lambda: ps.Placement.even_keys(-2, 10))
    expect("even_keys(4, 2)", lambda: ps.Placement.even_keys(4, 2))
    expect("by_bytes unsorted",
           lambda: ps.Placement.by_bytes([5, 3], [1, 1], 2))
    expect("by_bytes sizes", lambda: ps.Placement.by_bytes([1], [1, 1], 2))
    expect("by_bytes servers", lambda: ps.Placement.by_bytes([1], [1], 0))
    expect("begin(99)", lambda: even.begin(99))
    expect("end(-1)", lambda: even.end(-1))
    assert even.begin(0) == 0 and even.server_of(5) == 0
    layout = ps.DenseLayout(10, 3)  # keys 0..3
    expect("offset(5)", lambda: layout.offset(5))
    expect("length(4)", lambda: layout.length(4))
    assert layout.offset(4) == 12 and layout.length(3) == 1
    expect("DenseLayout chunk 0", lambda: ps.DenseLayout(10, 0))
    expect("shared_array(2**62)", lambda: ps.shared_array(2 ** 62))
    expect("encode_dense_cmd", lambda: ps.encode_dense_cmd(0, -1))
    expect("barrier(12345)", lambda: ps.barrier(12345))
    expect("barrier before start", lambda: ps.barrier())
    expect("KVWorker before start", lambda: ps.KVWorker())
    expect("KVServer before start", lambda: ps.KVServer(print))
    print("pure: alive", flush=True)
    sys.exit(0)

ps.start()
expect("barrier(12345)", lambda: ps.barrier(12345))
expect("start twice", ps.start)
if ps.is_worker():
    expect("barrier(SERVER_GROUP)", lambda: ps.barrier(ps.SERVER_GROUP))
elif ps.is_server():
    expect("barrier(WORKER_GROUP)", lambda: ps.barrier(ps.WORKER_GROUP))
else:
    expect("barrier(WORKER_GROUP)", lambda: ps.barrier(ps.WORKER_GROUP))

if ps.is_server():
    store = {}

    def handler(meta, keys, vals, lens):
        k = len(vals) // len(keys) if meta["push"] else 0
        for i, key in enumerate(keys.tolist()):
            if meta["push"]:
                store[key] = store.get(key, 0) + vals[i * k:(i + 1) * k]
        if meta["pull"]:
            return np.concatenate([store[key] for key in keys.tolist()])
        return None

    server = ps.KVServer(handler)
    expect("KVServer handler", lambda: ps.KVServer(3, app_id=2))
    expect("second KVServer", lambda: ps.KVServer(handler))
    expect("DenseServer same app", lambda: ps.DenseServer(
        ps.DenseLayout(4, 2), 0, 2, np.zeros(4, np.float32),
        ps.OptimizerConfig()))
    expect("DenseServer max_delay", lambda: ps.DenseServer(
        ps.DenseLayout(4, 2), 0, 2, np.zeros(4, np.float32),
        ps.OptimizerConfig(), "bounded", -1, app_id=1))
    # Failure options this job's settings (no PS_REPLICAS, no
    # PS_MAX_RESTARTS) or the Python path do not support, refused by name.
    layout, zeros = ps.DenseLayout(4, 2), np.zeros(4, np.float32)

    def dense(**kw):
        consistency = kw.pop("consistency", "bsp")
        return lambda: ps.DenseServer(layout, 0, 2, zeros,
                                      ps.OptimizerConfig(), consistency,
                                      app_id=1, **kw)
    expect("DenseServer continue", dense(on_worker_failure="continue"))
    expect("DenseServer restart", dense(on_worker_failure="restart"))
    expect("DenseServer policy", dense(on_worker_failure="later"))
    expect("DenseServer replica", dense(replica_end_key=2,
                                        replica_weights=zeros))
    expect("DenseServer checkpoint_every", dense(checkpoint_every=5))
    expect("DenseServer checkpoint async", dense(
        consistency="async", checkpoint_dir="/nonexistent",
        checkpoint_every=5))
    ps.barrier(ps.WORKER_GROUP | ps.SERVER_GROUP)  # the worker is done
    server.close()
    ps.KVServer(handler, app_id=0).close()  # the app's id is free again

elif ps.is_worker():
    kv = ps.KVWorker()
    keys = np.array([3, 7], dtype=np.int64)
    expect("second KVWorker", ps.KVWorker)
    other = ps.KVWorker(customer_id=1)  # other ids: fine
    del other
    expect("set_placement", lambda: kv.set_placement(
        ps.Placement.even_keys(3, 100)))
    expect("keys unsorted", lambda: kv.push(
        np.array([7, 3], np.int64), np.ones(4, np.float32)))
    expect("keys duplicate", lambda: kv.push(
        np.array([3, 3], np.int64), np.ones(4, np.float32)))
    expect("keys dtype", lambda: kv.push(
        keys.astype(np.int32), np.ones(4, np.float32)))
    expect("keys empty", lambda: kv.push(
        np.array([], np.int64), np.ones(4, np.float32)))
    expect("vals size", lambda: kv.push(keys, np.ones(5, np.float32)))
    expect("lens negative", lambda: kv.push(
        keys, np.ones(4, np.float32), np.array([-1, 5], np.int32)))
    expect("lens count", lambda: kv.push(
        keys, np.ones(4, np.float32), np.array([4], np.int32)))
    expect("out empty", lambda: kv.pull(keys, np.ones(0, np.float32)))
    expect("pushpull sizes", lambda: kv.pushpull(
        keys, np.ones(4, np.float32), np.ones(6, np.float32)))
    expect("wait unknown", lambda: kv.wait(12345))
    assert kv.num_pending == 0, kv.num_pending

    # The push's sources and the pull's destination stay exported until the
    # wait: growing them meanwhile raises BufferError, and the values are
    # exact after it.
    akeys = array.array("q", [3, 7])
    avals = array.array("f", [1.5, 2.5, 3.5, 4.5])
    ts = kv.push(akeys, avals)
    expect("grow pushed vals", lambda: avals.append(9.0))
    expect("grow pushed keys", lambda: akeys.append(9))
    kv.wait(ts)
    out = array.array("f", [-1.0] * 4)
    ts = kv.pull(akeys, out)
    expect("grow pull destination", lambda: out.append(0.0))
    expect("shrink pull destination", lambda: out.pop())
    kv.wait(ts)
    print(f"worker: pulled {list(out)}", flush=True)
    assert list(out) == [1.5, 2.5, 3.5, 4.5], out
    out.append(0.0)  # waited for: no longer exported
    avals.append(9.0)
    akeys.append(9)
    assert len(out) == 5 and len(avals) == 5 and len(akeys) == 3
    # A worker dropped with a pull in flight lets go of its buffers.
    dropped = ps.KVWorker(customer_id=2)
    out2 = array.array("f", [0.0] * 4)
    dropped.pull(keys, out2)
    expect("grow before drop", lambda: out2.append(0.0))
    del dropped
    out2.append(0.0)
    # One not waited for before finalize: its wait raises, its destination
    # stays exported (a late answer might still land).
    late = array.array("f", [0.0] * 4)
    late_ts = kv.pull(keys, late)
    ps.barrier(ps.WORKER_GROUP | ps.SERVER_GROUP)

ps.finalize()
expect("barrier after finalize", ps.barrier)
expect("KVWorker after finalize", ps.KVWorker)
if ps.is_worker():
    expect("push after finalize",
           lambda: kv.push(keys, np.ones(4, np.float32)))
    expect("wait after finalize", lambda: kv.wait(late_ts))
    expect("grow after failed wait", lambda: late.append(0.0))
print(f"{ps.role()}: alive", flush=True)
