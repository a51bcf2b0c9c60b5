#!/usr/bin/env python3
"""Launches a ps job on this machine: one scheduler, S servers, W workers.

Every process runs the same PROGRAM ARGS; its role comes from the
environment (ps-lite style). Output lines are prefixed with the role and
rank; the first process to fail stops the others. Standard library only.
"""

import argparse
import os
import queue
import re
import secrets
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
                "DMLC_NUM_SERVER", "DMLC_NUM_WORKER", "PS_RANK", "PS_KEY_FILE")

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

# After the first non-zero exit, how long to wait for a "declared dead"
# line before naming the cause: healthy nodes that lost a frozen peer may
# exit before the line that names it has been read.
DEAD_REPORT_GRACE = 2.0

DESCRIPTION = """\
Launches a ps job on this machine: one scheduler, S servers and W workers,
all running the same PROGRAM [ARGS...]. Each process learns its role from
its environment, which is the launcher's own plus:

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
"""

EPILOG = """\
exit status:
  0    every process exited 0
  1    a process exited non-zero or was killed by a signal
  2    usage error (bad flags, PROGRAM missing, not found or not executable,
       a --key-file that is missing or not a key, a --make-key FILE that
       exists)
  124  --timeout expired; the processes still running were killed
  130/143  the launcher got SIGINT/SIGTERM and stopped the processes

examples:
  python3 tracker/launch.py -s 2 -w 2 -- build/bench/kv/kv_bench --iters 10
  python3 tracker/launch.py --make-key job.key
"""


class Child:
    """One launched process: its role, rank, Popen and output readers."""

    def __init__(self, role, rank):
        self.role = role
        self.rank = rank  # None for the scheduler.
        self.proc = None
        self.readers = []

    @property
    def name(self):
        return self.role if self.rank is None else f"{self.role} {self.rank}"

    @property
    def pid(self):
        return self.proc.pid


