"""What the Python path does not support, or a job's settings contradict,
is refused at start, naming the option and its value: mnist_ps.py's flags
before ps.start() (exit 2, or 1 for an unusable checkpoint folder, in every
role), and a DenseServer without the replica PS_REPLICAS=1 asks for, or
with on_worker_failure='stop' under PS_MAX_RESTARTS, and a Python handler
KVServer under PS_REPLICAS=1 (ValueError); a DenseServer or serve_dense
with a bad learning-rate schedule (ValueError, before ps.start() too). The
DenseServer options a job without those settings refuses are in
test_errors.py."""

import os
import re

from pytorch_jobs import ARGS, SCRIPT, needs_mnist, run


def test_checkpoint_flags_that_contradict_are_refused_by_name(run_script,
                                                               tmp_path):
    for args, says in (
            (["--checkpoint-dir", str(tmp_path), "--checkpoint-every", "5",
              "--consistency", "async"],
             "--checkpoint-dir needs --consistency bsp (checkpoints are "
             "taken at step boundaries every node agrees on), got "
             "--consistency async"),
            (["--checkpoint-dir", str(tmp_path)],
             "--checkpoint-dir needs --checkpoint-every N > 0"),
            (["--restore"], "--checkpoint-every and --restore need "
             "--checkpoint-dir")):
        r = run_script(SCRIPT, args)
        assert r.returncode == 2, (args, r.stdout)
        assert says in r.stdout, (args, r.stdout)


@needs_mnist
def test_a_restore_without_a_checkpoint_stops_every_role_before_start(
        tmp_path):
    empty = str(tmp_path / "none")
    rc, out = run(1, 1, ARGS + ["--checkpoint-dir", empty,
                                "--checkpoint-every", "5", "--restore"],
                  timeout=60)
    assert rc == 1, out
    for who in ("scheduler", "server 0", "worker 0"):  # each before start
        assert (f"[{who}] mnist_ps: --checkpoint-dir: Not found: no "
                f"checkpoint in '{empty}'") in out, out
    assert not re.search(r": pid \d+$", out, re.M), out
    assert os.stat(empty).st_mode & 0o777 == 0o700


def test_dense_server_without_what_the_job_asks_for_is_refused(run_job):
    r = run_job("job_dense_options.py", 2, 1, env={"PS_REPLICAS": "1"},
                timeout=60)
    assert r.returncode == 0, r.stdout
    assert ("server: no replica: ValueError: DenseServer: PS_REPLICAS=1: "
            "this server also holds server ") in r.stdout, r.stdout
    assert "pass replica_first_key, replica_end_key and replica_weights" in (
        r.stdout), r.stdout
    assert ("server: KVServer: ValueError: KVServer: PS_REPLICAS=1 is not "
            "supported by a Python handler server") in r.stdout, r.stdout
    r = run_job("job_dense_options.py", 1, 1, timeout=60,
                launch_args=["--max-restarts", "1"])
    assert r.returncode == 0, r.stdout
    assert ("server: stop: ValueError: DenseServer: on_worker_failure='stop' "
            "contradicts PS_MAX_RESTARTS=1") in r.stdout, r.stdout
    assert "server: KVServer: no error" in r.stdout, r.stdout


def test_a_bad_lr_schedule_is_refused_by_name(run_job):
    r = run_job("job_dense_options.py", 1, 1, ["schedule"], timeout=60)
    assert r.returncode == 0, r.stdout
    for label, says in (
            ("before start", "total_steps=0 is not >= 1 (lr_schedule="
             "'onecycle' spans them)"),
            ("lr_schedule", "lr_schedule='cosine' is not 'step' or "
             "'onecycle'"),
            ("total_steps", "total_steps=0 is not >= 1"),
            ("warmup_steps", "warmup_steps=10 is not in [0, "
             "total_steps=10)"),
            ("step with total_steps", "total_steps=10 warmup_steps=0 are "
             "for lr_schedule='onecycle', not 'step'"),
            ("onecycle with lr_step", "lr_step=2 lr_gamma=1.000000 are for "
             "lr_schedule='step', not 'onecycle'")):
        assert (f"server: {label}: ValueError: DenseServer: {says}"
                in r.stdout), (label, r.stdout)
