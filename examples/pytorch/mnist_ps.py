#!/usr/bin/env python3
"""Trains the PyTorch tutorial's MNIST Net data-parallel on ps servers.

    tracker/launch.py -s 1 -w 2 -- /usr/bin/python3 examples/pytorch/mnist_ps.py

Every process runs this file; its role comes from the tracker. Servers hold
the model's flat float32 vector in DenseShards (C++, started from Python by
ps.dense.serve_dense) that average the workers' gradients and apply the
optimizer. Each worker keeps its parameters and their gradients as views
into two flat buffers in shared memory (ps.shared_array): autograd writes
p.grad into one, which is pushed as it is (no copy; to a co-located server
a reference), and a co-located server writes the next weights straight
into the other, which is every parameter's storage. Workers train on disjoint shards of
each epoch; worker 0 evaluates and prints one JSON summary line.

Failures, as mnist_dist (docs/failures.md, docs/python.md): launched with
`--env PS_REPLICAS=1` (2 servers or more) each server also holds the
previous server's keys and takes them over when it dies;
--checkpoint-dir with --checkpoint-every N writes mnist_dist's checkpoint
files and --restore resumes from the newest complete set; under
launch.py --max-restarts a killed worker is restarted and rejoins. Dropout
is seeded per worker and step, so a worker that resumes at a step draws
what the one before it would have.
"""

import argparse
import hashlib
import json
import os
import signal
import struct
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_common  # noqa: E402

