"""The command line: launch.py's flags, their checks and its --help."""

import argparse
import os
import shutil
import stat
import sys

from .common import LAUNCHERS, usage_error
from .env import RESERVED_ENV
from .keys import check_user_key_file
from .ssh import read_hostfile

DESCRIPTION = """\
Launches a ps job: one scheduler, S servers and W workers, all running the
same PROGRAM [ARGS...], on this machine or (--launcher, below) on other
hosts. Each process learns its role from its environment, which (local)
is the launcher's own plus:

  DMLC_ROLE          scheduler | server | worker
  DMLC_PS_ROOT_URI   the scheduler's host (--host)
  DMLC_PS_ROOT_PORT  the scheduler's port (--port, or a free one)
  DMLC_NUM_SERVER    S
  DMLC_NUM_WORKER    W (worker customers with --worker-customers K: W/K
                     worker processes run)
  DMLC_NODE_HOST     127.0.0.1 (a --env may override it)
  PS_RANK            i for the i-th server and the i-th worker (0-based);
                     not set for the scheduler
  PS_KEY_FD          the descriptor, inherited, of the job's secret key
                     (below); not set with --insecure or --key-file
  PS_KEY_FILE        with --key-file FILE: FILE's absolute path
  PS_JOB_TOKEN       with --insecure: a random token of this job (below)
  PS_MAX_RESTARTS    N with --max-restarts N > 0 (below); else not set
  PS_RESTART_COUNT   k in a process's k-th restart (below); not set in its
                     first run
  PS_METRICS_PORT    0 with --metrics DIR: each node serves Prometheus
                     metrics on a free port of its DMLC_NODE_HOST, which
                     DIR/targets.json names
  PS_METRICS_TOKEN_FILE  with --metrics-token-file FILE: FILE's absolute
                     path (a scrape must send its token)
  OMP_WAIT_POLICY    PASSIVE, unless already set: all processes share this
                     machine's cores, and OpenMP threads that spin while
                     idle (the default) take them from the other processes
  KEY=VALUE          for every --env KEY=VALUE

Every line a process writes to stdout or stderr is copied to the launcher's
stdout or stderr with a prefix: "[scheduler] ", "[server 0] ", "[worker 1] ".
The processes start in their own process groups. When one exits non-zero
or is killed by a signal, the launcher stops the rest (SIGCONT and SIGTERM
to each group, SIGKILL after --grace seconds) and names the cause on its
last line: the first process that a node's output reported as
"<name> (tcp://...) was declared dead: <why>" (with the reason and the
reporter; it may be a frozen process, still running until killed), waiting
up to 2 s after the first non-zero exit for such a line; else the first
process that exited non-zero. SIGINT, SIGTERM or SIGHUP to the launcher
stops them likewise. With --tolerate ROLE (server or worker), a process of
that role that exits non-zero or is killed only gets a line saying so; the
others run on, and the job's exit status is theirs: for jobs that survive
it (--on_worker_failure continue for workers, say).

The job also says itself what it survives (local and ssh): its scheduler
writes "ps-event: {JSON}" lines (docs/architecture.md), one when it starts
(with the job's PS_REPLICAS) and one for each node it declares dead. A
server that fails in a job with replicas (mnist_dist --replicas 1) is let
go like a tolerated one once the scheduler has said that its replica took
its keys over; the launcher waits for that up to the job's heartbeat
timeout plus 2 s, and stops the job if the scheduler says otherwise or
nothing. A process that the scheduler declared dead and that the job goes
on without (tolerated, taken over, or awaited back by --max-restarts) is
killed by the launcher (SIGKILL; over ssh, its session ends): a frozen
one would never exit.

Restarts (--max-restarts N, local and ssh): a worker or the scheduler that
exits non-zero or is killed by a signal is started again at once, up to N
times per process (the scheduler at the same address), with the same role,
rank, key and environment plus PS_RESTART_COUNT=k (1 in its first restart,
2 in its second...); its output keeps its tag, and a line says "worker 1
(pid 42) was killed by signal SIGKILL; restarting it (1 of 2,
--max-restarts 2)". What the dead process left in its process group
(local) is killed first. Every process of the job gets PS_MAX_RESTARTS=N:
the nodes then wait for a restarted worker (the scheduler takes it back
under its rank) or scheduler (the members report themselves to it and it
takes the job over) instead of failing. A server that fails stops the job
as above (unless taken over, or --tolerate server), and so does a worker
or scheduler whose N restarts are spent (or --tolerate worker), the last
line saying "(after N restarts, --max-restarts N)". A restarted process is
never named as "declared dead" on that line: the launcher cannot tell a
report about its dead run, which may come late, from one about its new
run. The last line of a job that succeeded says which processes were
restarted and how many times.

Keys: by default each job gets a new secret key, 32 bytes from
os.urandom written in Z85 as one line in a sealed memfd: memory, on no
filesystem, that each process inherits as the descriptor PS_KEY_FD names
(never a command line; the node reads it once and closes it). A node must
prove it to connect, and every frame is sealed with keys that come from
it, so only the job's processes can join the job or read its traffic.
The launcher keeps the memfd for restarts; nothing of the key is on disk,
and it is gone with the job even if the launcher is killed (its processes
get SIGKILL when it dies). mpi and slurm write a key file instead (below).
--key-file FILE uses an existing key file instead (PS_KEY_FILE);
--insecure runs the job without a key (PS_KEY_FILE and PS_KEY_FD are
removed from the processes' environment) but with a random token of its
own (PS_JOB_TOKEN), which the scheduler asks of every registration, so
that the nodes of two jobs never mix (it is no protection against an
attacker on the network: traffic is plain TCP). For nodes started by hand,
"launch.py --make-key FILE" writes a new key file (0600) to give each of
them as PS_KEY_FILE=FILE.

launchers (--launcher):
  local  the default: every process a child of the launcher, as above.
  ssh    one ssh session per process to the hosts of -H FILE (lines
         "HOST [slots=N]", Open MPI's format): the scheduler on the first
         host (or --scheduler-host), which is DMLC_PS_ROOT_URI; then the
         servers, then the workers, one a slot, cyclically. A session
         gets no environment of the launcher's but, explicitly, DMLC_ROLE,
         DMLC_PS_ROOT_URI/PORT, DMLC_NUM_SERVER/WORKER, PS_RANK,
         PS_MAX_RESTARTS, PS_RESTART_COUNT and PS_METRICS_PORT (as above),
         DMLC_NODE_HOST (its host as the hostfile names it, unless --env
         sets it or DMLC_INTERFACE), OMP_WAIT_POLICY, the launcher's
         DMLC_* and PS_* variables and every --env. The key's one line
         goes through the session's stdin to the remote shell, which
         hands it to the program through a pipe (PS_KEY_FD=4): no file,
         no command line. The program (an absolute path, the same on
         every host) runs in the launcher's directory where that exists,
         in a process group of its own (by /bin/sh; the hosts' login
         shell must take sh syntax); when the session's stdin ends
         (the launcher stops the job, or dies) that group gets SIGTERM,
         and SIGKILL --grace seconds later. Lines are tagged
         "[worker 1 @HOST] ". ssh options (port, identity, known hosts):
         ~/.ssh/config or --launcher-arg.
  mpi    one mpirun starts all 1+S+W processes (-H FILE becomes its
         --hostfile), each as "launch.py --as-rank -- PROGRAM ARGS": rank
         0 is the scheduler, ranks 1..S the servers, S+1..S+W the workers
         (OMPI_COMM_WORLD_RANK; no MPI library is linked). The scheduler's
         host is the hostfile's first (127.0.0.1 without one); the
         settings above reach each rank through mpirun's -x. mpirun
         stops the job when one process fails. A new key is a file
         (PS_KEY_FILE, 0600) in a private directory under the working
         directory, which every host must share; the launcher removes
         it when it exits, and a process it leaves behind does so if the
         launcher is killed.
  slurm  inside an allocation (salloc, sbatch): one srun
         --kill-on-bad-exit=1 starts all 1+S+W processes likewise, roles
         from SLURM_PROCID; the scheduler runs on the allocation's first
         node, at that node's NodeAddr (scontrol). The allocation needs
         1+S+W tasks.
  With mpi and slurm every process reads the job's key file by its path:
  a new key goes in a private directory under the working directory,
  which must be on a filesystem the hosts share (or --key-file on one).
  In both, each line is tagged "[worker 1 @HOST] " by --as-rank, which
  also says which process failed first; the launcher names it.
  --launcher-arg ARG passes ARG to ssh, mpirun or srun. --port defaults
  to a port free on this machine, a guess for another scheduler host.
"""

