"""ps: the parameter server's worker and server API from Python.

A job is launched by the tracker (``tracker/launch.py -s S -w W -- python3
prog.py``); every process runs the same program and learns its role from
the environment, as ``ps::Start`` does::

    import ps
    ps.start()                      # rendezvous + barrier of all nodes
    if ps.role() == "worker":
        kv = ps.KVWorker()
        ts = kv.push(keys, grads)   # int64 keys, float32 values: no copy
        kv.wait(ts)                 # releases the GIL; raises ps.Error
        kv.wait(kv.pull(keys, out)) # pulled values land in `out`
    ps.finalize()

Buffers: NumPy arrays and torch CPU tensors (float32 values, int64 keys,
int32 lens), C-contiguous, or anything with the buffer protocol
(``array.array``). They are used in place, never copied: keep them
unchanged until ``wait(ts)`` returns (the worker keeps them exported until
then, so growing an ``array.array`` meanwhile raises BufferError). A pull
writes into the caller's array or tensor.

Co-located nodes: ``ps.shared_array(n)`` is a float32 NumPy array of n
zeros in shared memory (``ps::SharedArray``; ``torch.from_numpy`` gives a
tensor on the same memory, and any view keeps it alive). Pushed from, it
goes to a server on the same host as a reference, not through the socket;
pulled into, the server writes the answer straight into it (one memcpy).
Elsewhere (another host, ``PS_SHM=0``) it is an ordinary array and the bytes
travel as usual. ``ps.num_shared_frames_sent()`` / ``_received()`` count
the data frames that went by reference.

Errors: a bad environment, a failed rendezvous, a server that refused a
request or died, a call before ``start()`` or after ``finalize()`` raise
``ps.Error`` (a RuntimeError) with the message; a wrong dtype
``TypeError``; a wrong size or value (unsorted keys, a barrier group this
node is not in, a placement of no servers, ids already in use)
``ValueError``; a server or key index out of range ``IndexError``
(docs/python.md, "Errors", has the list). Unlike ``ps::Start``, nothing
here ends the process.

Dense models: ``ps.dense`` has ``DenseWorker`` (push a flat gradient, pull
the flat weights) and ``serve_dense`` (a DenseShard server with a built-in
SGD-with-momentum or Adam optimizer and bsp/bounded/async consistency), so
a pure-Python job needs no C++ of its own. ``KVServer(handler)`` runs custom
server logic in Python (slower: each request takes the GIL).

Sparse tables: ``ps.sparse`` has ``SparseWorker`` (rows by 64-bit id,
pushes applied by the servers' sgd/adagrad/ftrl), ``serve_sparse`` and,
for torch models, ``EmbeddingBag`` / ``Embedding`` whose weight lives on
the servers.

Compression: ``KVWorker(compress="topk:0.01")`` and the servers'
``compress=`` (``KVServer``, ``serve_dense``, ``DenseWorker``) put values
on the wire compressed (ps/compress.h: fp16, bf16, topk:R, randomk:R,
onebit with error feedback; ``,pull=bf16`` for the answers); left out, they
follow ``PS_COMPRESS``. Values to co-located nodes go by reference,
uncompressed.
"""

import os
from typing import Optional

from . import _ps
from ._ps import (ALL_GROUPS, DENSE_DONE, DENSE_JOIN, DENSE_STEP,
                  MAX_DENSE_STEP, SCHEDULER, SERVER_GROUP, WORKER_GROUP,
                  Checkpointer, DenseLayout, DenseServer, Error,
                  OptimizerConfig, Placement, barrier, encode_dense_cmd,
                  is_started, max_restarts, num_servers,
                  num_shared_frames_received, num_shared_frames_sent,
                  num_workers, peer_failure, rank, rejoined, replicas, role,
                  shared_array, start)

__all__ = [
    "ALL_GROUPS", "DENSE_DONE", "DENSE_JOIN", "DENSE_STEP", "MAX_DENSE_STEP",
    "SCHEDULER", "SERVER_GROUP", "WORKER_GROUP", "Checkpointer",
    "compress_codecs",
    "DenseLayout", "DenseServer", "Error", "KVServer", "KVWorker",
    "OptimizerConfig", "Placement", "as_buffer", "barrier",
    "encode_dense_cmd", "finalize", "is_started", "is_scheduler",
    "is_server", "is_worker", "max_restarts", "num_servers",
    "num_shared_frames_received", "num_shared_frames_sent", "num_workers",
    "peer_failure", "rank", "rejoined", "replicas", "role", "shared_array",
    "start",
]

__version__ = "0.1.0"

# Servers that ps.dense.serve_dense is done with, kept until finalize: a
# request that comes after its shards are done (a resend, a replica's
# forward) still finds its KVServer until every node passed finalize's
# barrier, as a C++ server's lives until after ps::Finalize.
_serving = []


def finalize(barrier: bool = True) -> None:
    """Barrier of all nodes (when `barrier`), then stops this node; then
    lets go of the servers serve_dense kept. Raises ps.Error when the
    barrier failed (a dead peer)."""
    try:
        _ps.finalize(barrier)
    finally:
        _serving.clear()


