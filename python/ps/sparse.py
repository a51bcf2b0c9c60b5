"""Sparse tables from Python and PyTorch: rows of a fixed width keyed by any
64-bit id, held by the servers (ps/sparse.h, docs/python.md "Sparse tables").

A table (``TableConfig``) has an id, a width, an initializer (a row is made
on its id's first push, its values a pure function of (seed, table, id); a
pull of an id not held yet returns those values without making the row) and the
servers' optimizer (sgd, adagrad or ftrl), applied row by row to each push
as it arrives. Servers run ``serve_sparse(tables, until_point)`` (or
``SparseServer``); workers a ``SparseWorker``, and in a torch model
``EmbeddingBag`` / ``Embedding``, stand-ins for torch.nn's whose weight
lives on the servers::

    tables = [ps.sparse.TableConfig(0, 16, init="normal", optimizer="adagrad")]
    if ps.is_server():
        ps.sparse.serve_sparse(tables, until_point=1)
    else:
        kv = ps.sparse.SparseWorker(tables)
        emb = ps.sparse.EmbeddingBag(kv, table=0, mode="mean")
        for ids, offsets, y in data:
            loss = loss_fn(emb(ids, offsets), y)
            loss.backward()
            emb.push()      # the servers' optimizer applies the rows' grads
        kv.sync(1)          # every worker's pushes applied
    ps.finalize()

The gradient: forward pulls the rows of the batch's unique ids into a leaf
tensor (``rows``, requiring grad) and runs torch.nn.functional's
embedding_bag / embedding over it with the ids remapped to row numbers, so
autograd computes d loss / d rows as usual (duplicate ids summed), and
``push()`` sends those rows to the servers, which apply their optimizer.
The rows are not parameters of the module: a local torch optimizer never
sees them (nor must it: the servers' optimizer is the one).
"""

import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from . import _ps
from . import _serving, as_buffer

TableConfig = _ps.SparseTableConfig
SparseBatch = _ps.SparseBatch


def _ids(ids):
    """`ids` as a C-contiguous int64/uint64 buffer: a torch tensor's NumPy
    view, a NumPy array or a sequence of ints (other integer types are
    converted; int64 ids are taken as their 64 bits). TypeError for
    non-integers."""
    mod = type(ids).__module__
    if mod.startswith("torch"):
        if ids.is_floating_point() or ids.is_complex():
            raise TypeError(f"ids: expected integers, got {ids.dtype}")
        if ids.dtype != torch.int64:
            ids = ids.to(torch.int64)
        return as_buffer(ids.reshape(-1).contiguous().cpu(), "ids")
    a = np.asarray(ids)
    if a.dtype in (np.int64, np.uint64):
        return np.ascontiguousarray(a).reshape(-1)
    if a.dtype.kind in "iu" or a.size == 0:
        return np.ascontiguousarray(a, dtype=np.int64).reshape(-1)
    raise TypeError(f"ids: expected integers, got {a.dtype}")


