"""A job for test_kv.py: a Python-handler server summing pushes, and
DenseShard servers updated by SGD(lr=1); workers push known values from
NumPy arrays and torch tensors and check exact results, in place."""

import sys

import numpy as np
import torch

import ps
import ps.dense

ps.start()
W = ps.num_workers()
mode = sys.argv[1]

if mode == "handler":
    store = {}

    def handler(meta, keys, vals, lens):
        k = len(vals) // len(keys) if meta["push"] else 0
        for i, key in enumerate(keys.tolist()):
            if meta["push"]:
                store[key] = store.get(key, 0) + vals[i * k:(i + 1) * k]
        if meta["pull"]:
            return np.concatenate([store[key] for key in keys.tolist()])
        return None

    if ps.is_server():
        server = ps.KVServer(handler)
        ps.barrier(ps.WORKER_GROUP | ps.SERVER_GROUP)
        server.close()
    elif ps.is_worker():
        kv = ps.KVWorker()
        keys = np.array([3, 40000, 65000], dtype=np.int64)  # both servers
        mine = torch.arange(12, dtype=torch.float32) * (ps.rank() + 1)
        kv.wait(kv.push(torch.from_numpy(keys), mine))
        ps.barrier(ps.WORKER_GROUP)
        out = torch.full((12,), -1.0)
        ptr = out.data_ptr()
        kv.wait(kv.pull(keys, out))
        want = np.arange(12, dtype=np.float32) * (W * (W + 1) / 2)
        assert out.data_ptr() == ptr, "pull did not write in place"
        assert np.array_equal(out.numpy(), want), (out, want)
        # Wrong dtype, shape and order: clear errors before anything is sent.
        errors = []
        for call in (lambda: kv.push(keys, np.ones(12)),
                     lambda: kv.push(keys.astype(np.int32), np.ones(12, np.float32)),
                     lambda: kv.push(keys, np.ones(11, np.float32)),
                     lambda: kv.push(keys[::-1].copy(), np.ones(12, np.float32)),
                     lambda: kv.pull(keys, np.ones(12, np.float32)[::2]),
                     lambda: kv.pull(keys, torch.ones(12, dtype=torch.float64))):
            try:
                call()
                errors.append("no error")
            except (TypeError, ValueError) as e:
                errors.append(type(e).__name__ + ": " + str(e))
        for e in errors:
            print("error:", e, flush=True)
        ps.barrier(ps.WORKER_GROUP | ps.SERVER_GROUP)
        print(f"worker {ps.rank()}: handler sums exact", flush=True)

elif mode == "dense":
    total, chunk = 10007, 1000  # 11 keys, the last one short
    init = np.arange(total, dtype=np.float32)
    if ps.is_server():
        ps.dense.serve_dense(init, chunk, ps.OptimizerConfig("sgd", lr=1.0))
    elif ps.is_worker():
        dense = ps.dense.DenseWorker(total, chunk)
        weights = torch.zeros(total)
        dense.wait(dense.pull(weights, 0))
        assert np.array_equal(weights.numpy(), init)
        for step in range(3):
            grad = torch.full((total,), float(ps.rank() + 1))
            dense.step(grad, weights, step)
        # w -= mean over workers of (rank + 1), three times: exact in float.
        want = init - 3 * (W + 1) / 2
        assert np.array_equal(weights.numpy(), want), (weights[:4], want[:4])
        # A destination of the wrong size or dtype is refused before
        # anything is sent, whatever the number of servers.
        for bad, err in ((torch.zeros(total - 1), ValueError),
                         (torch.zeros(total, dtype=torch.float64), TypeError),
                         (torch.zeros(2 * total)[::2], TypeError)):
            try:
                dense.pull(bad, 3)
                raise AssertionError(f"pull into {bad.dtype} {bad.shape} "
                                     "accepted")
            except err:
                pass
        dense.done(3)
        print(f"worker {ps.rank()}: dense updates exact", flush=True)

elif mode == "onecycle":
    # SGD(lr=2) with a one-cycle lr over 5 steps, 2 of warmup, keyed by the
    # push's step; each worker's gradient is 1, so every step subtracts that
    # step's lr, computed here as model::LrSchedule does (double, then
    # float): 2 x (1/25 + (1 - 1/25) s / 2) while s < 2, then
    # 2 x max(0, 1 - (s - 2) / 3).
    total, chunk, steps = 10007, 1000, 6
    init = np.arange(total, dtype=np.float32)
    if ps.is_server():
        ps.dense.serve_dense(init, chunk, ps.OptimizerConfig("sgd", lr=2.0),
                             lr_schedule="onecycle", total_steps=5,
                             warmup_steps=2)
    elif ps.is_worker():
        dense = ps.dense.DenseWorker(total, chunk)
        weights = torch.zeros(total)
        dense.wait(dense.pull(weights, 0))
        want = init.copy()
        for step in range(steps):
            dense.step(torch.ones(total), weights, step)
            f = (1 / 25 + (1 - 1 / 25) * step / 2 if step < 2
                 else max(0.0, 1 - (step - 2) / 3))
            want -= np.float32(2.0 * f)
            assert np.array_equal(weights.numpy(), want), (step, weights[:2],
                                                           want[:2])
        dense.done(steps)
        print(f"worker {ps.rank()}: one-cycle lr exact", flush=True)

