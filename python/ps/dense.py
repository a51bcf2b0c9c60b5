"""Data-parallel training of a dense model on DenseShard servers.

The model's parameters are one flat float32 vector cut into keys of `chunk`
floats (DenseLayout) and placed on the servers by bytes (each holds about
1/S), exactly as the C++ trainer does. A worker per step pushes its flat
gradient and pulls the next weights (DenseWorker.step); each server owns
its slice in a DenseShard that averages the workers' gradients and applies
a built-in optimizer (serve_dense). Consistency: "bsp" (every step waits
for all workers), "bounded" (stale by at most max_delay steps) or "async".

Failures, as mnist_dist (docs/failures.md): with PS_REPLICAS=1 each server
also holds the previous server's keys and takes them over when it dies;
checkpoint_dir / restore_step write and load mnist_dist's checkpoint files
(Checkpoints); under PS_MAX_RESTARTS a restarted worker asks the servers
where to resume (DenseWorker.rejoin).
"""

from typing import Optional

import numpy as np

from . import _ps
from . import _serving, as_buffer, compress_codecs, KVWorker

DEFAULT_CHUNK = 8192


def dense_placement(layout: _ps.DenseLayout, num_servers: int) -> _ps.Placement:
    """Keys [0, K) of `layout` cut so each server holds about 1/S bytes."""
    keys = list(range(layout.num_keys))
    sizes = [layout.length(k) * 4 for k in keys]
    return _ps.Placement.by_bytes(keys, sizes, num_servers)


def server_keys(layout, placement, rank):
    """Server `rank`'s keys [first, end), clipped to the layout."""
    k = layout.num_keys
    return min(placement.begin(rank), k), min(placement.end(rank), k)