class SparseWorker:
    """Pulls rows and pushes gradients of sparse tables by 64-bit id.

    tables: the job's TableConfigs (the worker uses their ids and widths).
    ids: int64 or uint64 (NumPy, torch, or a sequence); int64 ids are taken
    as their 64 bits. Every call blocks until the servers answered (without
    the GIL) and raises ps.Error with a server's refusal or a dead server.
    Thread-safety: one thread at a time.
    """

    def __init__(self, tables: Sequence[TableConfig], app_id: int = 0,
                 customer_id: int = 0):
        self.tables = {t.id: t for t in tables}
        self._kv = _ps.SparseWorker(list(tables), app_id, customer_id)

    def width(self, table: int) -> int:
        return self._kv.width(table)

    def pull(self, table: int, ids) -> np.ndarray:
        """float32 [len(ids), width]: row i is ids[i]'s (order and
        duplicates as given)."""
        return self._kv.pull(table, _ids(ids))

    def push(self, table: int, ids, grads) -> None:
        """grads [len(ids), width] float32; duplicate ids' rows are summed,
        then each unique id's sum is applied once by the servers."""
        g = as_buffer(grads, "grads")
        return self._kv.push(table, _ids(ids), g)

    @staticmethod
    def batch(ids) -> SparseBatch:
        """The unique ids of `ids`: len(batch) rows, batch.inverse (int64
        [len(ids)]) the row of each id."""
        return SparseBatch(_ids(ids))

    def pull_rows(self, table: int, batch: SparseBatch) -> np.ndarray:
        """float32 [len(batch), width], the batch's unique ids' rows;
        rows[batch.inverse] are the rows of its ids."""
        return self._kv.pull_rows(table, batch)

    def push_rows(self, table: int, batch: SparseBatch, grads) -> None:
        """grads float32 [len(batch), width] of the batch's unique ids (in
        pull_rows' order), applied once each by the servers' optimizer."""
        self._kv.push_rows(table, batch, as_buffer(grads, "grads"))

    def push_rows_async(self, table: int, batch: SparseBatch, grads) -> int:
        """push_rows without waiting: returns a timestamp for wait(ts)
        (grads stay in use until then; -1: nothing was sent). Pushes to
        several tables in flight at once take one round trip."""
        return self._kv.push_rows_async(table, batch,
                                        as_buffer(grads, "grads"))

    def wait(self, ts: int) -> None:
        """Waits for push_rows_async's `ts`; ps.Error if it failed."""
        self._kv.wait(ts)

    def sync(self, point: int) -> None:
        """Returns once every live worker called sync(point) and every
        server answered: every push made before by any worker is applied.
        Points increase during a job (0 .. MAX_SPARSE_POINT)."""
        self._kv.sync(point)


class SparseServer:
    """Serves this server's rows of `tables` (and, with PS_REPLICAS=1, the
    rows of server rank - 1, which it serves when that server dies) from
    now on: a C++ SparseShard on the node's receive thread, no GIL.

    num_workers: the workers that take part in sync points (0: the job's).
    Another server (a DenseServer) may run beside it on another app_id.
    """

    def __init__(self, tables: Sequence[TableConfig], num_workers: int = 0,
                 app_id: int = 0, allow_non_finite: bool = False):
        self.tables = list(tables)
        self._server = _ps.SparseServer(self.tables, num_workers, app_id,
                                        allow_non_finite)

    def wait(self, point: int, timeout_s: Optional[float] = None,
             failure_grace_s: float = 30.0) -> None:
        """Blocks until sync point `point` completed here (every live
        worker reached it). Raises ps.Error, naming the workers still
        missing, when timeout_s passed first, or when a peer has failed and
        for failure_grace_s no worker reached a sync point and no push was
        applied here (a dead worker is
        left out of sync points and the others go on; a dead server
        without a replica stops the workers short of it)."""
        start = time.monotonic()
        last, last_change = None, start
        while not self._server.wait_sync(point, 1.0):
            now = time.monotonic()
            waiting = self._server.waiting_for()
            progress = (waiting, self._server.pushes_applied)
            if progress != last:
                last, last_change = progress, now
            if timeout_s is not None and now - start >= timeout_s:
                raise _ps.Error(f"server {_ps.rank()}: sync point {point} not "
                                f"reached after {timeout_s} s: {waiting}")
            failure = _ps.peer_failure()
            if failure is not None and now - last_change >= failure_grace_s:
                raise _ps.Error(f"server {_ps.rank()}: sync point {point} "
                                f"not reached; no progress for "
                                f"{failure_grace_s} s after a peer failed "
                                f"({failure}): {waiting}")

    def stats(self) -> Dict[str, object]:
        """rows (per table, this server's own), replica_rows (per table,
        those of server rank - 1 held here under PS_REPLICAS=1; else None),
        memory_bytes (all tables, replica included), pushes_applied,
        bad_requests."""
        s = self._server
        replica = None
        if _ps.replicas() > 0:
            replica = {t.id: s.replica_rows(t.id) for t in self.tables}
        return {"rows": {t.id: s.rows(t.id) for t in self.tables},
                "replica_rows": replica,
                "memory_bytes": s.memory_bytes,
                "pushes_applied": s.pushes_applied,
                "bad_requests": s.bad_requests}

    def row(self, table: int, id: int) -> Optional[np.ndarray]:
        """This server's row of `id` (float32 [width]), None if not held."""
        return self._server.row(table, id)

    def save(self) -> bytes:
        """The shard's whole state (rows and optimizer state); call only
        while no request is in flight."""
        return self._server.save()

    def load(self, state: bytes) -> None:
        """Replaces the state with save()'s, before requests come."""
        self._server.load(state)

    def keep(self) -> None:
        """Keeps serving late requests (resends) until ps.finalize()."""
        _serving.append(self._server)


