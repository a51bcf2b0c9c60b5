#!/usr/bin/env python3
"""The same Net, data and batch under DistributedDataParallel (gloo, CPU):
`--procs` processes, each a shard of the epoch, gradients all-reduced; SGD
with momentum as examples/pytorch/mnist_ps.py. One JSON summary line.

    /usr/bin/python3 bench/pytorch/ddp.py --procs 2
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "pytorch"))
import mnist_common  # noqa: E402


def run(rank, args):
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1)
                                              // args.procs))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=rank, world_size=args.procs)
    torch.manual_seed(args.seed)
    model = DDP(mnist_common.Net())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr,
                          momentum=args.momentum)
    x, y = mnist_common.load_mnist(args.data_dir, True, args.train_limit)
    steps, start = 0, time.time()
    for idx in mnist_common.shard_batches(len(x), args.batch_size, rank,
                                          args.procs, 0, args.seed):
        opt.zero_grad()
        F.nll_loss(model(x[idx]), y[idx]).backward()
        opt.step()
        steps += 1
        if args.max_steps and steps >= args.max_steps:
            break
    train_s = time.time() - start
    if rank == 0:
        tx, ty = mnist_common.load_mnist(args.data_dir, False, args.test_limit)
        acc, test_loss = mnist_common.evaluate(model.module, tx, ty)
        n = steps * args.batch_size * args.procs
        print(json.dumps({
            "trainer": "ddp_gloo", "servers": 0, "workers": args.procs,
            "batch_size": args.batch_size, "steps": steps, "samples": n,
            "train_s": round(train_s, 2),
            "samples_per_s": round(n / train_s, 1),
            "test_accuracy": round(acc, 4), "test_loss": round(test_loss, 4),
        }), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--data-dir", default=mnist_common.default_data_dir())
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--train-limit", type=int, default=0)
    p.add_argument("--test-limit", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--port", type=int, default=29541)
    args = p.parse_args()
    mp.spawn(run, args=(args,), nprocs=args.procs, join=True)


if __name__ == "__main__":
    main()