EPILOG = """\
exit status:
  0    every process exited 0
  1    a process exited non-zero or was killed by a signal (a worker or
       the scheduler: once its --max-restarts are spent)
  2    usage error (bad flags, PROGRAM missing, not found or not executable,
       a --key-file that is missing or not a key, a --make-key FILE that
       exists, a bad hostfile, a flag of another launcher, no ssh, mpirun
       or srun, --launcher slurm outside an allocation)
  124  --timeout expired; the processes still running were killed
  130/143  the launcher got SIGINT/SIGTERM and stopped the processes

examples:
  python3 tracker/launch.py -s 2 -w 2 -- build/bench/kv/kv_bench --iters 10
  python3 tracker/launch.py --launcher ssh -H hosts -s 2 -w 4 -- ./prog
  python3 tracker/launch.py --launcher mpi -H hosts -s 2 -w 4 -- ./prog
  salloc -n 7 python3 tracker/launch.py --launcher slurm -s 2 -w 4 -- ./prog
  python3 tracker/launch.py --make-key job.key
"""


def resolve_program(program):
    """The program's path, or exits 2 naming why it cannot be run."""
    if os.sep in program:
        path = program
        if not os.path.exists(path):
            usage_error(f"program '{program}' not found")
    else:
        path = shutil.which(program)
        if path is None:
            usage_error(f"program '{program}' not found on PATH")
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        usage_error(f"program '{program}' is not an executable file")
    return path


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="launch.py",
        usage="%(prog)s -s S -w W [options] -- PROGRAM [ARGS...]",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-s", "--num-servers", type=int, metavar="S",
                        help="number of servers (>= 1); required")
    parser.add_argument("-w", "--num-workers", type=int, metavar="W",
                        help="number of workers (>= 1); required")
    parser.add_argument("--worker-customers", type=int, default=1,
                        metavar="K",
                        help="each worker process starts K worker customers "
                        "(ps::Start(c) in K threads, ps-lite's multi-worker "
                        "form), each a worker of the job: W counts them and "
                        "W/K worker processes run, as ps-lite's "
                        "local_multi_workers.sh does (default: %(default)s)")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="local",
                        help="how the processes are started (default: "
                        "%(default)s; see 'launchers' below)")
    parser.add_argument("-H", "--hostfile", metavar="FILE",
                        help="ssh (required) and mpi: the hosts, one a line: "
                        "HOST [slots=N]")
    parser.add_argument("--scheduler-host", metavar="HOST",
                        help="ssh: where the scheduler runs, its "
                        "DMLC_PS_ROOT_URI (default: the hostfile's first "
                        "host)")
    parser.add_argument("--launcher-arg", action="append", default=[],
                        metavar="ARG",
                        help="ssh, mpi, slurm: an argument for ssh, mpirun "
                        "or srun, before the command (repeatable; write "
                        "--launcher-arg=-oPort=2222 for one that starts "
                        "with '-')")
    parser.add_argument("--host", default=None,
                        help="local: the scheduler host, DMLC_PS_ROOT_URI "
                        "(default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0,
                        help="scheduler port, DMLC_PS_ROOT_PORT (default: a "
                        "port free on this machine a moment before, found "
                        "by binding port 0)")
    parser.add_argument("--env", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="extra environment for every process "
                        "(repeatable)")
    parser.add_argument("--grace", type=float, default=3.0, metavar="SECONDS",
                        help="time between SIGTERM and SIGKILL when stopping "
                        "processes (default: %(default)s)")
    parser.add_argument("--tolerate", action="append", default=[],
                        choices=("server", "worker"), metavar="ROLE",
                        help="a process of this role (server or worker) "
                        "that fails does not stop the job: for jobs that "
                        "survive it, e.g. workers with --on_worker_failure "
                        "continue (a server whose replica took it over "
                        "needs none; repeatable)")
    parser.add_argument("--keep-declared-dead", action="store_true",
                        help="test: leave a process that the job declared "
                        "dead and goes on without running (a frozen one, "
                        "let go on, must find itself fenced and exit on "
                        "its own) instead of killing it")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="local, ssh: restart a worker or the scheduler "
                        "that exits non-zero or is killed, up to N times per "
                        "process, with its rank and environment plus "
                        "PS_RESTART_COUNT; "
                        "every process gets PS_MAX_RESTARTS=N (default: "
                        "%(default)s, no restart)")
    parser.add_argument("--metrics", metavar="DIR",
                        help="local, ssh: every node serves Prometheus "
                        "metrics on a port of its own (PS_METRICS_PORT=0); "
                        "DIR/targets.json lists them for Prometheus's "
                        "file_sd_configs, with labels role and rank, and is "
                        "rewritten when a node is restarted")
    parser.add_argument("--metrics-token-file", metavar="FILE",
                        help="with --metrics: every node answers a scrape "
                        "only with the bearer token of FILE's first line "
                        "(PS_METRICS_TOKEN_FILE=FILE's absolute path; over "
                        "ssh the path must hold it on every host); give "
                        "Prometheus the same file as credentials_file")
    parser.add_argument("--timeout", type=float, default=None,
                        metavar="SECONDS",
                        help="bound on the whole job; on expiry kill all and "
                        "exit 124 (default: none)")
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument("--key-file", metavar="FILE",
                      help="use this job key file (first line: a "
                      "40-character Z85 secret key) instead of a new key "
                      "per job; its path is given as PS_KEY_FILE")
    keys.add_argument("--insecure", action="store_true",
                      help="no key: traffic is neither authenticated nor "
                      "encrypted; PS_KEY_FILE and PS_KEY_FD are removed "
                      "from the processes' environment and a random "
                      "PS_JOB_TOKEN "
                      "keeps other jobs' nodes out")
    keys.add_argument("--make-key", metavar="FILE",
                      help="write a new key file (mode 0600; never over an "
                      "existing file) for nodes started by hand, and exit")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        metavar="-- PROGRAM [ARGS...]",
                        help="the program every process runs, and its "
                        "arguments")
    args = parser.parse_args(argv)

    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if args.make_key is not None:
        if (args.command or args.num_servers is not None
                or args.num_workers is not None):
            usage_error("--make-key FILE takes no job (-s, -w, PROGRAM)")
        return args
    if args.num_servers is None:
        usage_error("-s/--num-servers is required")
    if args.num_workers is None:
        usage_error("-w/--num-workers is required")
    if args.num_servers < 1:  # Every node refuses DMLC_NUM_SERVER=0.
        usage_error(f"-s/--num-servers must be >= 1, got {args.num_servers}: "
                    "a job needs a server")
    if args.num_workers < 1:
        usage_error(f"-w/--num-workers must be >= 1, got {args.num_workers}")
    if args.worker_customers < 1:
        usage_error("--worker-customers must be >= 1, got "
                    f"{args.worker_customers}")
    if args.num_workers % args.worker_customers != 0:
        usage_error(f"-w/--num-workers {args.num_workers} is not a multiple "
                    f"of --worker-customers {args.worker_customers}: each "
                    "worker process starts that many worker customers")
    if args.worker_customers > 1 and args.max_restarts > 0:
        usage_error("--max-restarts is not offered with --worker-customers: "
                    "a restarted process would not find its customers' "
                    "ranks again")
    if args.metrics is not None:
        if args.launcher not in ("local", "ssh"):
            usage_error("--metrics is offered with --launcher local or ssh")
        if args.worker_customers > 1:
            usage_error("--metrics is not offered with --worker-customers: "
                        "a process's customers would share one target")
        args.metrics = os.path.abspath(args.metrics)
    if args.metrics_token_file is not None:
        if args.metrics is None:
            usage_error("--metrics-token-file needs --metrics DIR")
        check_token_file(args.metrics_token_file)
        args.metrics_token_file = os.path.abspath(args.metrics_token_file)
    # The worker processes to launch; DMLC_NUM_WORKER stays W.
    args.worker_processes = args.num_workers // args.worker_customers
    if not 0 <= args.port <= 65535:
        usage_error(f"--port must be in [0, 65535], got {args.port}")
    if args.grace < 0:
        usage_error(f"--grace must be >= 0, got {args.grace}")
    if args.timeout is not None and args.timeout <= 0:
        usage_error(f"--timeout must be > 0, got {args.timeout}")
    if args.max_restarts < 0:
        usage_error(f"--max-restarts must be >= 0, got {args.max_restarts}")
    if not args.command:
        usage_error("missing PROGRAM after --")
    args.extra_env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            usage_error(f"--env expects KEY=VALUE, got '{item}'")
        if key in RESERVED_ENV:
            usage_error(f"--env cannot set {key}; the launcher sets it")
        if key == "PS_METRICS_TOKEN_FILE" and args.metrics_token_file:
            usage_error("--env PS_METRICS_TOKEN_FILE and --metrics-token-file "
                        "both name the token file; give one")
        args.extra_env[key] = value
    if args.key_file is not None:
        check_user_key_file(args.key_file)
    check_launcher_args(args)
    args.command[0] = resolve_program(args.command[0])
    if args.launcher != "local":  # Other hosts run it from anywhere.
        args.command[0] = os.path.abspath(args.command[0])
    return args


