"""The PyTorch trainer (examples/pytorch/mnist_ps.py, ps.dense.serve_dense)
survives what mnist_dist survives (docs/failures.md), each checked by
harming a running job: under BSP with 2 workers each ends with the final
weights of a job never harmed, bit for bit (--dump-weights)."""

import random
import re

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


def clean_weights(tmp_path, extra=()):
    """The final weights of the job never harmed: 2 servers, 2 workers."""
    path = str(tmp_path / "clean.bin")
    rc, out = run(2, 2, ARGS + ["--dump-weights", path] + list(extra))
    return weights_of(rc, out, path)


@needs_mnist
def test_a_killed_job_restores_from_its_checkpoint_to_the_same_weights(
        tmp_path):
    # Checkpoints every 5 steps; worker 1 killed -9 at a random step stops
    # the job (exit 1); the same command with --restore resumes from the
    # newest complete set and ends with the weights of the job never killed.
    ckpt = ["--checkpoint-every", "5"]
    want = clean_weights(tmp_path,
                         ckpt + ["--checkpoint-dir", str(tmp_path / "c0")])
    step = random.randint(8, 25)
    args = ARGS + ckpt + ["--checkpoint-dir", str(tmp_path / "c1"),
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
def test_a_restarted_worker_rejoins_with_the_same_weights(tmp_path):
    # launch.py --max-restarts 1: worker 1 kills itself (-9) between two
    # steps, at a random one; restarted, it asks the servers where to
    # resume and the job ends with the weights of the job never harmed.
    want = clean_weights(tmp_path)
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
        tmp_path):
    # PS_REPLICAS=1, 3 servers, checkpoints every 5 steps: server 1 killed
    # -9 at a random step (<= 10), server 2 takes its keys over and writes
    # its files of the later sets; worker 1 killed at step 22 stops the job.
    # A restore with all three servers loads server 1's slice from the file
    # the replica wrote and ends with the weights of the job never harmed.
    env = {"PS_REPLICAS": "1"}
    clean = str(tmp_path / "clean.bin")
    rc, out = run(3, 2, ARGS + ["--dump-weights", clean], env=env)
    want = weights_of(rc, out, clean)
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
