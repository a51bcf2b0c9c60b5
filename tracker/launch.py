#!/usr/bin/env python3
"""Launches a ps job on this machine: one scheduler, S servers, W workers.

Every process runs the same PROGRAM ARGS; its role comes from the
environment (ps-lite style). Output lines are prefixed with the role and
rank; the first process to fail stops the others. Standard library only.
"""

import argparse
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124

# Variables the launcher sets per process; --env may not override them.
RESERVED_ENV = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
                "DMLC_NUM_SERVER", "DMLC_NUM_WORKER", "PS_RANK")

# How often the main loop wakes to notice a signal or the deadline.
POLL_SECONDS = 0.05

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
  OMP_WAIT_POLICY    PASSIVE, unless already set: all processes share this
                     machine's cores, and OpenMP threads that spin while
                     idle (the default) take them from the other processes
  KEY=VALUE          for every --env KEY=VALUE

Every line a process writes to stdout or stderr is copied to the launcher's
stdout or stderr with a prefix: "[scheduler] ", "[server 0] ", "[worker 1] ".
The processes start in their own process groups. When one exits non-zero
or is killed by a signal, the launcher stops the rest (SIGTERM to each
group, SIGKILL after --grace seconds) and names the one that failed first
on its last line. SIGINT or SIGTERM to the launcher stops them likewise.
"""

EPILOG = """\
exit status:
  0    every process exited 0
  1    a process exited non-zero or was killed by a signal
  2    usage error (bad flags, PROGRAM missing, not found or not executable)
  124  --timeout expired; the processes still running were killed
  130/143  the launcher got SIGINT/SIGTERM and stopped the processes

example:
  python3 tracker/launch.py -s 2 -w 2 -- build/bench/kv/kv_bench --iters 10
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

    def start_reader(self, pipe, prefix, stream):
        thread = threading.Thread(target=self._copy,
                                  args=(pipe, prefix.encode(), stream),
                                  daemon=True)
        thread.start()
        return thread

    def _copy(self, pipe, prefix, stream):
        with pipe:
            for line in iter(pipe.readline, b""):
                if not line.endswith(b"\n"):
                    line += b"\n"
                self.write(stream, prefix + line)


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
    parser.add_argument("-s", "--num-servers", type=int, required=True,
                        metavar="S", help="number of servers (>= 0)")
    parser.add_argument("-w", "--num-workers", type=int, required=True,
                        metavar="W", help="number of workers (>= 1)")
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
    parser.add_argument("--timeout", type=float, default=None,
                        metavar="SECONDS",
                        help="bound on the whole job; on expiry kill all and "
                        "exit 124 (default: none)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        metavar="-- PROGRAM [ARGS...]",
                        help="the program every process runs, and its "
                        "arguments")
    args = parser.parse_args(argv)

    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
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
    args.command[0] = resolve_program(args.command[0])
    return args


def child_env(args, port, role, rank):
    env = dict(os.environ)
    env.pop("PS_RANK", None)
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
        self.children = []
        self.exits = queue.Queue()  # (child, returncode) in reaping order.
        self.signal_received = None

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
                    env=child_env(self.args, port, role, rank),
                    start_new_session=True)
            except OSError as err:
                self.mux.say(f"cannot start {child.name}: {err}")
                self.stop(self.children)
                return False
            self.children.append(child)
            prefix = f"[{child.name}] "
            child.readers = [
                self.mux.start_reader(child.proc.stdout, prefix, sys.stdout),
                self.mux.start_reader(child.proc.stderr, prefix, sys.stderr),
            ]
            threading.Thread(target=self._reap, args=(child,),
                             daemon=True).start()
        return True

    def _reap(self, child):
        self.exits.put((child, child.proc.wait()))

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
            if returncode != 0:
                return "failed", child, returncode
        return "done", None, None

    def running(self):
        return [c for c in self.children if c.proc.poll() is None]

    def stop(self, children):
        """SIGTERM each group, SIGKILL after the grace; reaps the leaders."""
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


def run(args):
    mux = OutputMux()
    try:
        port = args.port or free_port(args.host)
    except OSError as err:
        usage_error(f"cannot bind a port on --host {args.host}: {err}")
    job = Job(args, mux)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, job.on_signal)
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
        mux.say(f"all {plural(total, 'process')} exited 0 in {elapsed:.1f} s")
        return EXIT_OK
    if outcome == "failed":
        stopped = (f"stopped the other {plural(len(others), 'process')}"
                   if others else "no other process was running")
        mux.say(f"{failed.name} (pid {failed.pid}) {describe_exit(returncode)}"
                f"; {stopped}")
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
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
