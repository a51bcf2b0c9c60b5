"""The PyTorch trainer (examples/pytorch/mnist_ps.py, ps.dense.serve_dense)
survives what mnist_dist survives (docs/failures.md), each checked by
harming a running job: under BSP with 2 workers each ends with the final
weights of a job never harmed, bit for bit (--dump-weights)."""

import random

from pytorch_jobs import ARGS, needs_mnist, run, weights_of, Job


@needs_mnist
def test_replicas_survive_a_killed_server_with_the_same_weights(tmp_path):
    # PS_REPLICAS=1, 3 servers: fault-free the job ends well (each server
    # serves its replica shard); server 1 killed (-9) at a random step, its
    # replica (server 2) takes its keys over and the job ends with the
    # weights of the job never harmed.
    env = {"PS_REPLICAS": "1"}
    clean = str(tmp_path / "clean.bin")
    rc, out = run(3, 2, ARGS + ["--dump-weights", clean], env=env)
    want = weights_of(rc, out, clean)
    assert out.count("launch: all 6 processes exited 0") == 1, out

    harmed = str(tmp_path / "harmed.bin")
    step = random.randint(3, 20)
    job = Job(3, 2, ARGS + ["--dump-weights", harmed], env=env)
    job.kill_at_step("server", 1, step)
    rc, out = job.wait()
    assert weights_of(rc, out, harmed) == want, f"killed at step {step}"
    assert ("the job survived the loss of server 1 (the scheduler said "
            "server 2 took over its keys)") in out, out