def describe_exit(returncode):
    """'exited with code 3' or 'was killed by signal SIGKILL'."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        sig = signal.Signals(-returncode).name
    except ValueError:
        sig = str(-returncode)
    return f"was killed by signal {sig}"


def plural(n, word):
    return f"{n} {word}" if n == 1 else f"{n} {word}es"


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

    def __init__(self, path=None):
        self.dir = None
        self.path = path
        if path is None:
            self.dir = tempfile.mkdtemp(prefix="ps-key-")  # Mode 0700.
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
    parser.add_argument("--host", default="127.0.0.1",
                        help="scheduler host, DMLC_PS_ROOT_URI "
                        "(default: %(default)s)")
    parser.add_argument("--port", type=int, default=0,
                        help="scheduler port, DMLC_PS_ROOT_PORT (default: a "
                        "free port on --host, found by binding port 0)")
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
    args.command[0] = resolve_program(args.command[0])
    return args


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


def child_env(args, port, role, rank, key_path):
    env = dict(os.environ)
    env.pop("PS_RANK", None)
    env.pop("PS_KEY_FILE", None)
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
    env.update(args.extra_env)
    return env


class Job:
    """Starts the children, watches them, stops them all on the way out."""

    def __init__(self, args, mux):
        self.args = args
        self.mux = mux
        self.key_path = None  # The job's key file; None with --insecure.
        self.children = []
        self.exits = queue.Queue()  # (child, returncode) in reaping order.
        self.signal_received = None
        self.tolerated = []  # children whose failure --tolerate let pass
        # (declared name, reason, reporting child) in the order read.
        self._reports = []
        self._reports_lock = threading.Lock()
        self._reported = threading.Event()

    def start(self, port):
        plan = [("scheduler", None)]
        plan += [("server", i) for i in range(self.args.num_servers)]
        plan += [("worker", i) for i in range(self.args.num_workers)]
        for role, rank in plan:
            child = Child(role, rank)
            try:
                child.proc = subprocess.Popen(
                    self.args.command, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    env=child_env(self.args, port, role, rank,
                                  self.key_path),
                    start_new_session=True)
            except OSError as err:
                self.mux.say(f"cannot start {child.name}: {err}")
                self.stop(self.children)
                return False
            self.children.append(child)
            prefix = f"[{child.name}] "

            def watch(line, reporter=child):
                self._watch(reporter, line)
            child.readers = [
                self.mux.start_reader(child.proc.stdout, prefix, sys.stdout,
                                      watch),
                self.mux.start_reader(child.proc.stderr, prefix, sys.stderr,
                                      watch),
            ]
            threading.Thread(target=self._reap, args=(child,),
                             daemon=True).start()
        return True

    def _reap(self, child):
        self.exits.put((child, child.proc.wait()))

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
        """(declared name, reason, reporting child) read first, or None."""
        with self._reports_lock:
            return self._reports[0] if self._reports else None

    def _await_report(self, deadline):
        """Waits up to DEAD_REPORT_GRACE (and deadline) for a report."""
        end = time.monotonic() + DEAD_REPORT_GRACE
        if deadline is not None:
            end = min(end, deadline)
        while (not self._reported.is_set() and self.signal_received is None
               and time.monotonic() < end):
            self._reported.wait(POLL_SECONDS)

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
            remaining -= 1
            if returncode != 0 and child.role in self.args.tolerate:
                # The job survives it (e.g. a server with PS_REPLICAS=1).
                self.mux.say(f"{child.name} (pid {child.pid}) "
                             f"{describe_exit(returncode)}; the job goes on "
                             f"(--tolerate {child.role})")
                self.tolerated.append(child)
                continue
            if returncode != 0:
                self._await_report(deadline)
                return "failed", child, returncode
        return "done", None, None

    def running(self):
        return [c for c in self.children if c.proc.poll() is None]

    def stop(self, children):
        """SIGTERM each group, SIGKILL after the grace; reaps the leaders.

        SIGCONT first: a stopped (SIGSTOP) process would not act on SIGTERM.
        """
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


def describe_failure(job, failed, returncode, running):
    """The cause of a failed job: who was declared dead, else who failed.

    running: the processes that were still running when it was decided.
    """
    parts = []
    named = [failed]
    report = job.first_report()
    if report is not None:
        name, reason, reporter = report
        dead = next((c for c in job.children if c.name == name), None)
        who = name if dead is None else f"{name} (pid {dead.pid})"
        parts.append(f"{who} was declared dead by {reporter.name}: {reason}")
        named.append(dead)
    if report is not None and named[1] is failed:
        parts.append(f"it {describe_exit(returncode)}")
    else:
        parts.append(f"{failed.name} (pid {failed.pid}) "
                     f"{describe_exit(returncode)}")
    others = [c for c in running if c not in named]
    parts.append(f"stopped the other {plural(len(others), 'process')}"
                 if others else "no other process was running")
    return "; ".join(parts)


def run(args):
    mux = OutputMux()
    try:
        port = args.port or free_port(args.host)
    except OSError as err:
        usage_error(f"cannot bind a port on --host {args.host}: {err}")
    job = Job(args, mux)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, job.on_signal)
    if args.insecure:
        mux.say(INSECURE_NOTE)
        return run_job(args, job, port)
    if args.key_file is not None:
        job.key_path = os.path.abspath(args.key_file)
        return run_job(args, job, port)
    try:
        key = JobKey()
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
    total = len(job.children)
    if outcome == "done":
        elapsed = time.monotonic() - start
        if job.tolerated:
            lost = ", ".join(c.name for c in job.tolerated)
            mux.say(f"{plural(total - len(job.tolerated), 'process')} exited "
                    f"0 in {elapsed:.1f} s; the job survived the loss of "
                    f"{lost} (--tolerate)")
        else:
            mux.say(f"all {plural(total, 'process')} exited 0 in "
                    f"{elapsed:.1f} s")
        return EXIT_OK
    if outcome == "failed":
        mux.say(describe_failure(job, failed, returncode, others))
        return EXIT_FAILED
    names = ", ".join(f"{c.name} (pid {c.pid})" for c in others) or "none"
    if outcome == "timeout":
        mux.say(f"timeout after {args.timeout:g} s; killed "
                f"{len(others)} still running: {names}")
        return EXIT_TIMEOUT
    signame = signal.Signals(job.signal_received).name
    mux.say(f"got {signame}; stopped {len(others)} still running: {names}")
    return 128 + job.signal_received


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.make_key is not None:
        return make_key(args.make_key)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
