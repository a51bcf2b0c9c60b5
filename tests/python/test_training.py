"""Short runs of examples/pytorch/mnist_ps.py (BSP): 2 workers and 1
server, SGD with momentum, 100 steps of batch 32 per worker on the first
6,400 training images, reach 85% test accuracy on the first 2,000 test
images (measured: 88%); with 2 servers the pulls are written in place by
both and the final weights are those of 1 server, bit for bit; the default
recipe with --target-accuracy stops every worker at the evaluation step
where worker 0 reached it."""

import json
import os
import re

import pytest

from conftest import ROOT

DATA = os.path.join(ROOT, "data", "mnist")
SCRIPT = os.path.join(ROOT, "examples", "pytorch", "mnist_ps.py")
needs_mnist = pytest.mark.skipif(not os.path.exists(
    os.path.join(DATA, "train-images-idx3-ubyte")),
    reason="MNIST not in data/mnist (scripts/fetch_mnist.sh data/mnist)")


# The trainer before its recipe: one epoch of batch 32, SGD at a constant
# lr 0.01 with momentum 0.9, no shifts, no label smoothing, the final
# weights evaluated.
SGD = ["--epochs", "1", "--batch-size", "32", "--optimizer", "sgd", "--lr",
       "0.01", "--momentum", "0.9", "--lr-schedule", "step",
       "--lr-ref-batch", "0", "--ema-decay", "0", "--max-shift", "0",
       "--label-smoothing", "0"]


def summaries(r):
    """The JSON lines of a run: worker 0's summary and each server's."""
    assert r.returncode == 0, r.stdout
    found = [json.loads(l.split("] ", 1)[1]) for l in r.stdout.splitlines()
             if '] {"' in l]
    trainer = [d for d in found if d.get("trainer") == "ps"]
    assert len(trainer) == 1, r.stdout
    return trainer[0], [d for d in found if "server" in d]


@needs_mnist
def test_pytorch_trainer_reaches_accuracy(run_job):
    pytest.importorskip("torch")
    r = run_job(SCRIPT, 1, 2, ["--data-dir", DATA, "--train-limit", "6400",
                               "--test-limit", "2000"] + SGD, timeout=240)
    summary, _ = summaries(r)
    assert summary["steps"] == 100 and summary["workers"] == 2, summary
    assert summary["test_accuracy"] >= 0.85, summary


@needs_mnist
def test_two_servers_write_pulls_in_place_with_the_same_weights(run_job):
    # 10 steps at W=2: with S=2 each worker's 11 pulls (the initial one and
    # one per step) come from both servers by reference (the model's last key
    # is shorter than the others: the pull is cut at the server boundary),
    # and the final weights equal those of S=1 and of S=2 without shared
    # memory, bit for bit (the optimizer is elementwise).
    pytest.importorskip("torch")
    args = ["--data-dir", DATA, "--train-limit", "1280", "--test-limit", "200",
            "--max-steps", "10"]
    one, _ = summaries(run_job(SCRIPT, 1, 2, args, timeout=120))
    # The counts below are exact with the fixed resend timer: the default
    # one follows the round trip, and on a loaded host may send an answer
    # twice (its frames then count twice; the weights stay the same).
    two, servers = summaries(run_job(SCRIPT, 2, 2, args,
                                     env={"PS_RESEND_TIMEOUT_MS": "1000"},
                                     timeout=120))
    tcp, _ = summaries(run_job(SCRIPT, 2, 2, args, env={"PS_SHM": "0"},
                               timeout=120))
    assert one["steps"] == two["steps"] == tcp["steps"] == 10
    assert two["shared_frames_received"] == 2 * 11, two
    assert two["shared_frames_sent"] == 2 * 10, two
    assert len(servers) == 2, servers
    for s in servers:  # 11 pulls answered in place and 10 pushes read, per worker
        assert s["shared_frames_sent"] == 2 * 11, servers
        assert s["shared_frames_received"] == 2 * 10, servers
    assert tcp["shared_frames_received"] == 0, tcp
    assert two["weights_sha256"] == one["weights_sha256"], (one, two)
    assert tcp["weights_sha256"] == one["weights_sha256"], (one, tcp)
    assert two["test_accuracy"] == one["test_accuracy"], (one, two)


@needs_mnist
def test_the_recipe_stops_every_worker_where_the_target_is_reached(run_job):
    # The defaults (Adam, one-cycle over 3 epochs of batch 16, the weights'
    # average evaluated) on 4,000 training images: a worker's epoch is 125
    # steps, evaluated every 0.25 epoch on 1,000 test images, after steps
    # 32, 63, 94 and 125. 85% comes within the first epoch (measured: 81.9%
    # after 32 steps, 90.4% after 63); both workers stop at that step.
    pytest.importorskip("torch")
    r = run_job(SCRIPT, 1, 2, ["--data-dir", DATA, "--train-limit", "4000",
                               "--test-limit", "1000",
                               "--target-accuracy", "85"], timeout=300)
    summary, _ = summaries(r)
    steps = summary["steps"]
    assert steps in (32, 63, 94, 125), summary
    assert summary["reached"] is True, summary
    assert summary["test_accuracy"] >= 0.85, summary
    assert re.search(
        rf"^\[worker 0\] reached 85% after {steps * 2 * 16} samples "
        rf"\({steps / 125:.2f} epochs\) in \d+\.\d s of training$",
        r.stdout, re.M), r.stdout
    for w in (0, 1):
        assert f"[worker {w}] worker {w}: done after {steps} steps" in (
            r.stdout), r.stdout
