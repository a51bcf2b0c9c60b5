#!/usr/bin/env python3
"""Launches a ps job: one scheduler, S servers, W workers.

Every process runs the same PROGRAM ARGS; its role comes from the
environment (ps-lite style). The processes run on this machine (local), on
the hosts of a hostfile (ssh), under one mpirun (mpi) or one srun in a Slurm
allocation (slurm). Output lines are prefixed with the role and rank; the
first process to fail stops the others. Standard library only.
"""

import argparse
import os
import queue
import re
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124

# Variables the launcher sets per process; --env may not override them.
RESERVED_ENV = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
                "DMLC_NUM_SERVER", "DMLC_NUM_WORKER", "PS_RANK", "PS_KEY_FILE",
                "PS_MAX_RESTARTS", "PS_RESTART_COUNT")

# Of those, the ones a process never inherits from the launcher: set only
# where the launcher means them (--max-restarts; a restarted worker).
RESTART_ENV = ("PS_MAX_RESTARTS", "PS_RESTART_COUNT")

# ZeroMQ's Z85 (RFC 32): 4 bytes, big-endian, as 5 base-85 digits.
Z85_ALPHABET = ("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                ".-:+=^!/*?&<>()[]{}@%$#")
_Z85_DIGIT = {ch: i for i, ch in enumerate(Z85_ALPHABET)}

# A CurveZMQ secret key: 32 bytes, 40 Z85 characters.
KEY_BYTES = 32
KEY_CHARS = KEY_BYTES * 5 // 4

INSECURE_NOTE = "--insecure: traffic is neither authenticated nor encrypted"

# How often the main loop wakes to notice a signal or the deadline.
POLL_SECONDS = 0.05

# What a node logs when it learns that a node failed; the scheduler logs it
# too for a node that stopped without Finalize.
DECLARED_DEAD = re.compile(
    rb"\b(scheduler|server \d+|worker \d+) \(tcp://[^)]*\) "
    rb"was declared dead: (.*)")

# What "launch.py --as-rank" (the mpi and slurm launchers' per-process
# shim) writes when its program fails: the launcher names the first one.
RANK_EXIT = re.compile(
    rb"launch: (scheduler|server \d+|worker \d+) \(pid \d+\) on (\S+) "
    rb"(exited with code \d+|was killed by signal \w+)$")

# The tag a shim puts before each line of its program: "[server 0 @host] ".
RANK_TAG = re.compile(rb"^\[(scheduler|server \d+|worker \d+)(?: @\S+)?\] ")

LAUNCHERS = ("local", "ssh", "mpi", "slurm")

# Variables a launcher gives remote processes besides its own: the job's
# settings from the launcher's environment (PS_VERBOSE, PS_*_TIMEOUT_MS, ...).
FORWARDED_PREFIXES = ("DMLC_", "PS_")

# ssh: how long past --grace to wait for the remote processes to stop after
# their ssh sessions were told to, before the local ssh clients are killed.
REMOTE_STOP_SLACK = 5.0

# After the first non-zero exit, how long to wait for a "declared dead"
# line before naming the cause: healthy nodes that lost a frozen peer may
# exit before the line that names it has been read.
DEAD_REPORT_GRACE = 2.0

DESCRIPTION = """\
Launches a ps job: one scheduler, S servers and W workers, all running the
same PROGRAM [ARGS...], on this machine or (--launcher, below) on other
hosts. Each process learns its role from its environment, which (local)
is the launcher's own plus:

  DMLC_ROLE          scheduler | server | worker
  DMLC_PS_ROOT_URI   the scheduler's host (--host)
  DMLC_PS_ROOT_PORT  the scheduler's port (--port, or a free one)
  DMLC_NUM_SERVER    S
  DMLC_NUM_WORKER    W
  DMLC_NODE_HOST     127.0.0.1 (a --env may override it)
  PS_RANK            i for the i-th server and the i-th worker (0-based);
                     not set for the scheduler
  PS_KEY_FILE        the job's CurveZMQ key file (below); not set with
                     --insecure
  PS_MAX_RESTARTS    N with --max-restarts N > 0 (below); else not set
  PS_RESTART_COUNT   k in a process's k-th restart (below); not set in its
                     first run
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
it (mnist_dist --replicas 1 for servers, --on_worker_failure continue for
workers).

Restarts (--max-restarts N, local and ssh): a worker or the scheduler that
exits non-zero or is killed by a signal is started again at once, up to N
times per process (the scheduler at the same address),
with the same role, rank, key and environment plus PS_RESTART_COUNT=k (1
in its first restart, 2 in its second...); its output keeps its tag, and a
line says "worker 1 (pid 42) was killed by signal SIGKILL; restarting it
(1 of 2, --max-restarts 2)". What the dead process left in its process
group (local) is killed first. Every process of the job gets
PS_MAX_RESTARTS=N: the nodes then wait for a restarted worker (the
scheduler takes it back under its rank) or scheduler (the members report
themselves to it and it takes the job over) instead of failing. A server
that fails stops the job as above (or --tolerate server), and so does a
worker or scheduler whose N restarts are spent (or --tolerate worker),
the last line saying "(after N restarts, --max-restarts N)". A restarted
process is never named as "declared dead" on that line: the launcher
cannot tell a report about its dead run, which may come late, from one
about its new run. The last line of a job that succeeded says which
processes were restarted and how many times.

Keys: by default each job gets a new CurveZMQ secret key, 32 bytes from
os.urandom written in Z85 as the one line of a file in a new private
directory (0700; the file 0600); PS_KEY_FILE names that file (never a
command line) and every node derives the public key from it, so only
processes that can read it can join the job. The directory is removed when
the launcher exits. --key-file FILE uses an existing key file instead;
--insecure runs the job without a key (PS_KEY_FILE is removed from the
processes' environment). For nodes started by hand,
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
         PS_MAX_RESTARTS and PS_RESTART_COUNT (as above),
         DMLC_NODE_HOST (its host as the hostfile names it, unless --env
         sets it or DMLC_INTERFACE), OMP_WAIT_POLICY, the launcher's
         DMLC_* and PS_* variables and every --env. The key's one line
         goes through the session's stdin into a new 0600 file in a
         private directory on that host (never a command line), removed
         when the process ends. The program (an absolute path, the same on
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
         stops the job when one process fails.
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


class Child:
    """One launched process: its role, rank, Popen and output readers.

    host: where it runs when started through ssh (None: this machine).
    """

    def __init__(self, role, rank, host=None):
        self.role = role
        self.rank = rank  # None for the scheduler.
        self.host = host
        self.proc = None  # The current run's (after a restart: the new).
        self.readers = []  # Of every run's output.
        self.restarts = 0  # How many times it was started again.

    @property
    def name(self):
        return self.role if self.rank is None else f"{self.role} {self.rank}"

    @property
    def tag(self):
        """The prefix of its output lines, without the brackets."""
        return self.name if self.host is None else f"{self.name} @{self.host}"

    @property
    def label(self):
        """How the launcher's messages name it: with its pid or host."""
        if self.host is None:
            return f"{self.name} (pid {self.pid})"
        return f"{self.name} on {self.host}"

    @property
    def pid(self):
        return self.proc.pid

    def describe_exit(self, returncode):
        if self.host is None:
            return describe_exit(returncode)
        if returncode == 255:
            return "exited with code 255 (or ssh failed)"
        if 128 < returncode < 128 + signal.NSIG:
            return (f"{describe_exit(128 - returncode)} (remote exit status "
                    f"{returncode})")
        return describe_exit(returncode)


def signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def describe_exit(returncode):
    """'exited with code 3' or 'was killed by signal SIGKILL'."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    return f"was killed by signal {signal_name(-returncode)}"


def plural(n, word, suffix="es"):
    return f"{n} {word}" if n == 1 else f"{n} {word}{suffix}"


class OutputMux:
    """Copies child pipes to our stdout/stderr with a prefix per line.

    One lock guards both streams, so a line is written whole: output of
    different processes never interleaves mid-line.
    """

    def __init__(self):
        self._lock = threading.Lock()

    def write(self, stream, data):
        with self._lock:
            stream.buffer.write(data)
            stream.buffer.flush()

    def say(self, message):
        self.write(sys.stderr, f"launch: {message}\n".encode())

    def start_reader(self, pipe, prefix, stream, on_line=None):
        """Copies pipe to stream; on_line(line) sees each line first."""
        thread = threading.Thread(
            target=self._copy, args=(pipe, prefix.encode(), stream, on_line),
            daemon=True)
        thread.start()
        return thread

    def _copy(self, pipe, prefix, stream, on_line):
        with pipe:
            for line in iter(pipe.readline, b""):
                if not line.endswith(b"\n"):
                    line += b"\n"
                if on_line is not None:
                    on_line(line)
                self.write(stream, prefix + line)


def z85_encode(data):
    """Z85 text of data (bytes, a multiple of 4 long)."""
    if len(data) % 4:
        raise ValueError(f"Z85 encodes a multiple of 4 bytes, got {len(data)}")
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i:i + 4], "big")
        digits = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            digits.append(Z85_ALPHABET[digit])
        out.extend(reversed(digits))
    return "".join(out)


def z85_decode(text):
    """The bytes of Z85 text; ValueError saying what is wrong with it."""
    if len(text) % 5:
        raise ValueError(f"Z85 text is a multiple of 5 characters long, "
                         f"got {len(text)}")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for ch in text[i:i + 5]:
            digit = _Z85_DIGIT.get(ch)
            if digit is None:
                raise ValueError(f"{ch!r} is not a Z85 character")
            value = value * 85 + digit
        if value >> 32:
            raise ValueError(f"{text[i:i + 5]!r} is more than 32 bits")
        out += value.to_bytes(4, "big")
    return bytes(out)


def check_key_file(path):
    """None if path's first line is a 40-character Z85 key, else why not."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as err:
        return err.strerror or str(err)
    line = head.split(b"\n", 1)[0]
    try:
        line = line.decode("ascii")
    except UnicodeDecodeError:
        return "its first line is not ASCII text"
    if len(line) != KEY_CHARS:
        return (f"its first line has {len(line)} characters, expected a "
                f"{KEY_CHARS}-character Z85 key")
    try:
        z85_decode(line)
    except ValueError as err:
        return f"its first line is not a Z85 key: {err}"
    return None


def write_key_file(path):
    """Writes a new key to path (0600; O_EXCL: never an existing file)."""
    key = z85_encode(secrets.token_bytes(KEY_BYTES))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # Exactly 0600, whatever the umask.
        with os.fdopen(fd, "w", closefd=False) as f:
            f.write(key + "\n")
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)


class JobKey:
    """The job's key file: a new one in a private directory, or the user's.

    remove() deletes the directory of a new key; the user's file is kept.
    """

    def __init__(self, path=None, parent=None):
        """parent: where the new key's directory goes (default: $TMPDIR)."""
        self.dir = None
        self.path = path
        if path is None:
            self.dir = tempfile.mkdtemp(prefix="ps-key-", dir=parent)  # 0700
            try:
                os.chmod(self.dir, 0o700)
                self.path = os.path.join(self.dir, "job.key")
                write_key_file(self.path)
            except BaseException:
                self.remove()
                raise

    def remove(self):
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def make_key(path):
    """--make-key FILE: writes a new key file and exits."""
    try:
        write_key_file(path)
    except FileExistsError:
        print(f"launch: --make-key: '{path}' exists; not overwriting it",
              file=sys.stderr)
        return EXIT_USAGE
    except OSError as err:
        print(f"launch: --make-key: cannot write '{path}': {err.strerror}",
              file=sys.stderr)
        return EXIT_USAGE
    print(f"launch: wrote a new key to '{path}' (mode 0600); give every node "
          f"PS_KEY_FILE={path}", file=sys.stderr)
    return EXIT_OK


def free_port(host):
    """A port that was free on host a moment ago (bind to 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


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


def usage_error(message):
    print(f"launch: {message} (see --help)", file=sys.stderr)
    sys.exit(EXIT_USAGE)


def read_hostfile(path):
    """[(host, slots)] of a hostfile: "HOST" or "HOST slots=N" a line.

    '#' starts a comment; blank lines are skipped. The format is Open MPI's,
    so one file serves mpirun too. Exits 2 naming the line that is wrong.
    """
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as err:
        usage_error(f"cannot read hostfile '{path}': "
                    f"{err.strerror or err}")
    hosts = []
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"hostfile '{path}' line {number}"
        slots = 1
        for field in fields[1:]:
            key, sep, value = field.partition("=")
            if key != "slots" or not sep:
                usage_error(f"{where}: expected HOST [slots=N], got '{line}'")
            if not value.isdigit() or int(value) < 1:
                usage_error(f"{where}: slots must be an integer >= 1, "
                            f"got '{value}'")
            slots = int(value)
        if fields[0].startswith("-"):
            usage_error(f"{where}: '{fields[0]}' is not a host")
        hosts.append((fields[0], slots))
    if not hosts:
        usage_error(f"hostfile '{path}' names no host")
    return hosts


def place(hosts, num_servers, num_workers):
    """The host of each server and worker: slot by slot, cyclically.

    The slots are the hostfile's hosts each repeated slots times; servers
    take the first ones, then workers, starting over when they run out.
    """
    slots = [host for host, count in hosts for _ in range(count)]
    servers = [slots[i % len(slots)] for i in range(num_servers)]
    workers = [slots[(num_servers + i) % len(slots)]
               for i in range(num_workers)]
    return servers, workers


def remote_script(env, command, cwd, with_key, grace):
    """The sh script an ssh session runs for one process.

    With a key, its one line comes first on the session's stdin and goes to
    a new 0600 file in a private directory (never a command line). The
    program runs in a new session (its own process group) with stdin from
    /dev/null; the rest of the session's stdin is watched: when it ends
    (the launcher closed it, or the launcher or its ssh died), the group
    gets SIGCONT and SIGTERM, and SIGKILL `grace` seconds later. What the
    program leaves in its group when it ends is killed (as the local
    launcher does; before a restart, too). The script exits with the
    program's status (128+N for signal N).
    """
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    program = " ".join(shlex.quote(arg) for arg in command)
    lines = ["umask 077", "exec 3<&0 </dev/null", "d="]
    if with_key:
        lines += [
            'd=$(mktemp -d "${TMPDIR:-/tmp}/ps-key-XXXXXX") || exit 1',
            'IFS= read -r k <&3 || { rm -rf "$d"; exit 1; }',
            'printf "%s\\n" "$k" >"$d/job.key"; k=',
            'PS_KEY_FILE=$d/job.key; export PS_KEY_FILE']
    lines += [
        f"[ -d {shlex.quote(cwd)} ] && cd {shlex.quote(cwd)}",
        f"env {assignments} setsid {program} 3<&- &",
        "p=$!",
        "{ while IFS= read -r l; do :; done; kill -CONT -$p; kill -TERM -$p;"
        f" sleep {grace:g}; kill -KILL -$p; }} <&3 >/dev/null 2>&1 &",
        "w=$!",
        "exec 3<&-",
        "wait $p 2>/dev/null; r=$?",
        "kill -KILL -$p 2>/dev/null",
        'kill $w 2>/dev/null; [ -z "$d" ] || rm -rf "$d"; exit $r']
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="launch.py",
        usage="%(prog)s -s S -w W [options] -- PROGRAM [ARGS...]",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-s", "--num-servers", type=int, metavar="S",
                        help="number of servers (>= 0); required")
    parser.add_argument("-w", "--num-workers", type=int, metavar="W",
                        help="number of workers (>= 1); required")
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
                        "survive it, e.g. servers with PS_REPLICAS=1 "
                        "(repeatable)")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="local, ssh: restart a worker or the scheduler "
                        "that exits non-zero or is killed, up to N times per "
                        "process, with its rank and environment plus "
                        "PS_RESTART_COUNT; "
                        "every process gets PS_MAX_RESTARTS=N (default: "
                        "%(default)s, no restart)")
    parser.add_argument("--timeout", type=float, default=None,
                        metavar="SECONDS",
                        help="bound on the whole job; on expiry kill all and "
                        "exit 124 (default: none)")
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument("--key-file", metavar="FILE",
                      help="use this CurveZMQ key file (first line: a "
                      "40-character Z85 secret key) instead of a new key "
                      "per job; its path is given as PS_KEY_FILE")
    keys.add_argument("--insecure", action="store_true",
                      help="no key: traffic is neither authenticated nor "
                      "encrypted; PS_KEY_FILE is removed from the "
                      "processes' environment")
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
    if args.num_servers < 0:
        usage_error(f"-s/--num-servers must be >= 0, got {args.num_servers}")
    if args.num_workers < 1:
        usage_error(f"-w/--num-workers must be >= 1, got {args.num_workers}")
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
        args.extra_env[key] = value
    if args.key_file is not None:
        check_user_key_file(args.key_file)
    check_launcher_args(args)
    args.command[0] = resolve_program(args.command[0])
    if args.launcher != "local":  # Other hosts run it from anywhere.
        args.command[0] = os.path.abspath(args.command[0])
    return args


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


def check_user_key_file(path):
    """Exits 2 unless path is a key file; warns if others may read it."""
    if not os.path.exists(path):
        usage_error(f"--key-file '{path}' not found")
    if not os.path.isfile(path):
        usage_error(f"--key-file '{path}' is not a file")
    problem = check_key_file(path)
    if problem is not None:
        usage_error(f"--key-file '{path}' is not a key file: {problem}")
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        print(f"launch: warning: --key-file '{path}' is open to group/others "
              f"(mode {mode:04o}); chmod 600 it", file=sys.stderr)


def restart_env(args, restarts=0):
    """PS_MAX_RESTARTS with --max-restarts N > 0; PS_RESTART_COUNT in a
    restarted worker. (getattr: a Job may be given args without the flag.)
    """
    env = {}
    max_restarts = getattr(args, "max_restarts", 0)
    if max_restarts > 0:
        env["PS_MAX_RESTARTS"] = str(max_restarts)
    if restarts > 0:
        env["PS_RESTART_COUNT"] = str(restarts)
    return env


def child_env(args, port, role, rank, key_path, restarts=0):
    """A local process's environment; restarts: how many times this one
    was restarted (its PS_RESTART_COUNT)."""
    env = dict(os.environ)
    for name in ("PS_RANK", "PS_KEY_FILE") + RESTART_ENV:
        env.pop(name, None)
    if key_path is not None:
        env["PS_KEY_FILE"] = key_path
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.update({
        "DMLC_ROLE": role,
        "DMLC_PS_ROOT_URI": args.host,
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_SERVER": str(args.num_servers),
        "DMLC_NUM_WORKER": str(args.num_workers),
        "DMLC_NODE_HOST": "127.0.0.1",
    })
    if rank is not None:
        env["PS_RANK"] = str(rank)
    env.update(restart_env(args, restarts))
    env.update(args.extra_env)
    return env


def job_settings(args, root, port):
    """What every process of a job on other hosts gets, whatever its role.

    The launcher's DMLC_* and PS_* variables (not those it sets itself, nor
    DMLC_NODE_HOST, which is per host), OMP_WAIT_POLICY (PASSIVE unless
    set), the scheduler's address and the job's shape, PS_MAX_RESTARTS with
    --max-restarts; the --env ones last.
    """
    env = {k: v for k, v in os.environ.items()
           if k.startswith(FORWARDED_PREFIXES) and k not in RESERVED_ENV
           and k != "DMLC_NODE_HOST"}
    env["OMP_WAIT_POLICY"] = os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    env.update({
        "DMLC_PS_ROOT_URI": root,
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_SERVER": str(args.num_servers),
        "DMLC_NUM_WORKER": str(args.num_workers),
    })
    env.update(restart_env(args))
    env.update(args.extra_env)
    return env


def address(host):
    """The address part of an ssh destination: "node1" of "user@node1"."""
    return host.rsplit("@", 1)[-1]


def ssh_env(args, port, child):
    """The environment an ssh session gives one process (no PS_KEY_FILE:
    the remote script sets it)."""
    env = job_settings(args, address(args.scheduler_host), port)
    env["DMLC_ROLE"] = child.role
    if child.rank is not None:
        env["PS_RANK"] = str(child.rank)
    if child.restarts > 0:
        env["PS_RESTART_COUNT"] = str(child.restarts)
    if "DMLC_NODE_HOST" not in env and "DMLC_INTERFACE" not in env:
        env["DMLC_NODE_HOST"] = address(child.host)  # As the others see it.
    return env


class Job:
    """Starts the children, watches them, stops them all on the way out.

    local: the processes are the children. ssh: each child is the ssh
    client of one process's session (see remote_script).
    """

    def __init__(self, args, mux):
        self.args = args
        self.mux = mux
        self.key_path = None  # The job's key file; None with --insecure.
        self.port = None  # The scheduler's, once started.
        self.children = []
        self.exits = queue.Queue()  # (child, returncode) in reaping order.
        self.signal_received = None
        self.tolerated = []  # children whose failure --tolerate let pass
        # (declared name, reason, reporter's name) in the order read.
        self._reports = []
        self._reports_lock = threading.Lock()
        self._reported = threading.Event()

    @property
    def total(self):
        """How many processes the job has."""
        return 1 + self.args.num_servers + self.args.num_workers

    @property
    def max_restarts(self):
        """--max-restarts (0 for a Job given args without it)."""
        return getattr(self.args, "max_restarts", 0)

    def plan(self):
        if self.args.launcher == "ssh":
            servers, workers = place(self.args.hosts, self.args.num_servers,
                                     self.args.num_workers)
            return ([Child("scheduler", None, self.args.scheduler_host)]
                    + [Child("server", i, h) for i, h in enumerate(servers)]
                    + [Child("worker", i, h) for i, h in enumerate(workers)])
        return ([Child("scheduler", None)]
                + [Child("server", i) for i in range(self.args.num_servers)]
                + [Child("worker", i) for i in range(self.args.num_workers)])

    def popen(self, child, port):
        """Starts child: a local process, or an ssh session for a remote."""
        if child.host is None:
            return subprocess.Popen(
                self.args.command, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=child_env(self.args, port, child.role, child.rank,
                              self.key_path, child.restarts),
                start_new_session=True)
        script = remote_script(ssh_env(self.args, port, child),
                               self.args.command, os.getcwd(),
                               self.key_path is not None, self.args.grace)
        argv = ["ssh", "-T", "-o", "BatchMode=yes", *self.args.launcher_arg,
                child.host, "exec /bin/sh -c " + shlex.quote(script)]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE,
                                start_new_session=True)
        if self.key_path is not None:  # Its one line, through the session.
            with open(self.key_path, "rb") as f:
                line = f.readline().rstrip(b"\n")
            try:
                proc.stdin.write(line + b"\n")
                proc.stdin.flush()
            except OSError:
                pass  # ssh failed already; its exit says why.
        return proc

    def start(self, port):
        self.port = port
        for child in self.plan():
            try:
                child.proc = self.popen(child, port)
            except OSError as err:
                self.mux.say(f"cannot start {child.name}: {err}")
                self.stop(self.children)
                return False
            self.children.append(child)
            self.read_output(child, f"[{child.tag}] ")
        return True

    def read_output(self, child, prefix):
        """Copies the output of child's current run with prefix; reaps it
        into self.exits."""
        def watch(line, reporter=child.name):
            self._watch(reporter, line)
        child.readers += [
            self.mux.start_reader(child.proc.stdout, prefix, sys.stdout,
                                  watch),
            self.mux.start_reader(child.proc.stderr, prefix, sys.stderr,
                                  watch),
        ]
        threading.Thread(target=self._reap, args=(child, child.proc),
                         daemon=True).start()

    def _reap(self, child, proc=None):
        """Puts (child, returncode) once proc (its current run) exits."""
        proc = child.proc if proc is None else proc
        self.exits.put((child, proc.wait()))

    def _watch(self, reporter, line):
        if b"was declared dead" not in line:  # Cheap test first.
            return
        match = DECLARED_DEAD.search(line.rstrip(b"\r\n"))
        if match is None:
            return
        name = match.group(1).decode()
        reason = match.group(2).decode(errors="replace").strip()
        with self._reports_lock:
            self._reports.append((name, reason, reporter))
        self._reported.set()

    def first_report(self):
        """(declared name, reason, reporter's name) read first, or None.

        Reports that name a restarted process are left out, whenever they
        were read: one read before the restart is about the run that
        died, and one read after it may be too (the other nodes notice a
        death late, after missed heartbeats) or be about the new run; the
        launcher cannot tell which, so it never names a restarted process
        as the cause of a failure on that ground. A failure is then put
        on the first process that exited non-zero, which for a restarted
        worker whose restarts are spent is itself.
        """
        restarted = {c.name for c in self.children if c.restarts}
        with self._reports_lock:
            return next((r for r in self._reports if r[0] not in restarted),
                        None)

    def _await_report(self, deadline):
        """Waits up to DEAD_REPORT_GRACE (and deadline) for a report that
        first_report gives."""
        end = time.monotonic() + DEAD_REPORT_GRACE
        if deadline is not None:
            end = min(end, deadline)
        # Cleared before each look, so no report goes unnoticed; one that
        # first_report leaves out does not end the wait.
        while (self.signal_received is None and time.monotonic() < end):
            self._reported.clear()
            if self.first_report() is not None:
                return
            self._reported.wait(
                min(POLL_SECONDS, max(0.0, end - time.monotonic())))

    def on_signal(self, signum, frame):
        self.signal_received = signum

    def wait(self, deadline):
        """Returns ('done'|'failed'|'timeout'|'signal', failed child, rc)."""
        remaining = len(self.children)
        while remaining:
            if self.signal_received is not None:
                return "signal", None, None
            if deadline is not None and time.monotonic() >= deadline:
                return "timeout", None, None
            try:
                child, returncode = self.exits.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            if returncode != 0 and self.may_restart(child):
                if self.restart(child, returncode):
                    continue  # Still one of the remaining, as a new run.
                return "failed", child, returncode
            remaining -= 1
            if returncode != 0 and child.role in self.args.tolerate:
                # The job survives it (e.g. a server with PS_REPLICAS=1).
                self.mux.say(f"{child.label} "
                             f"{child.describe_exit(returncode)}"
                             f"{self.restart_note(child)}; the job "
                             f"goes on (--tolerate {child.role})")
                self.tolerated.append(child)
                continue
            if returncode != 0:
                self._await_report(deadline)
                return "failed", child, returncode
        return "done", None, None

    def may_restart(self, child):
        """Whether child, which failed, is started again: a worker or the
        scheduler with --max-restarts left (per process)."""
        return (child.role in ("worker", "scheduler")
                and child.restarts < self.max_restarts)

    def restart(self, child, returncode):
        """Starts child's next run at once (the scheduler takes it back
        once it has noticed the old run's death); False if it cannot."""
        self.mux.say(f"{child.label} {child.describe_exit(returncode)}; "
                     f"restarting it ({child.restarts + 1} of "
                     f"{self.max_restarts}, --max-restarts "
                     f"{self.max_restarts})")
        # What the dead run left in its group (its own children) goes too.
        # Its pid cannot have been reused while that group has members.
        self._signal_groups([child], signal.SIGKILL)
        old = child.proc
        if old.stdin is not None:  # ssh: the old session's.
            try:
                old.stdin.close()
            except OSError:
                pass
        child.restarts += 1
        try:
            child.proc = self.popen(child, self.port)
        except OSError as err:
            child.restarts -= 1
            self.mux.say(f"cannot restart {child.name}: {err}")
            return False
        self.read_output(child, f"[{child.tag}] ")
        return True

    def restart_note(self, child):
        """' (after 2 restarts, --max-restarts 2)' for a restarted child."""
        if not child.restarts:
            return ""
        return (f" (after {plural(child.restarts, 'restart', 's')}, "
                f"--max-restarts {self.max_restarts})")

    def describe_restarts(self):
        """'worker 1 was restarted 1 time (--max-restarts 2)', or ''."""
        restarted = [c for c in self.children if c.restarts]
        if not restarted:
            return ""
        return (", ".join(f"{c.name} was restarted "
                          f"{plural(c.restarts, 'time', 's')}"
                          for c in restarted)
                + f" (--max-restarts {self.max_restarts})")

    def running(self):
        """The children whose current run has not exited."""
        return [c for c in self.children if c.proc.poll() is None]

    def stop(self, children):
        """SIGTERM each group, SIGKILL after the grace; reaps the leaders.

        SIGCONT first: a stopped (SIGSTOP) process would not act on SIGTERM.
        ssh sessions are first told to stop their remote processes.
        """
        self._hang_up([c for c in children if c.host is not None])
        self._signal_groups(children, signal.SIGCONT)
        self._signal_groups(children, signal.SIGTERM)
        end = time.monotonic() + self.args.grace
        for child in children:
            try:
                child.proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        # Grandchildren may outlive their leader; kill every group.
        self._signal_groups(children, signal.SIGKILL)
        for child in children:
            child.proc.wait()

    def _hang_up(self, children):
        """Ends the stdin of ssh sessions: the remote side then stops its
        process group (remote_script); waits for the sessions to end."""
        for child in children:
            try:
                child.proc.stdin.close()
            except OSError:
                pass
        end = time.monotonic() + self.args.grace + REMOTE_STOP_SLACK
        for child in children:
            try:
                child.proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass

    @staticmethod
    def _signal_groups(children, signum):
        for child in children:
            try:
                os.killpg(child.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def drain_output(self):
        for child in self.children:
            for reader in child.readers:
                reader.join(timeout=1.0)

    def describe_failure(self, failed, returncode, running):
        """The cause of a failed job: who was declared dead, else who failed.

        running: the processes that were still running when it was decided.
        """
        parts = []
        named = [failed]
        report = self.first_report()
        if report is not None:
            name, reason, reporter = report
            dead = next((c for c in self.children if c.name == name), None)
            who = name if dead is None else dead.label
            parts.append(f"{who} was declared dead by {reporter}: {reason}")
            named.append(dead)
        how = failed.describe_exit(returncode) + self.restart_note(failed)
        if report is not None and named[1] is failed:
            parts.append(f"it {how}")
        else:
            parts.append(f"{failed.label} {how}")
        others = [c for c in running if c not in named]
        parts.append(f"stopped the other {plural(len(others), 'process')}"
                     if others else "no other process was running")
        return "; ".join(parts)

    def describe_running(self, running):
        return ", ".join(c.label for c in running) or "none"


class ToolJob(Job):
    """mpi and slurm: one mpirun or srun starts every process, each through
    "launch.py --as-rank" (as_rank), whose output comes tagged already."""

    def __init__(self, args, mux):
        super().__init__(args, mux)
        self.tool = "mpirun" if args.launcher == "mpi" else "srun"
        # (name, host, how) of the processes that failed, in the order read.
        self._rank_exits = []

    def start(self, port):
        argv, env = tool_command(self.args, port, self.key_path)
        child = Child(self.tool, None)
        try:
            child.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=env, start_new_session=True)
        except OSError as err:
            self.mux.say(f"cannot start {self.tool}: {err}")
            return False
        self.children.append(child)
        self.read_output(child, "")
        return True

    def _watch(self, reporter, line):
        tag = RANK_TAG.match(line)
        if tag is not None:
            reporter = tag.group(1).decode()
        match = RANK_EXIT.search(line.rstrip(b"\r\n"))
        if match is not None:
            with self._reports_lock:
                self._rank_exits.append(
                    tuple(g.decode(errors="replace") for g in match.groups()))
            return
        super()._watch(reporter, line)

    def describe_failure(self, failed, returncode, running):
        """Who was declared dead, or failed first; what mpirun/srun did."""
        parts = []
        report = self.first_report()
        if report is not None:
            name, reason, reporter = report
            parts.append(f"{name} was declared dead by {reporter}: {reason}")
        with self._reports_lock:
            first_exit = self._rank_exits[0] if self._rank_exits else None
        if first_exit is not None:
            name, host, how = first_exit
            if report is not None and report[0] == name:
                parts.append(f"it {how} on {host}")
            else:
                parts.append(f"{name} on {host} {how}")
            parts.append(f"{self.tool} stopped the rest and "
                         f"{describe_exit(returncode)}")
        else:
            parts.append(f"{failed.label} {describe_exit(returncode)}")
        return "; ".join(parts)

    def describe_running(self, running):
        return ", ".join(f"{c.label} and the processes it started"
                         for c in running) or "none"


def is_loopback(host):
    return host == "localhost" or host.startswith("127.")


def slurm_nodes():
    """The allocation's node names and {name: address}, from scontrol."""
    def scontrol(*argv):
        try:
            return subprocess.run(["scontrol", *argv], capture_output=True,
                                  text=True, check=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError) as err:
            usage_error(f"--launcher slurm: scontrol {' '.join(argv)} "
                        f"failed: {getattr(err, 'stderr', '') or err}")
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        usage_error("--launcher slurm: SLURM_JOB_NODELIST is not set")
    names = scontrol("show", "hostnames", nodelist).split()
    addrs = {}
    for line in scontrol("show", "node", "-o", nodelist).splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "NodeName" in fields:
            addrs[fields["NodeName"]] = fields.get("NodeAddr",
                                                   fields["NodeName"])
    if not names:
        usage_error(f"--launcher slurm: no node in SLURM_JOB_NODELIST="
                    f"{nodelist}")
    return names, {n: addrs.get(n, n) for n in names}


def tool_command(args, port, key_path):
    """(argv, env) of the mpirun or srun that starts every process.

    Each process runs "launch.py --as-rank -- PROGRAM ARGS", which takes
    its role from its rank. The settings travel in the environment: named
    by mpirun's -x (the values never on a command line); srun exports the
    whole environment.
    """
    shim = [sys.executable, os.path.abspath(__file__), "--as-rank", "--",
            *args.command]
    env = dict(os.environ)
    for name in RESERVED_ENV + ("DMLC_NODE_HOST",):
        env.pop(name, None)
    count = str(1 + args.num_servers + args.num_workers)
    if args.launcher == "mpi":
        root = args.hosts[0][0] if args.hosts else "127.0.0.1"
        settings = job_settings(args, root, port)
        if key_path is not None:
            settings["PS_KEY_FILE"] = key_path
        env.update(settings)
        argv = ["mpirun", "-n", count]
        if args.hostfile is not None:
            argv += ["--hostfile", args.hostfile]
        argv += args.launcher_arg
        for name in sorted(settings):
            argv += ["-x", name]
        return argv + shim, env
    names, addrs = slurm_nodes()
    settings = job_settings(args, addrs[names[0]], port)
    if key_path is not None:
        settings["PS_KEY_FILE"] = key_path
    settings["PS_LAUNCH_SCHEDULER_NODE"] = names[0]
    settings["PS_LAUNCH_NODE_ADDRS"] = ",".join(f"{n}={addrs[n]}"
                                                for n in names)
    env.update(settings)
    argv = ["srun", "-n", count, "--kill-on-bad-exit=1", "--export=ALL",
            *args.launcher_arg]
    return argv + shim, env


def run(args):
    mux = OutputMux()
    try:
        port = args.port or free_port(args.host)
    except OSError as err:
        usage_error(f"cannot bind a port on --host {args.host}: {err}")
    job = (ToolJob if args.launcher in ("mpi", "slurm") else Job)(args, mux)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, job.on_signal)
    if args.insecure:
        mux.say(INSECURE_NOTE)
        return run_job(args, job, port)
    if args.key_file is not None:
        job.key_path = os.path.abspath(args.key_file)
        return run_job(args, job, port)
    # mpi, slurm: the processes on other hosts read the key file by its
    # path, so it goes where the hosts share files: the working directory.
    shared = args.launcher in ("mpi", "slurm")
    try:
        key = JobKey(parent=os.getcwd() if shared else None)
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
            lost = ", ".join(c.name for c in job.tolerated)
            line = (f"{plural(job.total - len(job.tolerated), 'process')} "
                    f"exited 0 in {elapsed:.1f} s; the job survived the loss "
                    f"of {lost} (--tolerate)")
        else:
            line = (f"all {plural(job.total, 'process')} exited 0 in "
                    f"{elapsed:.1f} s")
        restarts = job.describe_restarts()
        mux.say(line + (f"; {restarts}" if restarts else ""))
        return EXIT_OK
    if outcome == "failed":
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
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)

    def die_with_us():  # PR_SET_PDEATHSIG: SIGKILL when the shim dies.
        libc.prctl(1, signal.SIGKILL)
    try:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE,
                                preexec_fn=die_with_us)
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


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--as-rank"]:
        return as_rank(argv[1:])
    args = parse_args(argv)
    if args.make_key is not None:
        return make_key(args.make_key)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
