"""A short run of examples/pytorch/mnist_ps.py (2 workers, 1 server, BSP,
SGD with momentum): 100 steps of batch 32 per worker on the first 6,400
training images reach 85% test accuracy on the first 2,000 test images
(measured: 88%)."""

import json
import os

import pytest

from conftest import ROOT

DATA = os.path.join(ROOT, "data", "mnist")


@pytest.mark.skipif(not os.path.exists(
    os.path.join(DATA, "train-images-idx3-ubyte")),
    reason="MNIST not in data/mnist (scripts/fetch_mnist.sh data/mnist)")
def test_pytorch_trainer_reaches_accuracy(run_job):
    pytest.importorskip("torch")
    script = os.path.join(ROOT, "examples", "pytorch", "mnist_ps.py")
    r = run_job(script, 1, 2, ["--data-dir", DATA, "--train-limit", "6400",
                               "--test-limit", "2000"], timeout=240)
    assert r.returncode == 0, r.stdout
    line = [l for l in r.stdout.splitlines() if '"trainer": "ps"' in l]
    assert line, r.stdout
    summary = json.loads(line[0].split("] ", 1)[1])
    assert summary["steps"] == 100 and summary["workers"] == 2, summary
    assert summary["test_accuracy"] >= 0.85, summary