def __getattr__(name):
    # ps.dense and ps.sparse without their own import (sparse imports torch,
    # so neither is imported with ps).
    if name in ("dense", "sparse"):
        import importlib
        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'ps' has no attribute '{name}'")


def is_worker() -> bool:
    return role() == "worker"


def is_server() -> bool:
    return role() == "server"


def is_scheduler() -> bool:
    return role() == "scheduler"


def as_buffer(x, what="array"):
    """Returns `x` as an object with the buffer protocol, sharing its memory.

    NumPy arrays (and anything with the buffer protocol) pass through; a
    torch tensor must be on the CPU and contiguous, and becomes a NumPy view
    of the same memory (``Tensor.numpy()``: no copy). The dtype is checked
    where the buffer is used.
    """
    mod = type(x).__module__
    if mod.startswith("torch"):
        if x.device.type != "cpu":
            raise TypeError(f"{what}: a torch tensor on {x.device}; ps takes "
                            "CPU tensors (move it with .cpu())")
        if not x.is_contiguous():
            raise TypeError(f"{what}: a non-contiguous torch tensor; call "
                            ".contiguous() first")
        if x.requires_grad:
            x = x.detach()  # same memory
        return x.numpy()
    return x


def compress_codecs(compress: Optional[str]) -> str:
    """Compression on the wire (ps/compress.h): `compress` ("bf16",
    "topk:0.01,pull=bf16", "onebit", "none"), or PS_COMPRESS when None.
    Workers and servers of a job pass the same text."""
    if compress is None:
        compress = os.environ.get("PS_COMPRESS", "")
    return compress


class KVWorker:
    """A float32 key-value worker on this process's node (after start()).

    push/pull/pushpull return a timestamp; wait(ts) blocks (without the GIL)
    until every server the call touched answered, and raises ps.Error with
    the server's message on failure. keys: sorted, unique int64. Values per
    key are uniform (len(vals) / len(keys)) unless `lens` (int32) gives each
    key's count. Thread-safety: use one KVWorker from one thread at a time.

    Raises ValueError for a second KVWorker of the same (app_id,
    customer_id) on this node, ps.Error before start() or after finalize().
    push/pull/pushpull raise TypeError (dtype, layout) or ValueError (keys
    unsorted, duplicate, negative or empty; sizes) before anything is sent;
    the buffers stay exported until wait(ts) returns.
    """

    def __init__(self, app_id: int = 0, customer_id: int = 0,
                 compress: Optional[str] = None):
        self._kv = _ps.KVWorker(app_id, customer_id)
        codecs = compress_codecs(compress)
        if codecs:
            self._kv.compress(codecs)

    def push(self, keys, vals, lens=None, cmd: int = 0) -> int:
        """Sends vals (no copy) to the servers owning keys."""
        return self._kv.push(as_buffer(keys, "keys"), as_buffer(vals, "vals"),
                             None if lens is None else as_buffer(lens, "lens"),
                             cmd)

    def pull(self, keys, out, lens=None, cmd: int = 0) -> int:
        """Fetches the values of keys into `out` (in place) by wait(ts)."""
        return self._kv.pull(as_buffer(keys, "keys"), as_buffer(out, "out"),
                             None if lens is None else as_buffer(lens, "lens"),
                             cmd)

    def pushpull(self, keys, vals, out, cmd: int = 0) -> int:
        """push then pull in one request; out has vals' size."""
        return self._kv.pushpull(as_buffer(keys, "keys"),
                                 as_buffer(vals, "vals"),
                                 as_buffer(out, "out"), cmd)

    def wait(self, ts: int) -> None:
        """Blocks until request ts is answered; raises ps.Error on failure."""
        self._kv.wait(ts)

    def compression_state(self) -> bytes:
        """What compression's error feedback holds (b"" without), for a
        checkpoint; restore_compression_state(state) puts it back."""
        return self._kv.compression_state()

    def restore_compression_state(self, state: bytes) -> None:
        self._kv.restore_compression_state(state)

    def set_placement(self, placement: Placement) -> None:
        """Routes keys by `placement` (before any request; same on all)."""
        self._kv.set_placement(placement)

    @property
    def num_pending(self) -> int:
        """Requests not yet waited for."""
        return self._kv.num_pending


class KVServer:
    """A server whose requests run a Python handler (slower than DenseServer).

    handler(meta, keys, vals, lens) -> None | vals | (vals, lens), called on
    the node's receive thread with the GIL, one request at a time. meta is a
    dict (push, pull, cmd, sender, timestamp); keys (uint64), vals (float32)
    and lens (int32 or None) are read-only views valid during the call (copy
    what you keep). Return values for a pull; an exception becomes the
    worker's ps.Error. Keep the main thread in GIL-releasing calls (ps.barrier,
    ps.finalize, time.sleep) while serving; close() before finalize().
    A second server of one app_id on this node raises ValueError (close()
    the first), a handler that is not callable TypeError.
    """

    def __init__(self, handler, app_id: int = 0,
                 compress: Optional[str] = None):
        self._server = _ps.KVServer(handler, app_id,
                                    compress_codecs(compress))

    def close(self) -> None:
        self._server.close()