elif mode == "shared":
    # Gradients pushed from and weights pulled into ps.shared_array memory:
    # to a co-located server both go by reference (unless PS_SHM=0). argv[2]:
    # the model's floats (10007: the last key shorter than the others).
    total = int(sys.argv[2]) if len(sys.argv) > 2 else 10000
    chunk = 1000
    init = np.arange(total, dtype=np.float32)
    if ps.is_server():
        ps.dense.serve_dense(init, chunk, ps.OptimizerConfig("sgd", lr=1.0))
        print(f"server {ps.rank()}: shared frames received "
              f"{ps.num_shared_frames_received()} sent "
              f"{ps.num_shared_frames_sent()}", flush=True)
    elif ps.is_worker():
        dense = ps.dense.DenseWorker(total, chunk)
        wbuf = ps.shared_array(total)
        assert wbuf.dtype == np.float32 and wbuf.shape == (total,)
        assert not wbuf.any()
        weights = torch.from_numpy(wbuf)
        del wbuf  # the tensor keeps the shared memory alive
        grad = torch.from_numpy(ps.shared_array(total))
        ptr = weights.data_ptr()
        dense.wait(dense.pull(weights, 0))
        assert np.array_equal(weights.numpy(), init)
        for step in range(3):
            grad.fill_(float(ps.rank() + 1))
            dense.step(grad, weights, step)
        want = init - 3 * (W + 1) / 2
        assert weights.data_ptr() == ptr, "pull did not write in place"
        assert np.array_equal(weights.numpy(), want), (weights[:4], want[:4])
        dense.done(3)
        print(f"worker {ps.rank()}: shared updates exact; shared frames sent "
              f"{ps.num_shared_frames_sent()} received "
              f"{ps.num_shared_frames_received()}", flush=True)

elif mode == "compress":
    # topk with error feedback from the workers, bf16 answers from the
    # servers; integers small enough to be exact in bf16. The servers' sums
    # are what the workers gave less what they kept (their compression
    # state: u64 count, then per key u64 key, u64 n, n float32).
    store = {}

    def summing(meta, keys, vals, lens):
        at = 0
        for i, key in enumerate(keys.tolist()):
            n = int(lens[i]) if lens is not None else len(vals) // len(keys)
            if meta["push"]:
                store[key] = store.get(key, 0) + vals[at:at + n]
            at += n
        if meta["pull"]:
            return np.concatenate([store[key] for key in keys.tolist()])
        return None

    def kept(state):
        (count,) = np.frombuffer(state[:8], np.uint64)
        at, out = 8, {}
        for _ in range(int(count)):
            key, n = np.frombuffer(state[at:at + 16], np.uint64)
            at += 16
            out[int(key)] = np.frombuffer(state[at:at + 4 * int(n)], np.float32)
            at += 4 * int(n)
        return out

    if ps.is_server():
        server = ps.KVServer(summing, compress="none,pull=bf16")
        ps.barrier(ps.WORKER_GROUP | ps.SERVER_GROUP)
        server.close()
    elif ps.is_worker():
        for bad in ("topk:2", "gzip"):
            try:
                ps.KVWorker(customer_id=1, compress=bad)
                print("error: no error", flush=True)
            except ValueError as e:
                print("error:", e, flush=True)
        kv = ps.KVWorker(compress="topk:0.25")
        keys = np.array([3, 40000], dtype=np.int64)  # both servers
        rng = np.random.default_rng(ps.rank())
        given = np.zeros(16, np.float32)
        for _ in range(6):
            g = rng.integers(-8, 9, 16).astype(np.float32)
            given += g
            kv.wait(kv.push(keys, g))
        k = kept(kv.compression_state())
        sent = given - np.concatenate([k[3], k[40000]])
        ps.barrier(ps.WORKER_GROUP)
        np.save(f"{sys.argv[2]}/sent{ps.rank()}.npy", sent)
        ps.barrier(ps.WORKER_GROUP)
        out = np.zeros(16, np.float32)
        kv.wait(kv.pull(keys, out))
        want = sum(np.load(f"{sys.argv[2]}/sent{w}.npy") for w in range(W))
        assert np.array_equal(out, want), (out, want)
        print(f"worker {ps.rank()}: compressed sums exact", flush=True)
        ps.barrier(ps.WORKER_GROUP | ps.SERVER_GROUP)

ps.finalize()
