"""Type stub of the ps._ps extension (python/src/*.cc)."""

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
MAX_DENSE_STEP: int


class Error(RuntimeError):
    """A failed ps Status: the message names the node and the reason."""


def start(barrier: bool = True) -> None:
    """Starts this process's node from the tracker's environment (DMLC_*,
    PS_*): rendezvous, then (barrier) a barrier of all nodes. Raises Error."""
def finalize(barrier: bool = True) -> None:
    """Barrier of all nodes (barrier), then stops the node. Idempotent."""
def barrier(group: int = ...) -> None:
    """Blocks (without the GIL) until every node of `group` arrived."""
def role() -> str:
    """"scheduler", "server" or "worker" (known before start)."""
def rank() -> int:
    """This node's rank among its role (before start: PS_RANK or -1)."""
def num_workers() -> int: ...
def num_servers() -> int: ...
def is_started() -> bool: ...
def peer_failure() -> Optional[str]:
    """None, or the first peer failure this node learned of."""
def num_shared_frames_sent() -> int:
    """Data frames this node sent as shared-memory references."""
def num_shared_frames_received() -> int:
    """Data frames this node received as shared-memory references."""
def shared_array(n: int) -> np.ndarray:
    """n float32 zeros in memory co-located nodes map (ps::SharedArray)."""
def encode_dense_cmd(op: int, step: int, tag: int = 0) -> int:
    """The cmd of a DenseShard request (ps/dense_server.h)."""


class KVWorker:
    def __init__(self, app_id: int = 0, customer_id: int = 0) -> None: ...
    def push(self, keys: Buffer, vals: Buffer, lens: Optional[Buffer] = None,
             cmd: int = 0) -> int: ...
    def pull(self, keys: Buffer, out: Buffer, lens: Optional[Buffer] = None,
             cmd: int = 0) -> int: ...
    def pushpull(self, keys: Buffer, vals: Buffer, out: Buffer,
                 cmd: int = 0) -> int: ...
    def wait(self, ts: int) -> None: ...
    def set_placement(self, placement: "Placement") -> None: ...
    @property
    def num_pending(self) -> int: ...


class Placement:
    @staticmethod
    def even_keys(num_servers: int, max_key: int) -> "Placement": ...
    @staticmethod
    def by_bytes(keys: Sequence[int], sizes: Sequence[int],
                 num_servers: int) -> "Placement": ...
    @property
    def num_servers(self) -> int: ...
    def begin(self, server: int) -> int: ...
    def end(self, server: int) -> int: ...
    def server_of(self, key: int) -> int: ...
    def describe(self) -> str: ...


class DenseLayout:
    def __init__(self, total: int, chunk: int) -> None: ...
    @property
    def total(self) -> int: ...
    @property
    def chunk(self) -> int: ...
    @property
    def num_keys(self) -> int: ...
    def offset(self, key: int) -> int: ...
    def length(self, key: int) -> int: ...


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
                 lr_gamma: float = 1.0, app_id: int = 0) -> None: ...
    def wait_all_done(self, timeout_s: float) -> bool: ...
    @property
    def failure(self) -> Optional[str]: ...
    def weights(self) -> np.ndarray: ...
    @property
    def updates_applied(self) -> int: ...
    @property
    def max_staleness(self) -> int: ...
    @property
    def bad_requests(self) -> int: ...


Handler = Callable[[dict, np.ndarray, np.ndarray, Optional[np.ndarray]],
                   Union[None, np.ndarray, Tuple[np.ndarray, np.ndarray]]]


class KVServer:
    def __init__(self, handler: Handler, app_id: int = 0) -> None: ...
    def close(self) -> None: ...
