#!/usr/bin/env python3
"""PyTorch's training rate for the tutorial's Net on this GPU: the reference
that `mnist_local --device cuda` is measured against (bench/gpu/run.sh).

Same network (examples/pytorch/mnist_common.py), same optimizer (Adam, lr
1e-3), same data path as mnist_local: each step takes a shuffled batch of
the normalised images from host memory, copies it to the GPU, and runs
forward, backward and the optimizer step. Two settings of PyTorch:
  fp32  convolutions and matmuls in full FP32 (TF32 off), as our CUDA
        backend computes them: the like-for-like figure;
  tf32  PyTorch's defaults (cuDNN may use TF32 for convolutions).
Prints one line per (setting, batch):
  torch setting=fp32 batch=64 samples_per_s=... steps=...
It never asserts.

  python3 bench/gpu/torch_mnist.py --data_dir data/mnist [--batches 32,64]
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..",
                                "examples", "pytorch"))
from mnist_common import Net, load_mnist  # noqa: E402


def rate(x, y, batch, steps, device):
    """samples/s of `steps` training steps at `batch`, after a warm-up."""
    torch.manual_seed(1)
    model = Net().to(device)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    n = x.shape[0]
    gen = torch.Generator().manual_seed(1)

    def step(idx):
        xb = x[idx].to(device, non_blocking=False)
        yb = y[idx].to(device, non_blocking=False)
        opt.zero_grad(set_to_none=True)
        F.nll_loss(model(xb), yb).backward()
        opt.step()

    perm = torch.randperm(n, generator=gen)
    for i in range(10):  # warm-up: cuDNN plans, allocator
        step(perm[i * batch:(i + 1) * batch])
    torch.cuda.synchronize()
    start = time.perf_counter()
    done = 0
    pos = 0
    while done < steps:
        if pos + batch > n:
            perm = torch.randperm(n, generator=gen)
            pos = 0
        step(perm[pos:pos + batch])
        pos += batch
        done += 1
    torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data_dir", required=True)
    p.add_argument("--batches", default="32,64,128,512")
    p.add_argument("--samples", type=int, default=60000,
                   help="training samples timed per batch size")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_mnist: no CUDA device visible to PyTorch")
    device = torch.device("cuda")
    x, y = load_mnist(args.data_dir, train=True)
    x = torch.as_tensor(x)
    y = torch.as_tensor(y)
    print(f"torch {torch.__version__} cudnn "
          f"{torch.backends.cudnn.version()} on "
          f"{torch.cuda.get_device_name(0)}", flush=True)
    for setting in ("fp32", "tf32"):
        torch.backends.cudnn.allow_tf32 = setting == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = False
        for batch in (int(b) for b in args.batches.split(",")):
            steps = max(20, args.samples // batch)
            r = rate(x, y, batch, steps, device)
            print(f"torch setting={setting} batch={batch} "
                  f"samples_per_s={r:.0f} steps={steps}", flush=True)


if __name__ == "__main__":
    main()
