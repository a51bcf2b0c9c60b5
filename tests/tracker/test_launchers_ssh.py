"""launch.py --launcher ssh through a real sshd that the test starts.

The sshd runs in a network namespace the test makes (unshare --net), on
127.0.0.1 and 127.0.0.2 there, with a throwaway host key and client key;
the launcher runs in that namespace too (nsenter), and the hostfile names
both addresses, so that the processes are spread over two "hosts". The
jobs are tests/core's kv_job and a short mnist_dist run; every test checks
that no process of the job is left.
"""

import hashlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from cluster_tools import (KV_JOB, LAUNCH, MNIST_DATA, MNIST_DIST, MNIST_PINNED,
                           RUN_TIMEOUT, LauncherCase, Sshd, marked_processes,
                           need, temp_dir, wait_for)

# Prints what a process sees of the job's key (a pipe, PS_KEY_FD), and on
# how many command lines of this machine the key appears.
KEY_PROBE = r'''
import hashlib, os, stat, sys
fd = int(os.environ["PS_KEY_FD"])
kind = "pipe" if stat.S_ISFIFO(os.fstat(fd).st_mode) else "other"
data = b""
while b"\n" not in data:
    chunk = os.read(fd, 4096)
    if not chunk:
        break
    data += chunk
key = data.split(b"\n")[0].decode()
leaks = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            leaks += key.encode() in f.read()
    except OSError:
        pass
print(os.environ["DMLC_ROLE"], kind, "PS_KEY_FILE" in os.environ,
      hashlib.sha256(key.encode()).hexdigest() == sys.argv[1], "leaks",
      leaks)
'''


