#!/usr/bin/env python3
"""Trains a small click-through-rate model whose embeddings live on ps servers.

    tracker/launch.py -s 2 -w 2 -- /usr/bin/python3 examples/pytorch/ctr_embedding.py

The data is a synthetic stand-in for Criteo (ctr_data.py, nothing
downloaded): categorical fields of Zipf-distributed ids hashed over the
64-bit range, a multi-valued "tags" field, a few dense features, and labels
drawn from a planted factorization machine, whose own test AUC is the
ceiling printed beside the model's.

The model is DLRM-lite: one ps.sparse.EmbeddingBag per categorical field
(and one, mode "mean", for the tags' bags) whose rows are sparse tables on
the servers, updated by the servers' adagrad as each worker pushes its
gradient (asynchronously); a wide part, one width-1 EmbeddingBag over all
of a sample's ids (mode "sum", the linear logit), updated by FTRL; and the
dense part (a bottom MLP for the dense features, the pairwise dot products
of the embeddings, a top MLP) trained data-parallel through ps.dense: the
servers average the workers' gradients and apply Adam (BSP). No local torch
optimizer touches the embeddings: ps.sparse.push_gradients(model) sends
their gradients after loss.backward().

Every process runs this file; its role comes from the tracker. Worker 0
evaluates on the test set after the last sync point and prints one JSON
summary line (test_auc, planted_auc).
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ctr_data  # noqa: E402
# The dense MLPs live in one flat buffer, as mnist_ps.py keeps its model.
from mnist_ps import attach_grads, flatten_into  # noqa: E402

import ps  # noqa: E402
import ps.dense  # noqa: E402
import ps.sparse  # noqa: E402

SPARSE_APP, DENSE_APP = 0, 1
WIDE_TABLE = 0  # table 1 + f: field f's embeddings; 1 + F: the tags'


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", type=int, default=500000, help="samples")
    p.add_argument("--test", type=int, default=20000, help="samples")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=512, help="per worker")
    p.add_argument("--dim", type=int, default=8, help="embedding width")
    p.add_argument("--sparse-lr", type=float, default=0.3,
                   help="the servers' adagrad lr for the embeddings")
    p.add_argument("--wide-alpha", type=float, default=0.1,
                   help="the servers' FTRL alpha for the wide weights")
    p.add_argument("--dense-lr", type=float, default=0.01,
                   help="the servers' Adam lr for the MLPs")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log-every", type=int, default=50, help="steps")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per worker")
    return p.parse_args(argv)


def tables(args, fields):
    """The sparse tables: the wide weights, then one per field and the
    tags'. Rows made on first touch; the same list on every node."""
    t = [ps.sparse.TableConfig(WIDE_TABLE, 1, init="zero", optimizer="ftrl",
                               ftrl_alpha=args.wide_alpha, ftrl_beta=1.0,
                               ftrl_l1=0.01, ftrl_l2=0.1)]
    for f in range(fields + 1):
        t.append(ps.sparse.TableConfig(1 + f, args.dim, init="normal",
                                       init_scale=0.05, seed=args.seed,
                                       optimizer="adagrad", lr=args.sparse_lr,
                                       adagrad_init=0.1))
    return t


class Towers(torch.nn.Module):
    """The dense parameters: a bottom MLP for the dense features and a top
    MLP over the pairwise dots of the vectors and the bottom's output. Made
    under one seed on every node; trained through ps.dense."""

    def __init__(self, vectors, dense_in, dim):
        super().__init__()
        self.bottom = torch.nn.Sequential(torch.nn.Linear(dense_in, 16),
                                          torch.nn.ReLU(),
                                          torch.nn.Linear(16, dim))
        self.pairs = torch.triu_indices(vectors, vectors, offset=1)
        self.top = torch.nn.Sequential(
            torch.nn.Linear(self.pairs.shape[1] + dim, 32), torch.nn.ReLU(),
            torch.nn.Linear(32, 1))


class Dlrm(torch.nn.Module):
    """DLRM-lite: the embeddings and wide weights on the servers
    (ps.sparse.EmbeddingBag), the towers local."""

    def __init__(self, kv, fields, towers):
        super().__init__()
        self.wide = ps.sparse.EmbeddingBag(kv, WIDE_TABLE, mode="sum")
        self.fields = torch.nn.ModuleList(
            ps.sparse.EmbeddingBag(kv, 1 + f, mode="sum")
            for f in range(fields))
        self.tags = ps.sparse.EmbeddingBag(kv, 1 + fields, mode="mean")
        self.towers = towers

    def forward(self, cat, tags, tag_offsets, dense):
        # cat [B, F] int64 ids; tags 1-D with offsets [B]; dense [B, D].
        t = self.towers
        x = t.bottom(dense)
        vecs = [x] + [emb(cat[:, f:f + 1]) for f, emb in
                      enumerate(self.fields)]
        vecs.append(self.tags(tags, tag_offsets))
        v = torch.stack(vecs, dim=1)  # [B, F + 2, dim]
        dots = torch.bmm(v, v.transpose(1, 2))[:, t.pairs[0], t.pairs[1]]
        deep = t.top(torch.cat([dots, x], dim=1)).squeeze(1)
        return deep + self.wide(cat).squeeze(1)