def serve_sparse(tables: Sequence[TableConfig], until_point: int,
                 timeout_s: Optional[float] = None, num_workers: int = 0,
                 app_id: int = 0,
                 allow_non_finite: bool = False) -> Dict[str, object]:
    """Serves `tables` until every worker reached sync point `until_point`
    (their last: SparseWorker.sync(until_point)), then returns
    SparseServer.stats(); the server keeps answering until ps.finalize().
    Raises ValueError for a bad table set, ps.Error after timeout_s."""
    server = SparseServer(tables, num_workers, app_id, allow_non_finite)
    server.wait(until_point, timeout_s)
    server.keep()
    return server.stats()


# ---- torch ----------------------------------------------------------------

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the KV API above needs no torch
    torch = None


if torch is not None:

    class _ServerRows(torch.nn.Module):
        """Pulls the unique ids of each training forward into a leaf tensor
        and pushes its gradient on push()."""

        def __init__(self, worker: SparseWorker, table: int,
                     padding_idx: Optional[int] = None,
                     scale_grad_by_freq: bool = False):
            super().__init__()
            self.worker = worker
            self.table = table
            self.embedding_dim = worker.width(table)
            self.padding_idx = padding_idx
            self.scale_grad_by_freq = scale_grad_by_freq
            self._pending: List = []  # (batch, rows) awaiting push()

        def _padding_row(self, input, idx):
            """(row number of padding_idx in this forward or None, mask of
            input == padding_idx or None)."""
            if self.padding_idx is None:
                return None, None
            mask = input == self.padding_idx
            if not bool(mask.any()):
                return None, None
            return int(idx[mask].reshape(-1)[0]), mask

        def _pull(self, input):
            """(rows leaf [u, width], input remapped to row numbers)."""
            if input.dtype not in (torch.int64, torch.int32):
                raise TypeError(f"{type(self).__name__}: input must be an "
                                f"integer tensor, got {input.dtype}")
            batch = SparseBatch(_ids(input))
            rows = torch.from_numpy(self.worker.pull_rows(self.table, batch))
            rows = rows.to(input.device)
            idx = torch.from_numpy(batch.inverse).to(input.device)
            idx = idx.view(input.shape)
            if torch.is_grad_enabled():
                rows.requires_grad_(True)
                if self.scale_grad_by_freq:
                    # Each row's gradient over its id's count in the batch
                    # (torch 1.13's embedding_bag scales by the wrong counts
                    # on the CPU, so it is done here for both modules).
                    count = torch.bincount(idx.reshape(-1),
                                           minlength=rows.shape[0])
                    count = count.clamp(min=1).to(rows.dtype).unsqueeze(1)
                    rows.register_hook(lambda g: g / count)
                self._pending.append((batch, rows))
            return rows, idx

        def push(self) -> int:
            """Sends the gradient of every forward since the last push (after
            loss.backward()) to the servers, whose optimizer applies it, and
            waits; returns the rows pushed. Forwards whose rows got no
            gradient are dropped."""
            n, sent = self._push_async()
            _wait_all(sent)
            return n

        def _push_async(self):
            """(rows, [(worker, ts)]): the pushes sent, not waited for."""
            n, sent = 0, []
            pending, self._pending = self._pending, []
            for batch, rows in pending:
                if rows.grad is None:
                    continue
                g = rows.grad.detach().to("cpu", torch.float32).contiguous()
                sent.append((self.worker, self.worker.push_rows_async(
                    self.table, batch, g)))
                n += len(batch)
            return n, sent

        def zero_grad(self, set_to_none: bool = True) -> None:
            """Drops the forwards not pushed (their gradients are lost)."""
            self._pending.clear()
            super().zero_grad(set_to_none)

        def extra_repr(self) -> str:
            s = f"table={self.table}, embedding_dim={self.embedding_dim}"
            if self.padding_idx is not None:
                s += f", padding_idx={self.padding_idx}"
            if self.scale_grad_by_freq:
                s += ", scale_grad_by_freq=True"
            return s

    class EmbeddingBag(_ServerRows):
        """torch.nn.EmbeddingBag whose weight is sparse table `table` on the
        servers: any 64-bit id is a row (num_embeddings is unbounded), and
        embedding_dim is the table's width.

        forward(input, offsets=None, per_sample_weights=None) as
        torch.nn.EmbeddingBag's: input 2-D [B, L] (bags of L ids) or 1-D
        with offsets (bag b is input[offsets[b]:offsets[b + 1]]); mode
        "sum", "mean" or "max"; per_sample_weights with "sum" only;
        padding_idx (an id: its entries are left out of their bags, "mean"
        counting only the others, and get no gradient) as torch's;
        scale_grad_by_freq divides each row's gradient by its id's count in
        the forward's input. max_norm is not offered: it would rescale the
        pulled copy, not the servers' rows.
        Call push() after loss.backward() (ps.sparse.push_gradients(model)
        pushes every such module of a model): the servers' optimizer
        (TableConfig) updates the rows, not a local torch optimizer.
        """

        def __init__(self, worker: SparseWorker, table: int,
                     mode: str = "mean", include_last_offset: bool = False,
                     padding_idx: Optional[int] = None,
                     scale_grad_by_freq: bool = False):
            super().__init__(worker, table, padding_idx, scale_grad_by_freq)
            if mode not in ("sum", "mean", "max"):
                raise ValueError(f"EmbeddingBag: mode '{mode}' is not sum, "
                                 "mean or max")
            if mode == "max" and scale_grad_by_freq:
                raise ValueError("EmbeddingBag: scale_grad_by_freq does not "
                                 "apply to mode 'max' (as torch's)")
            self.mode = mode
            self.include_last_offset = include_last_offset

        def forward(self, input, offsets=None, per_sample_weights=None):
            if input.dim() == 2 and offsets is not None:
                raise ValueError("EmbeddingBag: offsets given with 2-D input "
                                 "(each row is a bag)")
            if input.dim() == 1 and offsets is None:
                raise ValueError("EmbeddingBag: 1-D input needs offsets")
            if input.dim() not in (1, 2):
                raise ValueError("EmbeddingBag: input must be 1-D or 2-D, "
                                 f"got {input.dim()}-D")
            rows, idx = self._pull(input)
            pad, _ = self._padding_row(input, idx)
            return F.embedding_bag(
                idx, rows, offsets, mode=self.mode,
                per_sample_weights=per_sample_weights,
                include_last_offset=self.include_last_offset, padding_idx=pad)

        def extra_repr(self) -> str:
            return super().extra_repr() + f", mode='{self.mode}'"

    class Embedding(_ServerRows):
        """torch.nn.Embedding whose weight is sparse table `table` on the
        servers: forward(input) of any shape gives input.shape + [width];
        push() after loss.backward(), as EmbeddingBag. padding_idx (an id)
        gives zeros and no gradient, as torch's zero padding row does;
        scale_grad_by_freq as EmbeddingBag's."""

        def forward(self, input):
            rows, idx = self._pull(input)
            out = F.embedding(idx, rows)
            _, mask = self._padding_row(input, idx)
            if mask is not None:
                out = out.masked_fill(mask.unsqueeze(-1), 0.0)
            return out

    def _wait_all(sent):
        """Waits for every (worker, ts); raises the first failure after
        waiting for the rest."""
        first = None
        for worker, ts in sent:
            try:
                worker.wait(ts)
            except Exception as e:  # noqa: BLE001 -- re-raised below
                first = first or e
        if first is not None:
            raise first

    def push_gradients(model: "torch.nn.Module") -> int:
        """push() of every EmbeddingBag / Embedding in `model`, all in
        flight at once; returns the rows pushed once all are applied."""
        n, sent = 0, []
        for m in model.modules():
            if isinstance(m, _ServerRows):
                k, s = m._push_async()
                n, sent = n + k, sent + s
        _wait_all(sent)
        return n


__all__ = ["TableConfig", "SparseBatch", "SparseWorker", "SparseServer",
           "serve_sparse"] + (["EmbeddingBag", "Embedding", "push_gradients"]
                              if torch is not None else [])