class SshLauncherTest(LauncherCase):

    @classmethod
    def setUpClass(cls):
        need("sshd", "ssh", "ssh-keygen", root=True)
        cls.dir = Path(temp_dir(cls))
        cls.sshd = Sshd(cls.dir)
        cls.addClassCleanup(cls.sshd.stop)
        cls.hostfile = cls.dir / "hosts"
        cls.hostfile.write_text("# two addresses of this machine\n"
                                "127.0.0.1 slots=2\n127.0.0.2 slots=2\n")

    def launch_argv(self, flags, program):  # In the sshd's namespace.
        return self.sshd.enter + super().launch_argv(flags, program)

    def flags(self, servers, workers, *extra):
        return ["--launcher", "ssh", "-H", str(self.hostfile),
                *self.sshd.args(), "-s", str(servers), "-w", str(workers),
                *extra]

    def test_kv_job_over_ssh(self):
        result = self.launch(self.flags(2, 3), [str(KV_JOB), "sum"])
        # Slots 127.0.0.1, 127.0.0.1, 127.0.0.2, 127.0.0.2: servers first,
        # then workers, cyclically; the scheduler on the first host.
        self.assert_kv_sum(result, 2, 3, tags=[
            "server 0 @127.0.0.1", "server 1 @127.0.0.1",
            "worker 0 @127.0.0.2", "worker 1 @127.0.0.2",
            "worker 2 @127.0.0.1"])
        self.assert_none_left()

    def test_mnist_dist_trains_over_ssh(self):
        need(files=(MNIST_DIST, MNIST_DATA / "train-images-idx3-ubyte"))
        result = self.launch(self.flags(1, 2), [
            str(MNIST_DIST), *MNIST_PINNED, "--data_dir", str(MNIST_DATA),
            "--train_limit", "4000", "--test_limit", "1000", "--threads", "1"])
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        # Slots: server 0, worker 0 on 127.0.0.1; worker 1 on 127.0.0.2.
        self.assertIn("[worker 1 @127.0.0.2] worker 1 final: 63 steps",
                      result.stdout)
        match = re.search(r"(?m)^\[worker 0 @127\.0\.0\.1\] final: test "
                          r"accuracy ([\d.]+)%", result.stdout)
        self.assertIsNotNone(match, result.stdout[-3000:])
        self.assertGreaterEqual(float(match.group(1)), 85.0)
        self.assertRegex(self.last_line(result),
                         r"^launch: all 4 processes exited 0 in [\d.]+ s$")
        self.assert_none_left()

    def test_a_killed_worker_is_restarted_over_ssh_and_rejoins(self):
        need(files=(MNIST_DIST, MNIST_DATA / "train-images-idx3-ubyte"))
        result = self.launch(self.flags(1, 2, "--max-restarts", "1"), [
            str(MNIST_DIST), *MNIST_PINNED, "--data_dir", str(MNIST_DATA),
            "--train_limit", "4000", "--test_limit", "1000", "--threads", "1",
            "--die_node", "worker:1", "--die_after_steps", "20"])
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn("worker 1 on 127.0.0.2 was killed by signal SIGKILL",
                      result.stderr)
        self.assertIn("[worker 1 @127.0.0.2] worker 1 rejoined at step 20",
                      result.stdout)
        self.assertIn("[worker 1 @127.0.0.2] worker 1 final: 63 steps",
                      result.stdout)
        self.assertRegex(self.last_line(result),
                         r"^launch: all 4 processes exited 0 in [\d.]+ s; "
                         r"worker 1 was restarted 1 time "
                         r"\(--max-restarts 1\)$")
        self.assert_none_left()

    def test_insecure_sends_no_key(self):
        result = self.launch(self.flags(1, 2, "--insecure"),
                             [str(KV_JOB), "sum"])
        self.assert_kv_sum(result, 1, 2)
        self.assertIn("launch: --insecure: traffic is neither authenticated "
                      "nor encrypted", result.stderr)
        self.assert_none_left()

    def test_a_killed_worker_stops_every_remote_process(self):
        result = self.launch(self.flags(2, 3), [str(KV_JOB), "kill-worker"])
        self.assertEqual(result.returncode, 1, result.stderr)
        # A node may declare it dead first (its connection closed).
        self.assertRegex(self.last_line(result),
                         r"^launch: worker 0 on 127.0.0.2 (was declared dead "
                         r"by [a-z]+( \d+)?: .*; it )?was killed by signal "
                         r"SIGKILL \(remote exit status 137\); stopped the "
                         r"other \d processes$")
        self.assert_none_left()

    def test_sigint_stops_every_remote_process(self):
        with subprocess.Popen(
                self.launch_argv(self.flags(1, 2), ["/bin/sleep", "300"]),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True) as proc:
            try:
                wait_for(lambda: len(marked_processes(self.mark)) >= 4,
                         "4 remote sleeps")
                proc.send_signal(signal.SIGINT)
                _, err = proc.communicate(timeout=RUN_TIMEOUT)
            finally:
                if proc.poll() is None:
                    proc.kill()
        self.assertEqual(proc.returncode, 130, err)
        self.assertRegex(err.splitlines()[-1],
                         r"^launch: got SIGINT; stopped 4 still running: "
                         r"scheduler on 127.0.0.1, ")
        self.assert_none_left()

    def test_a_killed_launcher_leaves_no_remote_process(self):
        proc = subprocess.Popen(
            self.launch_argv(self.flags(1, 1), ["/bin/sleep", "300"]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: len(marked_processes(self.mark)) >= 3,
                     "3 remote sleeps")
        finally:
            proc.kill()  # No cleanup of its own: the sessions' ends do it.
            proc.wait()
        self.assert_none_left()

    def test_the_key_reaches_each_host_through_the_session(self):
        key = self.dir / f"job-{self.mark}.key"
        subprocess.run([sys.executable, str(LAUNCH), "--make-key", str(key)],
                       check=True, capture_output=True, timeout=60)
        self.addCleanup(key.unlink)
        probe = self.dir / "key_probe.py"
        probe.write_text(KEY_PROBE)
        digest = hashlib.sha256(key.read_text().strip().encode()).hexdigest()

        def key_dirs():  # What ssh launches wrote before: ps-key-XXXXXX.
            tmp = tempfile.gettempdir()
            return {n for n in os.listdir(tmp) if n.startswith("ps-key-")}
        key_dirs_before = key_dirs()
        result = self.launch(self.flags(1, 2, "--key-file", str(key)),
                             [sys.executable, str(probe), digest])
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = [line.split("] ", 1)[1].split()
                 for line in result.stdout.splitlines()]
        self.assertEqual(sorted(line[0] for line in lines),
                         ["scheduler", "server", "worker", "worker"])
        for role, kind, has_file, same, _, leaks in lines:
            # Through a pipe from the remote shell: no file on either side.
            self.assertEqual((kind, has_file, same), ("pipe", "False",
                                                      "True"), role)
            self.assertEqual(leaks, "0", role)  # On no command line.
        self.assertEqual(key_dirs() - key_dirs_before, set())
        self.assert_none_left()


if __name__ == "__main__":
    unittest.main()