class DenseWorker:
    """Pushes flat gradients and pulls flat weights of a `total`-float model.

    All workers and servers must use the same total and chunk. Buffers are
    float32 arrays or CPU tensors of `total` elements, used in place.

    A pull is one request per server, each for that server's keys into the
    matching segment of the destination (as the C++ trainer's PsExchange
    does): every answer has one server and a known place, so a co-located
    server writes it straight into a ps.shared_array destination even when
    the last key is shorter than the others. pull returns one timestamp;
    wait(ts) waits for all of its requests.
    """

    def __init__(self, total: int, chunk: int = DEFAULT_CHUNK,
                 app_id: int = 0, compress: Optional[str] = None):
        self.layout = _ps.DenseLayout(total, chunk)
        self.placement = dense_placement(self.layout, _ps.num_servers())
        self.keys = np.arange(self.layout.num_keys, dtype=np.int64)
        self.lens = np.array([self.layout.length(k) for k in range(
            self.layout.num_keys)], dtype=np.int32)
        self._kv = KVWorker(app_id, compress=compress)
        self._kv.set_placement(self.placement)
        # kDone goes to one key of every server that holds keys.
        firsts = []
        for s in range(self.placement.num_servers):
            b, e = server_keys(self.layout, self.placement, s)
            if b < e:
                firsts.append(b)
        self._done_keys = np.array(firsts, dtype=np.int64)
        self._join_out = np.zeros(len(firsts), dtype=np.float32)
        self._done_vals = np.zeros(len(firsts), dtype=np.float32)
        self._done_lens = np.ones(len(firsts), dtype=np.int32)
        # Every server's keys [b, e) (views of keys and lens) and floats
        # [lo, hi) of the flat model, in key order, servers without keys left
        # out; a pull asks each of them for its own segment.
        self._pieces = []
        for s in range(self.placement.num_servers):
            b, e = server_keys(self.layout, self.placement, s)
            if b < e:
                lo = self.layout.offset(b)
                hi = self.layout.offset(e - 1) + self.layout.length(e - 1)
                self._pieces.append((self.keys[b:e], self.lens[b:e], lo, hi))
        self._more = {}  # a split pull's first timestamp -> the others

    def push(self, grad, step: int, tag: int = 0) -> int:
        """Sends the gradient of `step` (tag: e.g. the epoch, for StepLR)."""
        return self._kv.push(self.keys, grad, self.lens,
                             _ps.encode_dense_cmd(_ps.DENSE_STEP, step, tag))

    def pull(self, out, step: int, tag: int = 0) -> int:
        """Fetches the weights to compute `step` on into `out` (in place)."""
        cmd = _ps.encode_dense_cmd(_ps.DENSE_STEP, step, tag)
        flat = self._flat_out(out)
        if flat is None or len(self._pieces) < 2:
            # One server, or a destination the module rejects with the
            # reason (dtype, layout, size): one request for every key.
            return self._kv.pull(self.keys, out, self.lens, cmd)
        ts = [self._kv.pull(keys, flat[lo:hi], lens, cmd)
              for keys, lens, lo, hi in self._pieces]
        self._more[ts[0]] = ts[1:]
        return ts[0]

    def wait(self, ts: int) -> None:
        """Waits for push or pull `ts` (all servers' parts of a pull).

        Raises ps.Error on the first part that failed; the parts after it
        are not waited for and keep their destination referenced (a late
        answer may still land in it), as a failed wait does.
        """
        more = self._more.pop(ts, ())
        self._kv.wait(ts)
        for t in more:
            self._kv.wait(t)

    def _flat_out(self, out):
        """`out` as a 1-D float32 NumPy view of its memory, or None if it is
        not a C-contiguous, writable float32 buffer of `total` floats."""
        try:  # memoryview: buffers only (np.asarray would copy a list)
            a = np.asarray(memoryview(as_buffer(out, "out")))
        except (TypeError, ValueError):
            return None
        if (a.dtype != np.float32 or not a.flags.c_contiguous
                or not a.flags.writeable or a.size != self.layout.total):
            return None
        return a.reshape(-1)  # a view: a is C-contiguous

    def step(self, grad, weights, step: int, tag: int = 0) -> None:
        """Pushes the gradient of `step`, pulls the weights of step + 1."""
        push = self.push(grad, step, tag)
        pull = self.pull(weights, step + 1, tag)
        try:
            self.wait(push)
        finally:
            self.wait(pull)

    def rejoin(self) -> int:
        """A restarted worker (ps.rejoined()): the step to resume at, the
        least that any server still waits for from it (DENSE_JOIN)."""
        self._kv.wait(self._kv.pull(
            self._done_keys, self._join_out, self._done_lens,
            _ps.encode_dense_cmd(_ps.DENSE_JOIN, 0)))
        return int(self._join_out.min())

    def done(self, steps: int) -> None:
        """Tells every server this worker pushed `steps` steps and stops."""
        self._kv.wait(self._kv.push(
            self._done_keys, self._done_vals, self._done_lens,
            _ps.encode_dense_cmd(_ps.DENSE_DONE, min(steps,
                                                     _ps.MAX_DENSE_STEP))))


class Checkpoints:
    """The checkpoint sets of a dense job of `total` floats in `dir`: the
    files mnist_dist writes (src/kv/checkpointer.h), one per server (written
    by serve_dense) and one per worker (write_worker) for each checkpointed
    step. Make it before ps.start() in every role so that a bad folder fails
    everywhere at once."""

    def __init__(self, dir: str, total: int, chunk: int = DEFAULT_CHUNK):
        self.files = _ps.Checkpointer(dir, _ps.num_servers(),
                                      _ps.num_workers(), total, chunk)

    def pick(self, restore: bool) -> int:
        """The step to resume from (restore), else -1 after checking that
        the folder (made 0700 if missing) holds no checkpoint. Raises
        ps.Error naming the folder or the files that are unusable."""
        self.files.prepare_dir()
        if not restore:
            self.files.check_empty()
            return -1
        step, skipped = self.files.find_newest()
        if skipped:
            print(f"restore: skipping unusable checkpoints: {skipped}",
                  flush=True)
        print(f"restore: resuming from the checkpoint of step {step} in "
              f"{self.files.dir}", flush=True)
        return step

    def write_worker(self, rank: int, step: int, payload: bytes) -> None:
        """Worker `rank`'s file of `step` (after that many steps). A failed
        write raises ps.Error."""
        self.files.write("worker", rank, step, payload)

    def read_worker(self, rank: int, step: int) -> bytes:
        """Worker `rank`'s payload of `step`; its files of later steps (the
        killed run's) are removed."""
        payload = self.files.read(step, "worker", rank)
        self.files.remove_after(step, "worker", rank)
        return payload


