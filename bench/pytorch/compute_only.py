#!/usr/bin/env python3
"""The ceiling of any trainer of this network on this machine: PyTorch's own
forward + backward + SGD step of the tutorial's Net (examples/pytorch/
mnist_common.py) at batch 32, in one process, with no parameter server and
no data loading, for 1 and 2 intra-op threads. A trainer that computes its
gradients with autograd cannot run faster than this; compare the
samples/s of bench/pytorch/run.sh with it.

  /usr/bin/python3 bench/pytorch/compute_only.py [--steps N]
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..",
                                "examples", "pytorch"))
from mnist_common import Net  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        torch.manual_seed(1)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(args.batch_size, 1, 28, 28)
        y = torch.randint(0, 10, (args.batch_size,))

        def step():
            opt.zero_grad()
            F.nll_loss(model(x), y).backward()
            opt.step()
        for _ in range(20):  # warm-up
            step()
        start = time.monotonic()
        for _ in range(args.steps):
            step()
        rate = args.steps * args.batch_size / (time.monotonic() - start)
        print(f"threads {threads}: {rate:.0f} samples/s (forward + backward "
              f"+ SGD, batch {args.batch_size}, no ps, no data loading)")


if __name__ == "__main__":
    main()
