"""Type stub of the ps._ps extension (python/src/*.cc).

Errors (docs/python.md, "Errors"): a bad argument raises ValueError, a
server or key index out of range IndexError, a wrong buffer TypeError, a
call before start() or after finalize() Error; none ends the process.
"""

from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

# A float32 / int64 / int32 C-contiguous buffer: a NumPy array, or a torch
# CPU tensor through ps.as_buffer.
Buffer = Any

SCHEDULER: int
SERVER_GROUP: int
WORKER_GROUP: int
ALL_GROUPS: int
DENSE_STEP: int
DENSE_DONE: int
DENSE_JOIN: int
MAX_DENSE_STEP: int


class Error(RuntimeError):
    """A failed ps Status: the message names the node and the reason."""


def start(barrier: bool = True) -> None:
    """Starts this process's node from the tracker's environment (DMLC_*,
    PS_*): rendezvous, then (barrier) a barrier of all nodes. Raises Error
    on failure, when called twice, after finalize() or after a failed
    start() (a node starts once)."""
def finalize(barrier: bool = True) -> None:
    """Barrier of all nodes (barrier), then stops the node. Idempotent."""
def barrier(group: int = ...) -> None:
    """Blocks (without the GIL) until every node of `group` arrived.
    ValueError: `group` is not a non-empty bit-or of SCHEDULER,
    SERVER_GROUP and WORKER_GROUP, or this node is not in it. Error: before
    start() or after finalize()."""
def role() -> str:
    """"scheduler", "server" or "worker" (known before start)."""
def rank() -> int:
    """This node's rank among its role (before start: PS_RANK or -1)."""
def num_workers() -> int: ...
def num_servers() -> int: ...
def is_started() -> bool: ...
def replicas() -> int: ...
def max_restarts() -> int: ...
def rejoined() -> bool: ...
def peer_failure() -> Optional[str]:
    """None, or the first peer failure this node learned of (also after
    finalize(); Error before start())."""
def num_shared_frames_sent() -> int:
    """Data frames this node sent as shared-memory references."""
def num_shared_frames_received() -> int:
    """Data frames this node received as shared-memory references."""
def shared_array(n: int) -> np.ndarray:
    """n float32 zeros in memory co-located nodes map (ps::SharedArray).
    ValueError: n beyond what an array can address."""
def encode_dense_cmd(op: int, step: int, tag: int = 0) -> int:
    """The cmd of a DenseShard request (ps/dense_server.h). ValueError: op
    not 0|1, step outside [0, MAX_DENSE_STEP], tag outside [0, 255]."""


class KVWorker:
    """Buffers stay exported from a call until its wait(ts) returns (for
    good if that wait failed): resizing them meanwhile raises BufferError.
    push/pull/pushpull raise TypeError for a buffer of another dtype, not
    C-contiguous, or a read-only `out`; ValueError for keys not sorted,
    unique and non-negative or empty, sizes that do not fit the keys (or
    `lens`), negative `lens`, an empty `out`; Error after finalize()."""
    def __init__(self, app_id: int = 0, customer_id: int = 0) -> None:
        """ValueError: a KVWorker of these ids exists on this node. Error:
        before start() or after finalize()."""
    def push(self, keys: Buffer, vals: Buffer, lens: Optional[Buffer] = None,
             cmd: int = 0) -> int: ...
    def pull(self, keys: Buffer, out: Buffer, lens: Optional[Buffer] = None,
             cmd: int = 0) -> int: ...
    def pushpull(self, keys: Buffer, vals: Buffer, out: Buffer,
                 cmd: int = 0) -> int: ...
    def wait(self, ts: int) -> None:
        """Error: the request failed, or finalize() was called. ValueError:
        ts was not issued or was waited for already."""
    def set_placement(self, placement: "Placement") -> None:
        """ValueError: the placement has more servers than the job."""
    @property
    def num_pending(self) -> int: ...


class Placement:
    @staticmethod
    def even_keys(num_servers: int, max_key: int) -> "Placement":
        """ValueError: num_servers outside [1, 2**20], or max_key <
        num_servers."""
    @staticmethod
    def by_bytes(keys: Sequence[int], sizes: Sequence[int],
                 num_servers: int) -> "Placement":
        """ValueError: num_servers outside [1, 2**20], keys not sorted and
        unique, or len(sizes) != len(keys)."""
    @property
    def num_servers(self) -> int: ...
    def begin(self, server: int) -> int:
        """IndexError: server outside [0, num_servers)."""
    def end(self, server: int) -> int:
        """IndexError: server outside [0, num_servers)."""
    def server_of(self, key: int) -> int: ...
    def describe(self) -> str: ...


