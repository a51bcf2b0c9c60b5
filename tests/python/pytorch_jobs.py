"""Runs examples/pytorch/mnist_ps.py through the tracker for the failure
tests: a whole job (its final weights as bytes, via --dump-weights), or a
job that the test harms as it runs (kill -9 of a process, found by the
`<role> <rank>: pid N` line it prints, once worker 0 logged a step)."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, module_path

DATA = os.path.join(ROOT, "data", "mnist")
SCRIPT = os.path.join(ROOT, "examples", "pytorch", "mnist_ps.py")
needs_mnist = pytest.mark.skipif(not os.path.exists(
    os.path.join(DATA, "train-images-idx3-ubyte")),
    reason="MNIST not in data/mnist (scripts/fetch_mnist.sh data/mnist)")

# 30 steps of batch 32 per worker, a log line per step.
ARGS = ["--data-dir", DATA, "--train-limit", "1920", "--test-limit", "200",
        "--max-steps", "30", "--log-every", "1"]


class Job:
    """A launched job whose output is read as it comes (a thread keeps it
    in .lines); .wait() returns (exit code, output)."""

    def __init__(self, servers, workers, args, launch_args=(), env=None,
                 timeout=180):
        e = dict(os.environ)
        e["PYTHONPATH"] = module_path() + os.pathsep + e.get("PYTHONPATH", "")
        e.update(env or {})
        cmd = [sys.executable, os.path.join(ROOT, "tracker", "launch.py"),
               "-s", str(servers), "-w", str(workers), "--timeout",
               str(timeout)] + list(launch_args) + [
               "--", sys.executable, SCRIPT] + list(args)
        self.timeout = timeout
        self.lines = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def output(self):
        with self._cond:
            return "".join(self.lines)

    def wait_for(self, pattern, timeout=120):
        """The first match of `pattern` in the output, waiting for it."""
        deadline = time.time() + timeout
        with self._cond:
            while True:
                m = re.search(pattern, "".join(self.lines), re.M)
                if m:
                    return m
                left = deadline - time.time()
                if left <= 0 or (self.proc.poll() is not None
                                 and not self._reader.is_alive()):
                    raise AssertionError(f"no {pattern!r} in:\n" +
                                         "".join(self.lines))
                self._cond.wait(min(left, 1.0))

    def pid(self, role, rank):
        return int(self.wait_for(rf"\] {role} {rank}: pid (\d+)$").group(1))

    def kill_at_step(self, role, rank, step):
        """kill -9 of `role rank` once worker 0 logged `step`."""
        pid = self.pid(role, rank)
        self.wait_for(rf"\[worker 0\] worker 0: epoch \d+ step {step} ")
        os.kill(pid, signal.SIGKILL)

    def wait(self):
        try:
            self.proc.wait(timeout=self.timeout + 30)
        finally:
            if self.proc.poll() is None:  # the launcher's group and its jobs
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self._reader.join(timeout=10)
        return self.proc.returncode, self.output()


def run(servers, workers, args, **kw):
    return Job(servers, workers, args, **kw).wait()


def weights_of(rc, out, path):
    """The dumped final weights of a job that must have exited 0."""
    assert rc == 0, out
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) == 1199882 * 4, len(data)
    return data
