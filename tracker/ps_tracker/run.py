"""launch.py's main: parses the command line, makes the job's key, runs
the job with the chosen launcher and names how it ended."""

import os
import secrets
import signal
import socket
import sys
import time

from .cli import parse_args
from .reports import describe_losses, describe_restarts
from .common import (EXIT_FAILED, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE,
                     INSECURE_NOTE, OutputMux, plural, usage_error)
from .keys import JobKey, KeyMemfd, make_key
from .local import LocalJob
from .mpi import MpiJob
from .rank import as_rank
from .slurm import SlurmJob
from .ssh import SshJob

JOBS = {"local": LocalJob, "ssh": SshJob, "mpi": MpiJob, "slurm": SlurmJob}


def free_port(host):
    """A port that was free on host a moment ago (bind to 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def run(args):
    mux = OutputMux()
    try:
        port = args.port or free_port(args.host)
    except OSError as err:
        usage_error(f"cannot bind a port on --host {args.host}: {err}")
    job = JOBS[args.launcher](args, mux)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, job.on_signal)
    if args.insecure:
        mux.say(INSECURE_NOTE)
        # No key proves who belongs to the job: a random token, given to
        # each process (PS_JOB_TOKEN), keeps other jobs' nodes out.
        args.job_token = secrets.token_hex(16)
        return run_job(args, job, port)
    if args.key_file is not None:
        job.key_path = os.path.abspath(args.key_file)
        return run_job(args, job, port)
    if args.launcher in ("local", "ssh"):
        # Never on disk: local processes inherit the memfd, ssh sessions
        # get its line on their stdin.
        try:
            job.key_memfd = KeyMemfd()
        except OSError as err:
            mux.say(f"cannot make the job's key: {err}")
            return EXIT_FAILED
        try:
            return run_job(args, job, port)
        finally:
            job.key_memfd.close()
    # mpi, slurm: the processes on other hosts read the key file by its
    # path, so it goes where the hosts share files: the working directory.
    try:
        key = JobKey(parent=os.getcwd())
    except OSError as err:
        mux.say(f"cannot write the job's key file: {err}")
        return EXIT_FAILED
    try:
        job.key_path = key.path
        return run_job(args, job, port)
    finally:
        key.remove()


def run_job(args, job, port):
    mux = job.mux
    start = time.monotonic()
    if not job.start(port):
        return EXIT_USAGE
    deadline = None if args.timeout is None else start + args.timeout
    outcome, failed, returncode = job.wait(deadline)
    others = job.running()
    if outcome != "done":
        job.stop(job.children)
    job.drain_output()
    if outcome == "done":
        elapsed = time.monotonic() - start
        if job.tolerated:
            losses = describe_losses(job.tolerated, job.survived)
            line = (f"{plural(job.total - len(job.tolerated), 'process')} "
                    f"exited 0 in {elapsed:.1f} s; {losses}")
        else:
            line = (f"all {plural(job.total, 'process')} exited 0 in "
                    f"{elapsed:.1f} s")
        restarts = describe_restarts(job.children, job.max_restarts)
        mux.say(line + (f"; {restarts}" if restarts else ""))
        return EXIT_OK
    if outcome == "failed":
        said = job.last_words(failed)
        if said is not None:
            mux.say(f"{said[0].label} said last: {said[1]}")
        mux.say(job.describe_failure(failed, returncode, others))
        return EXIT_FAILED
    names = job.describe_running(others)
    if outcome == "timeout":
        mux.say(f"timeout after {args.timeout:g} s; killed "
                f"{len(others)} still running: {names}")
        return EXIT_TIMEOUT
    signame = signal.Signals(job.signal_received).name
    mux.say(f"got {signame}; stopped {len(others)} still running: {names}")
    return 128 + job.signal_received


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--as-rank"]:
        return as_rank(argv[1:])
    args = parse_args(argv)
    if args.make_key is not None:
        return make_key(args.make_key)
    return run(args)