def check_token_file(path):
    """Exits 2 unless path is a small regular file (the node checks its
    token: src/metrics/token_file.h); warns if others may read it."""
    flag = f"--metrics-token-file '{path}'"
    try:
        st = os.stat(path)
    except OSError as err:
        usage_error(f"{flag}: {err.strerror}")
    if not stat.S_ISREG(st.st_mode):
        usage_error(f"{flag} is not a regular file")
    if st.st_size > 4096:
        usage_error(f"{flag} is {st.st_size} bytes, more than a token "
                    "file's 4096")
    if stat.S_IMODE(st.st_mode) & 0o077:
        print(f"launch: warning: {flag} is open to group/others (mode "
              f"{stat.S_IMODE(st.st_mode):04o}); chmod 600 it",
              file=sys.stderr)


def check_launcher_args(args):
    """Exits 2 on a flag the launcher does not take or a missing tool."""
    launcher = args.launcher
    if args.host is not None and launcher != "local":
        usage_error(f"--host is for --launcher local; --launcher {launcher} "
                    "places the scheduler itself"
                    + (" (or --scheduler-host)" if launcher == "ssh" else ""))
    if args.host is None:
        args.host = "127.0.0.1"
    if args.hostfile is not None and launcher not in ("ssh", "mpi"):
        usage_error(f"-H/--hostfile is for --launcher ssh or mpi, not "
                    f"{launcher}")
    if args.scheduler_host is not None and launcher != "ssh":
        usage_error(f"--scheduler-host is for --launcher ssh, not {launcher}")
    for flag, used in (("--tolerate", args.tolerate),
                       ("--max-restarts", args.max_restarts > 0)):
        if used and launcher in ("mpi", "slurm"):
            usage_error(f"{flag} is for --launcher local or ssh: "
                        f"{'mpirun' if launcher == 'mpi' else 'srun'} stops "
                        "the job when a process fails")
    if args.launcher_arg and launcher == "local":
        usage_error("--launcher-arg is for --launcher ssh, mpi or slurm")
    args.hosts = None
    if launcher == "ssh":
        if args.hostfile is None:
            usage_error("--launcher ssh needs -H/--hostfile FILE")
        args.hosts = read_hostfile(args.hostfile)
        if args.scheduler_host is None:
            args.scheduler_host = args.hosts[0][0]
    elif launcher == "mpi" and args.hostfile is not None:
        args.hosts = read_hostfile(args.hostfile)
    elif launcher == "slurm" and not os.environ.get("SLURM_JOB_ID"):
        usage_error("--launcher slurm runs inside a Slurm allocation (salloc "
                    "or sbatch): SLURM_JOB_ID is not set")
    tool = {"ssh": "ssh", "mpi": "mpirun", "slurm": "srun"}.get(launcher)
    if tool is not None and shutil.which(tool) is None:
        usage_error(f"--launcher {launcher} needs '{tool}', which is not on "
                    "PATH")
