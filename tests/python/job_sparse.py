"""A sparse-table job for test_sparse.py (launch.py -s 2 -w 2): each worker
checks ps.sparse.EmbeddingBag / Embedding against torch.nn's on the pulled
rows (forward and gradient, also with padding_idx and scale_grad_by_freq),
pushes with the servers' sgd (lr 0.5) and
checks the rows after a sync point bit for bit; servers print their stats.
Prints one JSON line per node."""

import json
import sys

import numpy as np
import torch

import ps
import ps.sparse

LR = 0.5
TABLES = [
    # Pushed by the checks below (each worker its own ids).
    ps.sparse.TableConfig(0, 4, init="normal", init_scale=1.0, seed=3,
                          optimizer="sgd", lr=LR),
    ps.sparse.TableConfig(1, 3, init="uniform", init_scale=0.5, seed=4,
                          optimizer="sgd", lr=LR),
]


EMBEDDING_IDS = [3, 9, 10003, 10009]  # Embedding's, of workers 0 and 1


def check_bag(kv, emb, ids2d, mode, weights):
    """Forward of both forms and the gradient, then a push whose result is
    checked after the sync point. Returns the failures."""
    bad = []
    flat = ids2d.reshape(-1)
    offsets = torch.arange(0, flat.numel(), ids2d.shape[1])
    vocab, local = np.unique(flat.numpy(), return_inverse=True)
    before = kv.pull(emb.table, vocab)  # rows in vocab order
    ref = torch.nn.EmbeddingBag(len(vocab), before.shape[1], mode=mode)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(before))
    local = torch.from_numpy(local.astype(np.int64))
    psw = weights if mode == "sum" else None
    # 1-D + offsets, then 2-D: the same bags.
    with torch.no_grad():
        got2 = emb(ids2d, per_sample_weights=None if psw is None
                   else psw.view(ids2d.shape))
        want2 = ref(local.view(ids2d.shape), per_sample_weights=None
                    if psw is None else psw.view(ids2d.shape))
    if not torch.equal(got2, want2):
        bad.append(f"{mode} 2-D forward differs")
    out = emb(flat, offsets, per_sample_weights=psw)
    want = ref(local, offsets, per_sample_weights=psw)
    if not torch.equal(out, want):
        bad.append(f"{mode} 1-D forward differs")
    # Exact coefficients: every gradient value is exact in float.
    coef = torch.arange(1, out.numel() + 1, dtype=torch.float32).view(
        out.shape) / 4
    (out * coef).sum().backward()
    (want * coef).sum().backward()
    g_ref = ref.weight.grad.numpy()  # vocab order, duplicates summed
    pushed = emb.push()
    if pushed != len(vocab):
        bad.append(f"{mode}: pushed {pushed} rows for {len(vocab)} ids")
    return bad, vocab, before, g_ref


def check_padding(kv, rank):
    """padding_idx and scale_grad_by_freq against torch.nn's, forward and
    gradient, on table 1's rows (nothing pushed). Returns the failures."""
    bad = []
    pad = 50 + rank * 1000
    ids = torch.tensor([[pad, 51, 52, 51], [52, pad, pad, 53],
                        [pad, pad, pad, pad]], dtype=torch.int64) + rank * 1000
    pad += rank * 1000
    flat = ids.reshape(-1)
    vocab, local = np.unique(flat.numpy(), return_inverse=True)
    local = torch.from_numpy(local.astype(np.int64))
    local_pad = int(np.searchsorted(vocab, pad))
    before = torch.from_numpy(kv.pull(1, vocab))
    offsets = torch.arange(0, flat.numel(), ids.shape[1])
    # The pushed rows are the batch's unique ids, in the order SparseBatch
    # gives them: row_of maps the reference's (sorted) rows to them.
    inverse = torch.from_numpy(ps.sparse.SparseBatch(
        flat.numpy()).inverse.astype(np.int64))
    row_of = torch.zeros(len(vocab), dtype=torch.int64)
    row_of[local] = inverse
    # scale_grad_by_freq: each id's gradient over its count in the input
    # (not torch's embedding_bag, whose CPU version scales by other counts).
    count = torch.bincount(local).to(torch.float32).unsqueeze(1)
    for mode in ("sum", "mean"):
        for freq in (False, True):
            emb = ps.sparse.EmbeddingBag(kv, 1, mode=mode, padding_idx=pad,
                                         scale_grad_by_freq=freq)
            ref = torch.nn.EmbeddingBag(len(vocab), 3, mode=mode,
                                        padding_idx=local_pad)
            with torch.no_grad():
                ref.weight.copy_(before)
            out, want = emb(flat, offsets), ref(local, offsets)
            if not torch.equal(out, want):
                bad.append(f"padding {mode} freq={freq}: forward differs")
            out.sum().backward()
            want.sum().backward()
            got = emb._pending[-1][1].grad[row_of]
            if not torch.equal(got, ref.weight.grad / count if freq
                               else ref.weight.grad):
                bad.append(f"padding {mode} freq={freq}: gradient differs")
            if got[local_pad].abs().sum() != 0:
                bad.append(f"padding {mode}: the padding row has a gradient")
            emb.zero_grad()  # nothing pushed
    emb = ps.sparse.Embedding(kv, 1, padding_idx=pad)
    out = emb(ids)
    want = before[local].view(ids.shape + (3,)).clone()
    want[ids == pad] = 0.0
    if not torch.equal(out, want):
        bad.append("Embedding with padding_idx: forward differs")
    out.sum().backward()
    if emb._pending[-1][1].grad[row_of][local_pad].abs().sum() != 0:
        bad.append("Embedding: the padding row has a gradient")
    emb.zero_grad()
    return bad


