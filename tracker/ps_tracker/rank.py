"""launch.py --as-rank -- PROGRAM ARGS: the shim that mpirun and srun run
for each process of an mpi or slurm job. It takes the process's role from
its rank, tags its output, and says how the program failed."""

import os
import signal
import socket
import subprocess
import sys

from .common import (EXIT_OK, EXIT_USAGE, OutputMux, describe_exit,
                     die_with_parent)


def is_loopback(host):
    return host == "localhost" or host.startswith("127.")


def as_rank(argv):
    """launch.py --as-rank -- PROGRAM ARGS: one process of an mpi or slurm
    job, started by mpirun or srun.

    Its role comes from its rank (OMPI_COMM_WORLD_RANK or SLURM_PROCID):
    0 the scheduler, 1..S the servers, S+1..S+W the workers. It runs
    PROGRAM with DMLC_ROLE, PS_RANK and DMLC_NODE_HOST set, tags each of
    its output lines "[worker 0 @host] ", passes on the signals it gets,
    says on stderr how the program failed, and exits as the program did.
    """
    def fail(message):
        print(f"launch --as-rank: {message}", file=sys.stderr)
        return EXIT_USAGE
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        return fail("missing PROGRAM after --")
    for rank_var, size_var in (
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
            ("SLURM_PROCID", "SLURM_NTASKS")):
        if rank_var in os.environ:
            break
    else:
        return fail("neither OMPI_COMM_WORLD_RANK (mpirun) nor SLURM_PROCID "
                    "(srun) is set: --as-rank is what --launcher mpi or slurm "
                    "runs")
    numbers = {}
    for var in (rank_var, size_var, "DMLC_NUM_SERVER", "DMLC_NUM_WORKER"):
        value = os.environ.get(var, "")
        if not value.isdigit():
            return fail(f"{var}='{value}' is not a non-negative integer")
        numbers[var] = int(value)
    rank, size = numbers[rank_var], numbers[size_var]
    servers, workers = numbers["DMLC_NUM_SERVER"], numbers["DMLC_NUM_WORKER"]
    # --worker-customers K: W/K worker processes.
    processes = os.environ.get("PS_LAUNCH_WORKER_PROCESSES", str(workers))
    if not processes.isdigit():
        return fail(f"PS_LAUNCH_WORKER_PROCESSES='{processes}' is not a "
                    "non-negative integer")
    workers = int(processes)
    if size != 1 + servers + workers:
        return fail(f"{size_var}={size}, but the job has 1 + {servers} + "
                    f"{workers} = {1 + servers + workers} processes")
    env = dict(os.environ)
    env.pop("PS_RANK", None)
    if rank == 0:
        role, name = "scheduler", "scheduler"
    elif rank <= servers:
        role, name = "server", f"server {rank - 1}"
        env["PS_RANK"] = str(rank - 1)
    else:
        role, name = "worker", f"worker {rank - 1 - servers}"
        env["PS_RANK"] = str(rank - 1 - servers)
    env["DMLC_ROLE"] = role
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    expected = os.environ.get("PS_LAUNCH_SCHEDULER_NODE")
    if role == "scheduler" and expected and expected != host:
        return fail(f"the scheduler (rank 0) runs on {host}, not on "
                    f"{expected} where the others look for it")
    key = os.environ.get("PS_KEY_FILE")
    if key is not None and not os.access(key, os.R_OK):
        return fail(f"{name} cannot read PS_KEY_FILE '{key}' on {host}: with "
                    "--launcher mpi or slurm the key file must be on a "
                    "filesystem every host shares")
    if "DMLC_NODE_HOST" not in env and "DMLC_INTERFACE" not in env:
        env["DMLC_NODE_HOST"] = node_address(role, host, env)
    return run_rank(argv, env, name, host)


def node_address(role, host, env):
    """The address the other processes reach this one at."""
    root = env.get("DMLC_PS_ROOT_URI", "127.0.0.1")
    if role == "scheduler":
        return root
    addrs = dict(item.split("=", 1)
                 for item in env.get("PS_LAUNCH_NODE_ADDRS", "").split(",")
                 if "=" in item)
    if host in addrs:
        return addrs[host]
    return "127.0.0.1" if is_loopback(root) else host


def run_rank(argv, env, name, host):
    """Runs the program of one rank; see as_rank."""
    try:  # SIGKILL when the shim dies.
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE,
                                preexec_fn=die_with_parent())
    except OSError as err:
        print(f"launch --as-rank: cannot start {name} on {host}: {err}",
              file=sys.stderr)
        return EXIT_USAGE

    def forward(signum, frame):
        proc.send_signal(signum)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                   signal.SIGCONT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    mux = OutputMux()
    prefix = f"[{name} @{host}] "
    readers = [mux.start_reader(proc.stdout, prefix, sys.stdout),
               mux.start_reader(proc.stderr, prefix, sys.stderr)]
    returncode = proc.wait()
    for reader in readers:
        reader.join()
    if returncode == 0:
        return EXIT_OK
    mux.say(f"{name} (pid {proc.pid}) on {host} {describe_exit(returncode)}")
    if returncode > 0:
        return returncode
    try:  # Die as the program did (SIGKILL has no handler to reset).
        signal.signal(-returncode, signal.SIG_DFL)
    except (OSError, ValueError):
        pass
    os.kill(os.getpid(), -returncode)
    return 128 - returncode