import ps  # noqa: E402
import ps.dense  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default=mnist_common.default_data_dir())
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--consistency", default="bsp",
                   choices=["bsp", "bounded", "async"])
    p.add_argument("--max-delay", type=int, default=0)
    p.add_argument("--chunk", type=int, default=ps.dense.DEFAULT_CHUNK,
                   help="floats per key")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--train-limit", type=int, default=0)
    p.add_argument("--test-limit", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop each worker after this many steps (0: epochs)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per worker (0: cores / (workers + "
                   "servers), at least 1)")
    p.add_argument("--log-every", type=int, default=200, help="steps")
    p.add_argument("--checkpoint-dir", default="",
                   help="write checkpoints here (bsp only)")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="steps between checkpoints (with --checkpoint-dir)")
    p.add_argument("--restore", action="store_true",
                   help="resume from the newest complete checkpoint")
    p.add_argument("--dump-weights", default="",
                   help="worker 0 writes the final weights (float32) here")
    p.add_argument("--die-after-steps", type=int, default=0,
                   help="test hook: worker --die-rank kills itself "
                   "(SIGKILL) after this many steps, in its first run only")
    p.add_argument("--die-rank", type=int, default=0)
    args = p.parse_args(argv)
    # Refused here, naming the flag, in every role before ps.start().
    if args.checkpoint_dir and args.checkpoint_every <= 0:
        p.error("--checkpoint-dir needs --checkpoint-every N > 0")
    if not args.checkpoint_dir and (args.checkpoint_every or args.restore):
        p.error("--checkpoint-every and --restore need --checkpoint-dir")
    if args.checkpoint_dir and args.consistency != "bsp":
        p.error(f"--checkpoint-dir needs --consistency bsp (checkpoints are "
                f"taken at step boundaries every node agrees on), got "
                f"--consistency {args.consistency}")
    return args


def flatten_into(params, flat):
    """Makes every parameter a view into `flat` (copying its values)."""
    off = 0
    for p in params:
        n = p.numel()
        flat[off:off + n].copy_(p.data.reshape(-1))
        p.data = flat[off:off + n].view_as(p)
        off += n


def attach_grads(params, flat_grad):
    off = 0
    for p in params:
        n = p.numel()
        p.grad = flat_grad[off:off + n].view_as(p)
        off += n


def grads_in_place(params, flat_grad):
    ptr, end = flat_grad.data_ptr(), flat_grad.data_ptr() + 4 * flat_grad.numel()
    return all(p.grad is not None and ptr <= p.grad.data_ptr() < end
               for p in params)


def worker_payload(epoch, batch):
    """A worker's checkpoint payload, as mnist_dist packs it (ps::Packer):
    int32 epoch, int32 batches done in it, then its random state."""
    rng = torch.get_rng_state().numpy().tobytes()
    return struct.pack("=iiQ", epoch, batch, len(rng)) + rng


def load_worker_payload(payload):
    epoch, batch, n = struct.unpack_from("=iiQ", payload)
    torch.set_rng_state(torch.frombuffer(bytearray(payload[16:16 + n]),
                                         dtype=torch.uint8))
    return epoch, batch


def resume_point(args, dense, ckpt, restore_step, rank, per_epoch):
    """(step, epoch, batch in epoch) to start at: 0, the restored
    checkpoint's, or (a restarted worker) the step the servers expect."""
    if ps.rejoined():
        step = dense.rejoin()
        print(f"worker {rank} rejoined at step {step}", flush=True)
        return step, step // per_epoch, step % per_epoch
    if restore_step >= 0:
        epoch, batch = load_worker_payload(
            ckpt.read_worker(rank, restore_step))
        return restore_step, epoch, batch
    return 0, 0, 0


def run_worker(args, model, total, ckpt, restore_step):
    rank, world = ps.rank(), ps.num_workers()
    # The servers run on the same cores: on 2 cores with S = W = 1, one
    # intra-op thread trains faster than two (which contend with the server).
    torch.set_num_threads(args.threads or max(
        1, (os.cpu_count() or 1) // (world + ps.num_servers())))
    params = list(model.parameters())
    # Both in shared memory: to a co-located server the gradient goes by
    # reference and the next weights are written straight into `weights`
    # (elsewhere, or with PS_SHM=0, the bytes travel through the socket).
    weights = torch.from_numpy(ps.shared_array(total))
    grads = torch.from_numpy(ps.shared_array(total))
    flatten_into(params, weights)
    attach_grads(params, grads)
    x, y = mnist_common.load_mnist(args.data_dir, True, args.train_limit)
    dense = ps.dense.DenseWorker(total, args.chunk)
    per_epoch = len(mnist_common.shard_batches(len(x), args.batch_size, rank,
                                               world, 0, args.seed))
    step, first_epoch, skip = resume_point(args, dense, ckpt, restore_step,
                                           rank, per_epoch)
    dense.wait(dense.pull(weights, step))  # the servers' weights of `step`
    die = (args.die_after_steps > 0 and rank == args.die_rank
           and "PS_RESTART_COUNT" not in os.environ)

    first_step, start, loss_sum, loss_n = step, time.time(), 0.0, 0
    for epoch in range(first_epoch, args.epochs):
        batches = mnist_common.shard_batches(len(x), args.batch_size, rank,
                                             world, epoch, args.seed)
        for b in range(skip if epoch == first_epoch else 0, len(batches)):
            if args.max_steps and step >= args.max_steps:
                break
            idx = batches[b]
            # Dropout drawn from (seed, rank, step): a worker resumed at a
            # step (restored or rejoined) draws the same masks.
            torch.manual_seed((args.seed * 1000003 + rank) * 1000003 + step)
            grads.zero_()
            loss = F.nll_loss(model(x[idx]), y[idx])
            loss.backward()
            if step == first_step and not grads_in_place(params, grads):
                raise RuntimeError("autograd replaced p.grad: cannot push the "
                                   "flat gradient buffer in place")
            dense.step(grads, weights, step, tag=epoch)
            step += 1
            loss_sum, loss_n = loss_sum + loss.item(), loss_n + 1
            if ckpt is not None and step % args.checkpoint_every == 0:
                ckpt.write_worker(rank, step, worker_payload(epoch, b + 1))
            if die and step == args.die_after_steps:
                print(f"worker {rank}: killing itself after {step} steps "
                      "(test)", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if rank == 0 and step % args.log_every == 0:
                rate = ((step - first_step) * args.batch_size * world /
                        (time.time() - start))
                print(f"worker 0: epoch {epoch} step {step} loss "
                      f"{loss_sum / loss_n:.4f} {rate:.0f} samples/s",
                      flush=True)
                loss_sum, loss_n = 0.0, 0
    train_s = time.time() - start
    dense.done(step)
    if rank == 0:
        report(args, model, weights, step, world, train_s, first_step)


def report(args, model, weights, step, world, train_s, first_step):
    """Worker 0's summary line (and --dump-weights)."""
    tx, ty = mnist_common.load_mnist(args.data_dir, False, args.test_limit)
    acc, test_loss = mnist_common.evaluate(model, tx, ty)
    samples = (step - first_step) * args.batch_size * world
    if args.dump_weights:
        with open(args.dump_weights, "wb") as f:
            f.write(weights.numpy().tobytes())
    print(json.dumps({
        "trainer": "ps", "servers": ps.num_servers(), "workers": world,
        "batch_size": args.batch_size, "steps": step,
        "samples": step * args.batch_size * world,
        "train_s": round(train_s, 2),
        "samples_per_s": round(samples / max(train_s, 1e-9), 1),
        "test_accuracy": round(acc, 4), "test_loss": round(test_loss, 4),
        "threads": torch.get_num_threads(),
        "shared_frames_sent": ps.num_shared_frames_sent(),
        "shared_frames_received": ps.num_shared_frames_received(),
        # The final weights' bytes, to compare runs bit for bit.
        "weights_sha256": hashlib.sha256(
            weights.numpy().tobytes()).hexdigest()[:16],
    }), flush=True)


def main():
    args = parse_args()
    torch.manual_seed(args.seed)  # the same initial weights everywhere
    model = mnist_common.Net()
    total = sum(p.numel() for p in model.parameters())
    ckpt, restore_step = None, -1
    if args.checkpoint_dir:
        # Before ps.start(), in every role: a folder that is not usable (a
        # new job's not empty, a restore's without a complete set) stops
        # every process at once, naming it.
        try:
            ckpt = ps.dense.Checkpoints(args.checkpoint_dir, total, args.chunk)
            restore_step = ckpt.pick(args.restore)
        except ps.Error as e:
            sys.exit(f"mnist_ps: --checkpoint-dir: {e}")
    ps.start()
    print(f"{ps.role()} {ps.rank()}: pid {os.getpid()}", flush=True)
    if ps.is_server():
        init = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        opt = ps.OptimizerConfig(args.optimizer, lr=args.lr,
                                 momentum=args.momentum
                                 if args.optimizer == "sgd" else 0.0)
        ps.dense.serve_dense(init.numpy(), args.chunk, opt, args.consistency,
                             args.max_delay,
                             checkpoint_dir=args.checkpoint_dir,
                             checkpoint_every=args.checkpoint_every,
                             restore_step=restore_step)
        # Data frames that went by reference (pushes read, pulls written
        # in place) to and from co-located workers.
        print(json.dumps({
            "server": ps.rank(),
            "shared_frames_sent": ps.num_shared_frames_sent(),
            "shared_frames_received": ps.num_shared_frames_received(),
        }), flush=True)
    elif ps.is_worker():
        run_worker(args, model, total, ckpt, restore_step)
    ps.finalize()


if __name__ == "__main__":
    main()