def refusals(kv):
    """Bad arguments raise, naming them, before anything is sent."""
    bad = []
    cases = [
        (IndexError, "no sparse table 9", lambda: kv.pull(9, [1])),
        (ValueError, "grads has 3 floats", lambda: kv.push(
            0, [1], np.zeros(3, np.float32))),
        (TypeError, "ids: expected integers", lambda: kv.pull(0, np.zeros(2))),
        (TypeError, "grads", lambda: kv.push(0, [1], np.zeros(4))),
        (ValueError, "sync: point -1", lambda: kv.sync(-1)),
        (ValueError, "unknown or already waited", lambda: kv.wait(12345)),
        (TypeError, "must be a SparseBatch", lambda: kv.push_rows_async(
            0, [1], np.zeros(4, np.float32))),
        (ValueError, "width 0", lambda: ps.sparse.TableConfig(2, 0)),
        (ValueError, "'adam'", lambda: ps.sparse.TableConfig(
            2, 1, optimizer="adam")),
        (ValueError, "two tables of id 0", lambda: ps.sparse.SparseWorker(
            [TABLES[0], TABLES[0]], customer_id=1)),
        (ValueError, "mode", lambda: ps.sparse.EmbeddingBag(kv, 0, "prod")),
        (ValueError, "scale_grad_by_freq", lambda: ps.sparse.EmbeddingBag(
            kv, 0, "max", scale_grad_by_freq=True)),
        (ValueError, "1-D input needs offsets",
         lambda: ps.sparse.EmbeddingBag(kv, 0)(torch.tensor([1, 2]))),
    ]
    for kind, text, call in cases:
        try:
            call()
            bad.append(f"no {kind.__name__} for {text}")
        except kind as e:
            if text not in str(e):
                bad.append(f"{kind.__name__} without '{text}': {e}")
    if kv.pull(0, np.zeros(0, np.uint64)).shape != (0, 4):
        bad.append("an empty pull is not [0, 4]")
    return bad


def run_worker():
    rank = ps.rank()
    kv = ps.sparse.SparseWorker(TABLES)
    bad, expect = refusals(kv) + check_padding(kv, rank), []
    rng = np.random.default_rng(rank)
    modes = [("sum", 0), ("mean", 1), ("max", 1)]
    for mode, table in modes:
        emb = ps.sparse.EmbeddingBag(kv, table, mode=mode)
        # Bags of 4 ids from a few values (duplicates within and across
        # bags), this worker's ids only, spread over the 64-bit range.
        base = np.array([rank * 1000 + 7, (1 << 63) + rank, 5 + rank * 1000,
                         (1 << 40) + rank * 1000 + 9, 77 + rank * 1000],
                        dtype=np.uint64)
        ids = base[rng.integers(0, len(base), size=(6, 4))]
        # Each mode its own ids: pushes of one are checked in isolation.
        ids = ids + np.uint64({"sum": 0, "mean": 100, "max": 200}[mode])
        ids2d = torch.from_numpy(ids.view(np.int64))
        weights = torch.tensor([0.5, 1.0, 2.0, 0.25] * 6)
        b, vocab, before, g = check_bag(kv, emb, ids2d, mode, weights)
        bad += b
        expect.append((table, vocab, before, g, mode))
    # Embedding (plain lookup): forward and gradient only.
    emb = ps.sparse.Embedding(kv, 0)
    ids = torch.tensor([[3, 3], [9, 3]], dtype=torch.int64) + 10000 * rank
    vocab, local = np.unique(ids.numpy(), return_inverse=True)
    rows = kv.pull(0, vocab)
    out = emb(ids)
    if not torch.equal(out, torch.from_numpy(rows)[
            torch.from_numpy(local.astype(np.int64)).view(ids.shape)]):
        bad.append("Embedding forward differs")
    out.sum().backward()
    g = np.zeros_like(rows)
    np.add.at(g, local.reshape(-1), 1.0)
    expect.append((0, vocab, rows, g, "embedding"))
    if emb.push() != len(vocab):
        bad.append("Embedding pushed another row count")
    kv.sync(1)
    for table, vocab, before, g, mode in expect:
        after = kv.pull(table, vocab)
        want = (torch.from_numpy(before) - LR * torch.from_numpy(g)).numpy()
        if not np.array_equal(after, want):
            bad.append(f"{mode}: rows after the push are not w - lr * g: "
                       f"max diff {np.abs(after - want).max()}")
    print(json.dumps({"worker": rank, "bad": bad,
                      "checks": len(expect)}), flush=True)


def main():
    ps.start()
    if ps.is_server():
        server = ps.sparse.SparseServer(TABLES)
        server.wait(1, timeout_s=120)
        stats = server.stats()
        # Embedding's ids in table 0, those this server holds.
        held = [i for i in EMBEDDING_IDS if server.row(0, i) is not None]
        state = len(server.save())
        server.keep()
        print(json.dumps({"server": ps.rank(), "rows": stats["rows"],
                          "held": held, "state_bytes": state,
                          "replica_rows": stats["replica_rows"],
                          "pushes": stats["pushes_applied"],
                          "bad_requests": stats["bad_requests"]}),
              flush=True)
    elif ps.is_worker():
        run_worker()
    ps.finalize()


if __name__ == "__main__":
    sys.exit(main())
