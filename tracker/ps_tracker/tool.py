"""What --launcher mpi and slurm share: one mpirun or srun starts every
process, each through "launch.py --as-rank" (rank.py), whose output comes
tagged already and which says which process failed first."""

import os
import re
import subprocess
import sys

from .common import describe_exit
from .env import RESERVED_ENV
from .supervisor import Child, Job

# The command that mpirun and srun run for each rank (with --as-rank).
LAUNCH_PY = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "launch.py")

# What "launch.py --as-rank" (the mpi and slurm launchers' per-process
# shim) writes when its program fails: the launcher names the first one.
RANK_EXIT = re.compile(
    rb"launch: (scheduler|server \d+|worker \d+) \(pid \d+\) on (\S+) "
    rb"(exited with code \d+|was killed by signal \w+)$")

# The tag a shim puts before each line of its program: "[server 0 @host] ".
RANK_TAG = re.compile(rb"^\[(scheduler|server \d+|worker \d+)(?: @\S+)?\] ")


class ToolJob(Job):
    """mpi and slurm: one mpirun or srun starts every process, each through
    "launch.py --as-rank" (as_rank), whose output comes tagged already."""

    def __init__(self, args, mux):
        super().__init__(args, mux)
        # (name, host, how) of the processes that failed, in the order read.
        self._rank_exits = []

    def start(self, port):
        argv, env = self.command(port)
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

    def command(self, port):
        """(argv, env) of the mpirun or srun that starts every process."""
        raise NotImplementedError

    def shim(self):
        """What each rank runs: "launch.py --as-rank -- PROGRAM ARGS",
        which takes its role from its rank."""
        return [sys.executable, LAUNCH_PY, "--as-rank", "--",
                *self.args.command]

    def base_env(self):
        """The launcher's environment less what it sets per process."""
        env = dict(os.environ)
        for name in RESERVED_ENV + ("DMLC_NODE_HOST",):
            env.pop(name, None)
        return env

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
            parts.append(f"{name} was cut off: {reason}" if name == reporter
                         else f"{name} was declared dead by {reporter}: "
                         f"{reason}")
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
