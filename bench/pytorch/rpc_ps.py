#!/usr/bin/env python3
"""PyTorch's RPC parameter-server tutorial, reimplemented small and offline.

The structure of "Implementing a Parameter Server Using Distributed RPC
Framework" (pytorch.org tutorials): rank 0 is the parameter server and
holds the one model; each trainer's TrainerNet calls the server's forward
over RPC (rpc_sync), runs distributed autograd backward through it, and
steps a DistributedOptimizer over the server's parameter RRefs. The same
Net, data (local IDX files) and batch as examples/pytorch/mnist_ps.py; one
JSON summary line at the end.

    /usr/bin/python3 bench/pytorch/rpc_ps.py --trainers 1
"""

import argparse
import json
import os
import sys
import threading
import time

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributed.optim import DistributedOptimizer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "pytorch"))
import mnist_common  # noqa: E402


class ParameterServer(nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.model = mnist_common.Net()

    def forward(self, inp):
        return self.model(inp)

    def get_param_rrefs(self):
        return [rpc.RRef(p) for p in self.model.parameters()]


param_server = None
global_lock = threading.Lock()


def get_parameter_server(seed):
    global param_server
    with global_lock:
        if not param_server:
            param_server = ParameterServer(seed)
        return param_server


def run_parameter_server(rank, world_size):
    # The tutorial's server just waits: trainers drive it over RPC.
    rpc.shutdown()


class TrainerNet(nn.Module):
    def __init__(self, seed):
        super().__init__()
        self.param_server_rref = rpc.remote("parameter_server",
                                            get_parameter_server, args=(seed,))

    def get_global_param_rrefs(self):
        return rpc.rpc_sync(self.param_server_rref.owner(),
                            remote_method, args=(
                                ParameterServer.get_param_rrefs,
                                self.param_server_rref))

    def forward(self, x):
        return rpc.rpc_sync(self.param_server_rref.owner(), remote_method,
                            args=(ParameterServer.forward,
                                  self.param_server_rref, x))


def call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)


def remote_method(method, rref, *args, **kwargs):
    return call_method(method, rref, *args, **kwargs)


def evaluate_on_server(data_dir, test_limit):
    tx, ty = mnist_common.load_mnist(data_dir, False, test_limit)
    return mnist_common.evaluate(param_server.model, tx, ty)


def run_training_loop(args, rank, world):
    net = TrainerNet(args.seed)
    opt = DistributedOptimizer(optim.SGD, net.get_global_param_rrefs(),
                               lr=args.lr, momentum=args.momentum)
    x, y = mnist_common.load_mnist(args.data_dir, True, args.train_limit)
    trainers = world - 1
    steps, start = 0, time.time()
    for idx in mnist_common.shard_batches(len(x), args.batch_size, rank - 1,
                                          trainers, 0, args.seed):
        with dist_autograd.context() as cid:
            out = net(x[idx])
            loss = F.nll_loss(out, y[idx])
            dist_autograd.backward(cid, [loss])
            opt.step(cid)
        steps += 1
        if args.max_steps and steps >= args.max_steps:
            break
    train_s = time.time() - start
    if rank == 1:
        acc, test_loss = rpc.rpc_sync("parameter_server", evaluate_on_server,
                                      args=(args.data_dir, args.test_limit))
        print(json.dumps({
            "trainer": "rpc_tutorial", "servers": 1, "workers": trainers,
            "batch_size": args.batch_size, "steps": steps,
            "samples": steps * args.batch_size * trainers,
            "train_s": round(train_s, 2),
            "samples_per_s": round(steps * args.batch_size * trainers
                                   / train_s, 1),
            "test_accuracy": round(acc, 4), "test_loss": round(test_loss, 4),
        }), flush=True)


def run_worker(rank, world, args):
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1)))
    opts = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=16, init_method=f"tcp://127.0.0.1:{args.port}",
        rpc_timeout=600)
    if rank == 0:
        rpc.init_rpc("parameter_server", rank=0, world_size=world,
                     rpc_backend_options=opts)
        run_parameter_server(0, world)
    else:
        rpc.init_rpc(f"trainer_{rank}", rank=rank, world_size=world,
                     rpc_backend_options=opts)
        run_training_loop(args, rank, world)
        rpc.shutdown()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trainers", type=int, default=1)
    p.add_argument("--data-dir", default=mnist_common.default_data_dir())
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--train-limit", type=int, default=0)
    p.add_argument("--test-limit", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--port", type=int, default=29531)
    args = p.parse_args()
    mp.spawn(run_worker, args=(args.trainers + 1, args), nprocs=args.trainers + 1,
             join=True)


if __name__ == "__main__":
    main()
