"""The PyTorch trainer (examples/pytorch/mnist_ps.py, ps.dense.serve_dense)
survives what mnist_dist survives (docs/failures.md), each checked by
harming a running job: under BSP with 2 workers each ends with the final
weights of a job never harmed, bit for bit (--dump-weights)."""

import random
import re

import pytest

from pytorch_jobs import ARGS, needs_mnist, run, weights_of, Job


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """clean(servers, replicas): the final weights of the job never harmed
    (2 workers), run once per shape for all the tests of this file."""
    done = {}

    def weights(servers, replicas=0):
        if (servers, replicas) not in done:
            path = str(tmp_path_factory.mktemp("clean") / "w.bin")
            rc, out = run(servers, 2, ARGS + ["--dump-weights", path],
                          env={"PS_REPLICAS": str(replicas)})
            if replicas:  # each server served its replica shard to the end
                assert "launch: all 6 processes exited 0" in out, out
            done[servers, replicas] = weights_of(rc, out, path)
        return done[servers, replicas]
    return weights


@needs_mnist
def test_replicas_survive_a_killed_server_with_the_same_weights(tmp_path,
                                                                clean):
    # PS_REPLICAS=1, 3 servers: fault-free the job ends well (each server
    # serves its replica shard: clean); server 1 killed (-9) at a random
    # step, its replica (server 2) takes its keys over and the job ends
    # with the weights of the job never harmed.
    env = {"PS_REPLICAS": "1"}
    want = clean(3, 1)

    harmed = str(tmp_path / "harmed.bin")
    step = random.randint(3, 20)
    job = Job(3, 2, ARGS + ["--dump-weights", harmed], env=env)
    job.kill_at_step("server", 1, step)
    rc, out = job.wait()
    assert weights_of(rc, out, harmed) == want, f"killed at step {step}"
    assert ("the job survived the loss of server 1 (the scheduler said "
            "server 2 took over its keys)") in out, out


@needs_mnist
def test_a_killed_job_restores_from_its_checkpoint_to_the_same_weights(
        tmp_path, clean):
    # Checkpoints every 5 steps; worker 1 killed -9 at a random step stops
    # the job (exit 1); the same command with --restore resumes from the
    # newest complete set and ends with the weights of the job never killed.
    want = clean(2)
    step = random.randint(8, 25)
    args = ARGS + ["--checkpoint-every", "5",
                   "--checkpoint-dir", str(tmp_path / "c"),
                          "--dump-weights", str(tmp_path / "restored.bin")]
    job = Job(2, 2, args)
    job.kill_at_step("worker", 1, step)
    rc, out = job.wait()
    assert rc == 1 and "worker 1" in out.splitlines()[-1], out
    rc, out = run(2, 2, args + ["--restore"])
    m = re.search(r"\[worker 0\] restore: resuming from the checkpoint of "
                  r"step (\d+)", out)
    assert m and 5 <= int(m.group(1)) <= step, out
    assert weights_of(rc, out, str(tmp_path / "restored.bin")) == want, (
        f"killed at step {step}, restored from {m.group(1)}")


@needs_mnist
def test_a_restarted_worker_rejoins_with_the_same_weights(tmp_path, clean):
    # launch.py --max-restarts 1: worker 1 kills itself (-9) between two
    # steps, at a random one; restarted, it asks the servers where to
    # resume and the job ends with the weights of the job never harmed.
    want = clean(2)
    step = random.randint(2, 27)
    path = str(tmp_path / "restarted.bin")
    rc, out = run(2, 2, ARGS + ["--dump-weights", path, "--die-after-steps",
                                str(step), "--die-rank", "1"],
                  launch_args=["--max-restarts", "1"])
    assert f"[worker 1] worker 1 rejoined at step {step}" in out, out
    assert "worker 1 was restarted 1 time" in out, out
    assert weights_of(rc, out, path) == want, f"killed after step {step}"


@needs_mnist
def test_a_worker_killed_from_outside_is_restarted_and_the_job_ends(
        tmp_path):
    # Killed -9 at any moment (maybe within a step), the restarted worker
    # rejoins and the job ends well with all 30 steps; the weights may hold
    # part of the step in flight twice over, so only the end is checked.
    step = random.randint(3, 25)
    job = Job(2, 2, ARGS, launch_args=["--max-restarts", "1"])
    job.kill_at_step("worker", 1, step)
    rc, out = job.wait()
    assert rc == 0, out
    assert re.search(r"\[worker 1\] worker 1 rejoined at step \d+", out), out
    assert '"steps": 30' in out, out


@needs_mnist
def test_a_replica_writes_the_checkpoints_of_the_server_it_replaced(
        tmp_path, clean):
    # PS_REPLICAS=1, 3 servers, checkpoints every 5 steps: server 1 killed
    # -9 at a random step (<= 10), server 2 takes its keys over and writes
    # its files of the later sets; worker 1 killed at step 22 stops the job.
    # A restore with all three servers loads server 1's slice from the file
    # the replica wrote and ends with the weights of the job never harmed.
    env = {"PS_REPLICAS": "1"}
    want = clean(3, 1)
    path = str(tmp_path / "restored.bin")
    args = ARGS + ["--checkpoint-dir", str(tmp_path / "c"),
                   "--checkpoint-every", "5", "--dump-weights", path]
    step = random.randint(3, 10)
    job = Job(3, 2, args, env=env)
    job.kill_at_step("server", 1, step)
    job.kill_at_step("worker", 1, 22)
    rc, harmed = job.wait()
    assert rc == 1, harmed
    rc, out = run(3, 2, args + ["--restore"], env=env)
    m = re.search(r"\[worker 0\] restore: resuming from the checkpoint of "
                  r"step (\d+)", out)
    assert m and int(m.group(1)) in (15, 20), out
    assert (f"server 2: checkpoint of step {m.group(1)} for server 1 "
            "written") in harmed, harmed
    assert weights_of(rc, out, path) == want, (
        f"server 1 killed at step {step}, restored from {m.group(1)}")