class DenseLayout:
    def __init__(self, total: int, chunk: int) -> None:
        """ValueError: chunk 0, or total beyond what an array can hold."""
    @property
    def total(self) -> int: ...
    @property
    def chunk(self) -> int: ...
    @property
    def num_keys(self) -> int: ...
    def offset(self, key: int) -> int:
        """IndexError: key > num_keys (num_keys: the end of the last)."""
    def length(self, key: int) -> int:
        """IndexError: key >= num_keys."""


class OptimizerConfig:
    """torch.optim.SGD / Adam settings; raises Error on a bad value."""
    def __init__(self, name: str = "sgd", lr: float = 0.01,
                 momentum: float = 0.0, nesterov: bool = False,
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def lr(self) -> float: ...
    @property
    def momentum(self) -> float: ...


class DenseServer:
    """A DenseShard holding keys [first_key, end_key) of `layout`."""
    def __init__(self, layout: DenseLayout, first_key: int, end_key: int,
                 weights: Buffer, optimizer: OptimizerConfig,
                 consistency: str = "bsp", max_delay: int = 0,
                 num_workers: int = 0, lr_step: int = 1,
                 lr_gamma: float = 1.0, app_id: int = 0, *,
                 replica_first_key: int = 0, replica_end_key: int = 0,
                 replica_weights: Optional[Buffer] = None,
                 on_worker_failure: str = "stop", checkpoint_dir: str = "",
                 checkpoint_every: int = 0, restore_step: int = -1,
                 compress: str = "", lr_schedule: str = "step",
                 total_steps: int = 0, warmup_steps: int = 0) -> None:
        """lr_schedule "step": StepLR over the push's tag (lr_step,
        lr_gamma); "onecycle": the lr of the push's step, linear from lr/25
        to lr over warmup_steps, then down to 0 at total_steps
        (model::LrSchedule). ValueError: another lr_schedule, total_steps or
        warmup_steps with "step", lr_step or lr_gamma with "onecycle",
        total_steps < 1, warmup_steps outside [0, total_steps) (all before
        start() too); keys outside the layout, weights of another size,
        negative max_delay or num_workers, lr_step < 1, a server of app_id
        on this node already; under PS_REPLICAS=1 no replica_weights (the
        slice of server rank - 1), or replica_weights without it;
        on_worker_failure "continue", "restart" without PS_MAX_RESTARTS or
        "stop" with it; checkpoint_every or restore_step without
        checkpoint_dir, checkpoint_dir without consistency "bsp". Error: a
        bad consistency or optimizer; a checkpoint that cannot be restored;
        before start() or after finalize()."""
    def wait_all_done(self, timeout_s: float) -> bool:
        """ValueError: timeout_s negative or NaN."""
    @property
    def failure(self) -> Optional[str]: ...
    def weights(self) -> np.ndarray: ...
    @property
    def updates_applied(self) -> int: ...
    @property
    def max_staleness(self) -> int: ...
    @property
    def bad_requests(self) -> int: ...
    @property
    def replica_updates_applied(self) -> Optional[int]: ...
    @property
    def workers_rejoined(self) -> int: ...


class Checkpointer:
    """mnist_dist's checkpoint sets in `dir` (src/kv/checkpointer.h); roles
    "server" and "worker". Error: a failed call, naming the file."""
    def __init__(self, dir: str, num_servers: int, num_workers: int,
                 model_floats: int, chunk: int) -> None: ...
    @property
    def dir(self) -> str: ...
    def path(self, step: int, role: str, rank: int) -> str: ...
    def prepare_dir(self) -> None: ...
    def check_empty(self) -> None: ...
    def find_newest(self) -> Tuple[int, str]: ...
    def write(self, role: str, rank: int, step: int, payload: bytes) -> None:
        ...
    def read(self, step: int, role: str, rank: int) -> bytes: ...
    def remove_after(self, step: int, role: str, rank: int) -> None: ...


Handler = Callable[[dict, np.ndarray, np.ndarray, Optional[np.ndarray]],
                   Union[None, np.ndarray, Tuple[np.ndarray, np.ndarray]]]


class KVServer:
    def __init__(self, handler: Handler, app_id: int = 0) -> None:
        """TypeError: handler not callable. ValueError: a server of app_id
        on this node already (close() it first). Error: before start() or
        after finalize()."""
    def close(self) -> None: ...


MAX_SPARSE_TABLES: int
MAX_SPARSE_WIDTH: int
MAX_SPARSE_POINT: int


class SparseTableConfig:
    """A sparse table (ps/sparse.h): id in [0, MAX_SPARSE_TABLES), width
    floats per row in [1, MAX_SPARSE_WIDTH], a row's initializer ("zero",
    "uniform" in [-init_scale, init_scale), "normal" of stddev init_scale;
    a pure function of (seed, id, row id)) and the servers' optimizer
    ("sgd", "adagrad", "ftrl") with its settings. ValueError naming the
    field and value of a bad one."""
    def __init__(self, id: int, width: int, init: str = "zero",
                 init_scale: float = 0.01, seed: int = 0,
                 optimizer: str = "adagrad", lr: float = 0.05,
                 adagrad_init: float = 0.1, adagrad_eps: float = 1e-8,
                 ftrl_alpha: float = 0.05, ftrl_beta: float = 1.0,
                 ftrl_l1: float = 0.0, ftrl_l2: float = 0.0) -> None: ...
    @property
    def id(self) -> int: ...
    @property
    def width(self) -> int: ...
    @property
    def init(self) -> str: ...
    @property
    def init_scale(self) -> float: ...
    @property
    def seed(self) -> int: ...
    @property
    def optimizer(self) -> str: ...
    @property
    def lr(self) -> float: ...
    @property
    def adagrad_init(self) -> float: ...
    @property
    def adagrad_eps(self) -> float: ...
    @property
    def ftrl_alpha(self) -> float: ...
    @property
    def ftrl_beta(self) -> float: ...
    @property
    def ftrl_l1(self) -> float: ...
    @property
    def ftrl_l2(self) -> float: ...


class SparseBatch:
    """The unique ids of `ids` (int64 or uint64, duplicates and any order):
    len() unique rows; inverse (int64 [num_ids]) the row of each id.
    TypeError: ids of another dtype or not C-contiguous."""
    def __init__(self, ids: Buffer) -> None: ...
    def __len__(self) -> int: ...
    @property
    def num_ids(self) -> int: ...
    @property
    def inverse(self) -> np.ndarray: ...


class SparseWorker:
    """Rows of sparse tables by 64-bit id; every call blocks (without the
    GIL) until the servers answered. ValueError: a bad table set, a second
    worker of (app_id, customer_id), sizes that do not fit; IndexError: a
    table not given; TypeError: a buffer of another dtype; Error: a server
    refused (its message) or died, before start() or after finalize()."""
    def __init__(self, tables: List[SparseTableConfig], app_id: int = 0,
                 customer_id: int = 0) -> None: ...
    def width(self, table: int) -> int: ...
    def pull(self, table: int, ids: Buffer) -> np.ndarray:
        """float32 [len(ids), width], in the ids' order."""
    def push(self, table: int, ids: Buffer, grads: Buffer) -> None:
        """grads float32 [len(ids), width]; duplicates summed."""
    def pull_rows(self, table: int, batch: SparseBatch) -> np.ndarray:
        """float32 [len(batch), width], the batch's unique rows."""
    def push_rows(self, table: int, batch: SparseBatch,
                  grads: Buffer) -> None:
        """grads float32 [len(batch), width] of the unique rows."""
    def push_rows_async(self, table: int, batch: SparseBatch,
                        grads: Buffer) -> int:
        """push_rows without waiting: a timestamp for wait (-1: nothing
        sent). grads stay exported until wait(ts) returns."""
    def wait(self, ts: int) -> None:
        """Error: the push failed, or finalize() was called. ValueError: ts
        was not issued or was waited for already."""
    @property
    def num_pending(self) -> int: ...
    def sync(self, point: int) -> None:
        """ValueError: point outside [0, MAX_SPARSE_POINT]."""


class SparseServer:
    """This server's SparseShard (and, under PS_REPLICAS=1, the replica
    shard of server rank - 1) on a KVServer of app_id. ValueError: a bad
    table set, negative num_workers, a server of app_id on this node
    already. Error: before start() or after finalize()."""
    def __init__(self, tables: List[SparseTableConfig], num_workers: int = 0,
                 app_id: int = 0, allow_non_finite: bool = False) -> None: ...
    def wait_sync(self, point: int, timeout_s: float) -> bool:
        """ValueError: point outside [0, MAX_SPARSE_POINT], timeout_s
        negative or NaN."""
    def waiting_for(self) -> str:
        """Who the oldest sync point still waits for ("" when none)."""
    def rows(self, table: int) -> int: ...
    def replica_rows(self, table: int) -> Optional[int]: ...
    @property
    def memory_bytes(self) -> int: ...
    @property
    def pushes_applied(self) -> int: ...
    @property
    def bad_requests(self) -> int: ...
    def row(self, table: int, id: int) -> Optional[np.ndarray]: ...
    def save(self) -> bytes: ...
    def load(self, state: bytes) -> None:
        """Error: a state of other tables, cut off or not finite."""
