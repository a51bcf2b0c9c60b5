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

The recipe is mnist_dist's (docs/python.md): Adam with a one-cycle learning
rate applied by the servers from the push's step (linear warmup from lr/25
to the peak over --warmup of the planned steps, then linear decay to 0 at
epochs x steps per epoch), the peak --lr scaled by sqrt(workers x batch /
--lr-ref-batch), random shifts of the images by up to --max-shift pixels,
label smoothing that fades to 0 over the planned steps, and worker 0
evaluating an exponential moving average of the weights (--ema-decay).
With --target-accuracy P worker 0 evaluates every --eval-every epochs and
all workers stop at the same step once P% is reached (StopVotes; not with
PS_REPLICAS or --max-restarts), printing `reached P% after N samples (E
epochs) in T s of training`. One run at S = W = 2 reached 99% after 1
epoch (docs/python.md).

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
import math
import os
import signal
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_common  # noqa: E402

import ps  # noqa: E402
import ps.dense  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default=mnist_common.default_data_dir())
    p.add_argument("--epochs", type=int, default=3,
                   help="passes over the training set (the one-cycle "
                   "schedule spans them all)")
    p.add_argument("--batch-size", type=int, default=16, help="per worker")
    p.add_argument("--optimizer", default="adam", choices=["sgd", "adam"])
    p.add_argument("--lr", type=float, default=3e-3,
                   help="learning rate (one-cycle: its peak) for a global "
                   "batch of --lr-ref-batch")
    p.add_argument("--momentum", type=float, default=0.9, help="sgd only")
    p.add_argument("--lr-schedule", default="onecycle",
                   choices=["onecycle", "step"],
                   help="onecycle: linear warmup from lr/25 to lr over "
                   "--warmup of the planned steps (epochs x steps per "
                   "epoch), then linear decay to 0 at the last; step: "
                   "constant")
    p.add_argument("--warmup", type=float, default=0.1,
                   help="onecycle: fraction of the planned steps")
    p.add_argument("--lr-ref-batch", type=int, default=32,
                   help="the lr used is --lr x sqrt(workers x batch-size / "
                   "this) (0: --lr as given)")
    p.add_argument("--max-shift", type=int, default=1,
                   help="augmentation: shift each training image by up to "
                   "this many pixels in x and y, at random (0: none)")
    p.add_argument("--label-smoothing", type=float, default=0.05,
                   help="loss = (1 - eps) nll + eps x mean over classes of "
                   "-log p")
    p.add_argument("--label-smoothing-decay",
                   action=argparse.BooleanOptionalAction, default=True,
                   help="eps falls linearly to 0 at the last planned step")
    p.add_argument("--ema-decay", type=float, default=0.999,
                   help="worker 0 evaluates an exponential moving average "
                   "of the weights with this decay per step (0: the "
                   "weights)")
    p.add_argument("--target-accuracy", type=float, default=0.0,
                   help="stop once worker 0's test accuracy reaches this "
                   "many percent, evaluating every --eval-every epochs, and "
                   "print the samples and training seconds it took (0: "
                   "train every epoch)")
    p.add_argument("--eval-every", type=float, default=0.25,
                   help="with --target-accuracy: epochs between evaluations")
    p.add_argument("--consistency", default="bsp",
                   choices=["bsp", "bounded", "async"])
    p.add_argument("--max-delay", type=int, default=0)
    p.add_argument("--chunk", type=int, default=ps.dense.DEFAULT_CHUNK,
                   help="floats per key")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--train-limit", type=int, default=0)
    p.add_argument("--test-limit", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop each worker after this many steps (0: epochs; "
                   "the one-cycle lr then ends at that step)")
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
    for ok, flag, value, want in (
            (args.epochs >= 1, "--epochs", args.epochs, ">= 1"),
            (args.batch_size >= 1, "--batch-size", args.batch_size, ">= 1"),
            (0 <= args.warmup < 1, "--warmup", args.warmup, "in [0, 1)"),
            (args.lr_ref_batch >= 0, "--lr-ref-batch", args.lr_ref_batch,
             ">= 0"),
            (0 <= args.max_shift <= 8, "--max-shift", args.max_shift,
             "in [0, 8]"),
            (0 <= args.label_smoothing < 1, "--label-smoothing",
             args.label_smoothing, "in [0, 1)"),
            (0 <= args.ema_decay < 1, "--ema-decay", args.ema_decay,
             "in [0, 1)"),
            (0 <= args.target_accuracy <= 100, "--target-accuracy",
             args.target_accuracy, "in [0, 100]"),
            (0 < args.eval_every <= 1, "--eval-every", args.eval_every,
             "in (0, 1]")):
        if not ok:
            p.error(f"{flag} {value}: must be {want}")
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


def steps_per_epoch(args, world):
    """Steps each worker runs in one epoch (shard_batches drops the last
    partial batch)."""
    n = mnist_common.num_images(args.data_dir, True, args.train_limit)
    return (n // world) // args.batch_size


def planned_steps(args, world):
    """The steps one worker plans to run: the span of the one-cycle lr and
    of the fading label smoothing, as mnist_dist's ScheduleOf."""
    total = max(1, args.epochs * steps_per_epoch(args, world))
    if args.max_steps:
        total = min(total, args.max_steps)  # the schedule ends with the run
    return total


def schedule(args, world):
    """(lr, serve_dense's schedule arguments), as mnist_dist's ScheduleOf:
    the peak lr scaled to the global batch, one-cycle over the planned
    steps of one worker."""
    lr = args.lr
    if args.lr_ref_batch > 0:
        lr *= math.sqrt(world * args.batch_size / args.lr_ref_batch)
    if args.lr_schedule == "step":
        return lr, {}
    total = planned_steps(args, world)
    warmup = min(total - 1, math.floor(args.warmup * total + 0.5))
    return lr, dict(lr_schedule="onecycle", total_steps=total,
                    warmup_steps=warmup)


def shifted(images, s):
    """Each image [N, 1, 28, 28] shifted by its own random (dx, dy) in
    [-s, s], the background filling what comes in (as mnist_dist's
    --max_shift); drawn from torch's generator."""
    if s == 0:
        return images
    n, _, h, w = images.shape
    background = -mnist_common.MEAN / mnist_common.STD
    padded = F.pad(images, (s, s, s, s), value=background)
    d = torch.randint(0, 2 * s + 1, (n, 2))
    rows = torch.arange(h)[None, :] + d[:, :1]  # [N, h]
    cols = torch.arange(w)[None, :] + d[:, 1:]  # [N, w]
    out = padded[torch.arange(n)[:, None, None], 0, rows[:, :, None],
                 cols[:, None, :]]
    return out.unsqueeze(1)


def loss_of(log_probs, y, smoothing):
    """NLL with label smoothing: (1 - eps) nll + eps mean(-log p)."""
    nll = F.nll_loss(log_probs, y)
    if smoothing == 0:
        return nll
    return (1 - smoothing) * nll - smoothing * log_probs.mean()


class Evaluator:
    """Worker 0's test-set evaluation: of the weights, or of their
    exponential moving average (--ema-decay) kept in a model of its own and
    updated after every step from the pulled weights. Early on the average
    would be mostly the initial weights: the decay grows as (1 + t) /
    (10 + t) up to --ema-decay (mnist_dist's Evaluator)."""

    def __init__(self, args, model, weights):
        self.x, self.y = mnist_common.load_mnist(args.data_dir, False,
                                                 args.test_limit)
        self.decay, self.steps, self.weights = args.ema_decay, 0, weights
        self.model = model
        self.last = None  # (step, accuracy, loss) of the last evaluation
        if self.decay > 0:
            self.model = mnist_common.Net()
            self.ema = torch.zeros_like(weights)
            flatten_into(list(self.model.parameters()), self.ema)
            self.ema.copy_(weights)

    def after_step(self):
        if self.decay == 0:
            return
        self.steps += 1
        d = min(self.decay, (1 + self.steps) / (10 + self.steps))
        self.ema.lerp_(self.weights, 1 - d)

    def evaluate(self, step):
        """(accuracy, loss) after `step` steps, evaluated once per step."""
        if self.last is None or self.last[0] != step:
            self.last = (step,) + mnist_common.evaluate(self.model, self.x,
                                                        self.y)
        return self.last[1:]


class StopVotes:
    """--target-accuracy: at every evaluation step (every worker knows them
    from its step count), worker 0 pushes its verdict, go on or stop, under
    the key `step` to a Python handler server (app 1, on every server); then
    the workers meet at a barrier, after which the others pull that verdict.
    So all of them stop at the same step, with the weights worker 0
    evaluated (mnist_dist's StopVotes, made of what ps offers Python): two
    small requests and one barrier per evaluation. Made after ps.start() in
    every server and worker, a server's before its DenseServer (so before
    any step ends and a worker can vote)."""

    APP_ID = 1

    def __init__(self):
        self._verdicts = {}  # a server's, by step
        if ps.is_server():
            self._server = ps.KVServer(self._handle, app_id=self.APP_ID)
        else:
            self._kv = ps.KVWorker(app_id=self.APP_ID)

    def _handle(self, meta, keys, vals, lens):
        step = int(keys[0])
        if meta["push"]:
            self._verdicts[step] = float(vals[0])
            return None
        return np.array([self._verdicts[step]], np.float32)

    def agree(self, step, stop):
        """Worker 0 passes its verdict of `step`; every worker gets it."""
        key = np.array([step], np.int64)
        val = np.array([1.0 if stop else 0.0], np.float32)
        if ps.rank() == 0:
            self._kv.wait(self._kv.push(key, val))
        ps.barrier(ps.WORKER_GROUP)
        if ps.rank() != 0:
            self._kv.wait(self._kv.pull(key, val))
        return bool(val[0])

    def close(self):
        """A server's, once every worker is done."""
        self._server.close()


def hear_verdict(args, evaluator, votes, step, per_epoch):
    """At an evaluation step: worker 0 evaluates and says whether the
    target is reached; every worker returns whether to stop."""
    reached = False
    if evaluator is not None:
        acc, loss = evaluator.evaluate(step)
        print(f"worker 0 step {step} ({step / per_epoch:.2f} epochs): test "
              f"accuracy {100 * acc:.2f}%  test loss {loss:.4f}", flush=True)
        reached = 100 * acc >= args.target_accuracy
    return votes.agree(step, reached)


def run_worker(args, model, total, ckpt, restore_step, votes):
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
    per_epoch = max(1, len(mnist_common.shard_batches(
        len(x), args.batch_size, rank, world, 0, args.seed)))
    step, first_epoch, skip = resume_point(args, dense, ckpt, restore_step,
                                           rank, per_epoch)
    dense.wait(dense.pull(weights, step))  # the servers' weights of `step`
    evaluator = Evaluator(args, model, weights) if rank == 0 else None
    die = (args.die_after_steps > 0 and rank == args.die_rank
           and "PS_RESTART_COUNT" not in os.environ)
    # --target-accuracy: every --eval-every epochs, after the batches of an
    # epoch where floor(batches / interval) grows and at its end.
    interval = max(1.0, args.eval_every * per_epoch)

    def eval_point(done):
        return votes is not None and (
            done == per_epoch or
            math.floor(done / interval) != math.floor((done - 1) / interval))

    planned = planned_steps(args, world)  # for --label-smoothing-decay
    first_step, start, loss_sum, loss_n = step, time.time(), 0.0, 0
    eval_s, stop = 0.0, False  # eval_s: in evaluations and votes
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
            eps = args.label_smoothing
            if args.label_smoothing_decay:
                eps *= max(0.0, 1.0 - step / planned)
            loss = loss_of(model(shifted(x[idx], args.max_shift)), y[idx],
                           eps)
            loss.backward()
            if step == first_step and not grads_in_place(params, grads):
                raise RuntimeError("autograd replaced p.grad: cannot push the "
                                   "flat gradient buffer in place")
            dense.step(grads, weights, step, tag=epoch)
            step += 1
            if evaluator is not None:
                evaluator.after_step()
            loss_sum, loss_n = loss_sum + loss.item(), loss_n + 1
            if ckpt is not None and step % args.checkpoint_every == 0:
                ckpt.write_worker(rank, step, worker_payload(epoch, b + 1))
            if die and step == args.die_after_steps:
                print(f"worker {rank}: killing itself after {step} steps "
                      "(test)", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if rank == 0 and step % args.log_every == 0:
                rate = ((step - first_step) * args.batch_size * world /
                        (time.time() - start - eval_s))
                print(f"worker 0: epoch {epoch} step {step} loss "
                      f"{loss_sum / loss_n:.4f} {rate:.0f} samples/s",
                      flush=True)
                loss_sum, loss_n = 0.0, 0
            if eval_point(b + 1):
                t = time.time()
                stop = hear_verdict(args, evaluator, votes, step, per_epoch)
                eval_s += time.time() - t
                if stop:
                    break
        if stop:
            break
    train_s = time.time() - start - eval_s
    dense.done(step)
    print(f"worker {rank}: done after {step} steps", flush=True)
    if rank == 0:
        report(args, evaluator, weights, step, world, train_s, first_step,
               per_epoch)


def report(args, evaluator, weights, step, world, train_s, first_step,
           per_epoch):
    """Worker 0's target line, summary line (and --dump-weights)."""
    acc, test_loss = evaluator.evaluate(step)
    samples = (step - first_step) * args.batch_size * world
    reached = None
    if args.target_accuracy > 0:
        reached = 100 * acc >= args.target_accuracy
        done = (f"after {samples} samples ({step / per_epoch:.2f} epochs) in "
                f"{train_s:.1f} s of training")
        print(f"reached {args.target_accuracy:g}% {done}" if reached else
              f"not reached: {args.target_accuracy:g}% wanted, "
              f"{100 * acc:.2f}% {done}", flush=True)
    if args.dump_weights:
        with open(args.dump_weights, "wb") as f:
            f.write(weights.numpy().tobytes())
    print(json.dumps({
        "trainer": "ps", "servers": ps.num_servers(), "workers": world,
        "batch_size": args.batch_size, "steps": step,
        "samples": step * args.batch_size * world,
        "train_s": round(train_s, 2),
        "samples_per_s": round(samples / max(train_s, 1e-9), 1),
        # Of the weights' average with --ema-decay > 0.
        "test_accuracy": round(acc, 4), "test_loss": round(test_loss, 4),
        "ema_decay": args.ema_decay, "reached": reached,
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
    if args.target_accuracy > 0 and (ps.replicas() or ps.max_restarts()):
        # StopVotes' handler server takes no replica, and a restarted
        # worker would miss the barrier of the vote it died in.
        sys.exit(f"mnist_ps: --target-accuracy {args.target_accuracy:g} "
                 f"needs PS_REPLICAS=0 and no --max-restarts (worker 0 "
                 f"decides when all stop), got PS_REPLICAS={ps.replicas()} "
                 f"PS_MAX_RESTARTS={ps.max_restarts()}")
    if ps.role() == "server":
        # The one-cycle length needs the training set's size: read before
        # ps.start(), so that a missing file stops this server at once.
        try:
            lr, lr_schedule = schedule(args, ps.num_workers())
        except OSError as e:
            sys.exit(f"mnist_ps: --data-dir {args.data_dir}: {e}")
    ps.start()
    print(f"{ps.role()} {ps.rank()}: pid {os.getpid()}", flush=True)
    votes = None
    if args.target_accuracy > 0 and not ps.is_scheduler():
        votes = StopVotes()
    if ps.is_server():
        init = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        opt = ps.OptimizerConfig(args.optimizer, lr=lr,
                                 momentum=args.momentum
                                 if args.optimizer == "sgd" else 0.0)
        ps.dense.serve_dense(init.numpy(), args.chunk, opt, args.consistency,
                             args.max_delay,
                             checkpoint_dir=args.checkpoint_dir,
                             checkpoint_every=args.checkpoint_every,
                             restore_step=restore_step, **lr_schedule)
        if votes is not None:
            votes.close()
        # Data frames that went by reference (pushes read, pulls written
        # in place) to and from co-located workers.
        print(json.dumps({
            "server": ps.rank(),
            "shared_frames_sent": ps.num_shared_frames_sent(),
            "shared_frames_received": ps.num_shared_frames_received(),
        }), flush=True)
    elif ps.is_worker():
        run_worker(args, model, total, ckpt, restore_step, votes)
    ps.finalize()


if __name__ == "__main__":
    main()