def auc(scores, labels):
    """The ROC AUC by ranks (ties averaged)."""
    _, inverse, counts = np.unique(scores, return_inverse=True,
                                   return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]  # 1-based
    pos = labels == 1
    n_pos, n_neg = pos.sum(), (~pos).sum()
    if n_pos == 0 or n_neg == 0:
        return 0.5  # one class: no pair to rank
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) /
                 (n_pos * n_neg))


def batches(data, lo, hi, size):
    for b in range(lo, hi - size + 1, size):
        yield data.batch(b, b + size)


def evaluate(model, data, size=4096):
    model.eval()
    scores = []
    with torch.no_grad():
        for b in range(0, data.n, size):
            cat, tags, offs, dense, _ = data.batch(b, min(b + size, data.n))
            scores.append(model(cat, tags, offs, dense).numpy())
    model.train()
    s = np.concatenate(scores)
    y = data.labels
    logloss = float(np.mean(np.logaddexp(0, s) - y * s))
    return auc(s, y), logloss


def run_worker(args, model):
    rank, world = ps.rank(), ps.num_workers()
    torch.set_num_threads(args.threads)
    params = list(model.towers.parameters())
    flat_total = sum(p.numel() for p in params)
    weights, grads = torch.zeros(flat_total), torch.zeros(flat_total)
    flatten_into(params, weights)
    attach_grads(params, grads)
    dense = ps.dense.DenseWorker(flat_total, app_id=DENSE_APP)
    dense.wait(dense.pull(weights, 0))
    train = ctr_data.Synthetic(args.seed, args.train, split="train")
    per = train.n // world
    lo, hi = rank * per, (rank + 1) * per
    step, start, loss_sum, loss_n = 0, time.time(), 0.0, 0
    for epoch in range(args.epochs):
        for cat, tags, offs, x, y in batches(train, lo, hi, args.batch_size):
            grads.zero_()
            loss = F.binary_cross_entropy_with_logits(
                model(cat, tags, offs, x), y)
            loss.backward()
            ps.sparse.push_gradients(model)  # the servers' adagrad / FTRL
            dense.step(grads, weights, step, tag=epoch)  # the servers' Adam
            step += 1
            loss_sum, loss_n = loss_sum + loss.item(), loss_n + 1
            if rank == 0 and step % args.log_every == 0:
                rate = step * args.batch_size * world / (time.time() - start)
                print(f"worker 0: epoch {epoch} step {step} loss "
                      f"{loss_sum / loss_n:.4f} {rate:.0f} samples/s",
                      flush=True)
                loss_sum, loss_n = 0.0, 0
    train_s = time.time() - start
    dense.done(step)
    model.wide.worker.sync(1)  # every worker's pushes applied
    if rank != 0:
        return
    test = ctr_data.Synthetic(args.seed, args.test, split="test")
    test_auc, test_logloss = evaluate(model, test)
    print(json.dumps({
        "trainer": "ctr_embedding", "servers": ps.num_servers(),
        "workers": world, "steps": step,
        "samples": step * args.batch_size * world,
        "train_s": round(train_s, 2),
        "samples_per_s": round(step * args.batch_size * world / train_s, 1),
        "test_auc": round(test_auc, 4),
        "test_logloss": round(test_logloss, 4),
        "planted_auc": round(auc(test.planted_logits, test.labels), 4),
        "test_ctr": round(float(test.labels.mean()), 4),
    }), flush=True)


def main():
    args = parse_args()
    fields = len(ctr_data.FIELDS)
    torch.manual_seed(args.seed)  # the same dense weights everywhere
    towers = Towers(fields + 2, ctr_data.DENSE, args.dim)
    sparse_tables = tables(args, fields)
    ps.start()
    if ps.is_server():
        # The sparse rows are made on first touch; the towers' weights are
        # served as one flat vector.
        sparse = ps.sparse.SparseServer(sparse_tables, app_id=SPARSE_APP)
        init = torch.nn.utils.parameters_to_vector(towers.parameters())
        ps.dense.serve_dense(init.detach().numpy(),
                             optimizer=ps.OptimizerConfig(
                                 "adam", lr=args.dense_lr),
                             app_id=DENSE_APP)
        sparse.wait(1)  # the workers' last sync point
        sparse.keep()
        print(json.dumps({"server": ps.rank(), **sparse.stats()}),
              flush=True)
    elif ps.is_worker():
        kv = ps.sparse.SparseWorker(sparse_tables, app_id=SPARSE_APP)
        model = Dlrm(kv, fields, towers)
        run_worker(args, model)
    ps.finalize()


if __name__ == "__main__":
    main()