def serve_dense(init, chunk: int = DEFAULT_CHUNK,
                optimizer: Optional[_ps.OptimizerConfig] = None,
                consistency: str = "bsp", max_delay: int = 0,
                lr_step: int = 1, lr_gamma: float = 1.0,
                timeout_s: Optional[float] = None,
                app_id: int = 0, checkpoint_dir: str = "",
                checkpoint_every: int = 0, restore_step: int = -1,
                on_worker_failure: Optional[str] = None,
                compress: Optional[str] = None, lr_schedule: str = "step",
                total_steps: int = 0, warmup_steps: int = 0) -> np.ndarray:
    """Serves this server's slice of a dense model until every worker is done.

    init: the whole model's initial flat weights (float32; the same on every
    server and worker), of which this server keeps its slice (and, with
    PS_REPLICAS=1, the slice of server rank - 1, whose keys it takes over
    when that server dies). optimizer: ps.OptimizerConfig("sgd", lr,
    momentum) or ("adam", lr, ...), applied to the workers' averaged
    gradient. lr_schedule "step": lr decays by lr_gamma every lr_step tags
    (StepLR); "onecycle": the lr of a push's step rises linearly from lr/25
    to lr over warmup_steps, then falls linearly to 0 at total_steps (the
    planned steps of one worker; model::LrSchedule, as mnist_dist).
    checkpoint_dir with checkpoint_every N (bsp only): this server writes its
    files every N steps; restore_step (from Checkpoints.pick) starts from
    that step's files. on_worker_failure: "stop", or "restart" (the default
    under PS_MAX_RESTARTS: a dead worker is awaited back). Returns the final
    slice. compress: the workers' codecs (ps.compress_codecs; None:
    PS_COMPRESS). Raises ValueError for options that contradict each other or the
    job's settings, naming them; ps.Error when a worker died or timeout_s
    passed.
    """
    init = np.ascontiguousarray(as_buffer(init, "init"), dtype=np.float32)
    init = init.reshape(-1)
    layout = _ps.DenseLayout(init.size, chunk)
    placement = dense_placement(layout, _ps.num_servers())

    def keys_and_slice(rank):
        first, end = server_keys(layout, placement, rank)
        lo = layout.offset(first)
        hi = lo if first == end else (layout.offset(end - 1) +
                                      layout.length(end - 1))
        return first, end, init[lo:hi]

    first, end, mine = keys_and_slice(_ps.rank())
    replica = {}
    if _ps.replicas() > 0:
        primary = (_ps.rank() + _ps.num_servers() - 1) % _ps.num_servers()
        rfirst, rend, rslice = keys_and_slice(primary)
        replica = dict(replica_first_key=rfirst, replica_end_key=rend,
                       replica_weights=rslice)
    if on_worker_failure is None:
        on_worker_failure = "restart" if _ps.max_restarts() > 0 else "stop"
    server = _ps.DenseServer(layout, first, end, mine,
                             optimizer or _ps.OptimizerConfig(),
                             consistency, max_delay, 0, lr_step, lr_gamma,
                             app_id, on_worker_failure=on_worker_failure,
                             checkpoint_dir=checkpoint_dir or "",
                             checkpoint_every=checkpoint_every,
                             restore_step=restore_step,
                             compress=compress_codecs(compress),
                             lr_schedule=lr_schedule, total_steps=total_steps,
                             warmup_steps=warmup_steps, **replica)
    waited = 0.0
    while not server.wait_all_done(1.0):
        waited += 1.0
        if server.failure is not None:
            raise _ps.Error(f"server {_ps.rank()}: {server.failure}")
        if timeout_s is not None and waited >= timeout_s:
            raise _ps.Error(f"server {_ps.rank()}: workers not done after "
                            f"{timeout_s} s ({server.updates_applied} "
                            "updates applied)")
    _serving.append(server)  # answers late requests until ps.finalize()
    return server.weights()
