"""The job's key: Z85, a new key per job handed to local processes in a
memfd (PS_KEY_FD) and gone with the job even when the launcher is killed
with SIGKILL, --key-file, --insecure, --make-key, and the reaper of the key
files that mpi and slurm jobs use.

Every launch is bounded by a subprocess timeout, every wait by a deadline.
"""

import fcntl
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

from test_launch import LAUNCH, RUN_TIMEOUT, LaunchCase, alive, launch

# The seals of the key's memfd: nobody can change it.
SEALED = (fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
          | fcntl.F_SEAL_WRITE)


class Z85Test(unittest.TestCase):

    # ZeroMQ's RFC 32 test vector.
    VECTOR = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])

    def test_rfc32_vector(self):
        self.assertEqual(launch.z85_encode(self.VECTOR), "HelloWorld")
        self.assertEqual(launch.z85_decode("HelloWorld"), self.VECTOR)

    def test_round_trip_and_extremes(self):
        for data in [b"", bytes(32), b"\xff" * 32, os.urandom(32)]:
            text = launch.z85_encode(data)
            self.assertEqual(len(text), len(data) * 5 // 4)
            self.assertEqual(launch.z85_decode(text), data)
        self.assertEqual(launch.z85_encode(b"\xff" * 4), "%nSc0")

    def test_bad_input_is_refused(self):
        with self.assertRaises(ValueError):
            launch.z85_encode(b"abc")
        for text, why in [("Hello", None), ("HelloWorl", "multiple of 5"),
                          ("Hello Worl", "not a Z85 character"),
                          ("HelloWorl~", "not a Z85 character"),
                          ("%nSc1", "more than 32 bits"),
                          ("#####", "more than 32 bits")]:
            with self.subTest(text=text):
                if why is None:
                    launch.z85_decode(text)
                    continue
                with self.assertRaisesRegex(ValueError, why):
                    launch.z85_decode(text)

    def test_agrees_with_pyzmq(self):
        try:
            from zmq.utils import z85
        except ImportError:
            self.skipTest(f"pyzmq (python3-zmq) is not installed for "
                          f"{sys.executable}")
        for _ in range(100):
            data = os.urandom(32)
            self.assertEqual(launch.z85_encode(data).encode(),
                             z85.encode(data))
            self.assertEqual(launch.z85_decode(z85.encode(data).decode()),
                             data)
        self.assertEqual(z85.encode(self.VECTOR), b"HelloWorld")


class KeyTest(LaunchCase):
    """A new key per job in a memfd (PS_KEY_FD), --key-file (PS_KEY_FILE),
    --insecure, --make-key."""

    def assert_valid_key(self, key):
        self.assertEqual(len(key), 40)
        self.assertEqual(len(launch.z85_decode(key)), 32)

    def test_each_job_gets_a_new_key_in_a_sealed_memfd(self):
        env = dict(os.environ, PS_KEY_FILE="/inherited/is/removed",
                   PS_KEY_FD="99",
                   PS_JOB_TOKEN="inherited-is-removed-with-a-key")
        result = self.launch(["-s", "2", "-w", "2"], "key", env=env)
        self.assertEqual(result.returncode, 0, result.stderr)
        seen = self.key_outputs(result)
        self.assertEqual(len(seen), 5)
        self.assertEqual(len({json.dumps(g) for g in seen.values()}), 1,
                         seen)  # The same descriptor and key for all.
        got = seen["scheduler"]
        self.assertEqual(got["path"], None)
        self.assertEqual(got["fd"], "/memfd:ps-job-key")
        self.assertEqual(got["seals"], SEALED)
        self.assert_valid_key(got["key"])
        self.assertNotIn("insecure", result.stderr)

        again = self.key_outputs(self.launch(["-s", "1", "-w", "1"], "key"))
        self.assertNotEqual(again["worker 0"]["key"], got["key"])

    def test_insecure_passes_no_key_but_a_token_of_the_job(self):
        env = dict(os.environ, PS_KEY_FILE="/inherited/is/removed",
                   PS_KEY_FD="99",
                   PS_JOB_TOKEN="inherited-is-replaced-by-a-new-one")
        result = self.launch(["-s", "1", "-w", "2", "--insecure"], "key",
                             env=env)
        self.assertEqual(result.returncode, 0, result.stderr)
        seen = self.key_outputs(result)
        self.assertEqual(len(seen), 4)
        token = seen["scheduler"].get("token", "")
        self.assertRegex(token, r"^[0-9a-f]{32}$")
        self.assertEqual(list(seen.values()),
                         [{"path": None, "token": token}] * 4)
        again = self.key_outputs(self.launch(
            ["-s", "1", "-w", "1", "--insecure"], "key"))
        self.assertNotEqual(again["worker 0"]["token"], token)
        notes = [line for line in result.stderr.splitlines()
                 if "insecure" in line]
        self.assertEqual(notes, ["launch: --insecure: traffic is neither "
                                 "authenticated nor encrypted"])

    def test_make_key_then_key_file(self):
        path = self.dir / "job.key"
        made = subprocess.run([sys.executable, str(LAUNCH), "--make-key",
                               str(path)], capture_output=True, text=True,
                              timeout=RUN_TIMEOUT)
        self.assertEqual(made.returncode, 0, made.stderr)
        self.assertEqual(stat.S_IMODE(path.stat().st_mode), 0o600)
        content = path.read_text()
        self.assertRegex(content, r"^\S{40}\n$")
        self.assert_valid_key(content[:40])

        again = subprocess.run([sys.executable, str(LAUNCH), "--make-key",
                                str(path)], capture_output=True, text=True,
                               timeout=RUN_TIMEOUT)
        self.assertEqual(again.returncode, 2)
        self.assertIn(str(path), again.stderr)
        self.assertIn("exists", again.stderr)
        self.assertEqual(path.read_text(), content)

        result = self.launch(["-s", "1", "-w", "1", "--key-file", str(path)],
                             "key")
        self.assertEqual(result.returncode, 0, result.stderr)
        seen = self.key_outputs(result)
        self.assertEqual(len(seen), 3)
        for got in seen.values():
            self.assertTrue(os.path.samefile(got["path"], path))
            self.assertEqual(got["key"], content[:40])
            self.assertNotIn("fd", got)
        self.assertTrue(path.exists())  # The user's file is kept.
        self.assertNotIn("warning", result.stderr)

    def test_key_file_open_to_others_is_used_with_a_warning(self):
        path = self.dir / "open.key"
        path.write_text(launch.z85_encode(os.urandom(32)) + "\n")
        path.chmod(0o644)
        result = self.launch(["-s", "1", "-w", "1", "--key-file", str(path)],
                             "key")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"warning: --key-file '{path}'", result.stderr)
        self.assertIn("0644", result.stderr)

    def test_bad_key_files_are_usage_errors(self):
        def key_file(name, content):
            path = self.dir / name
            path.write_bytes(content)
            path.chmod(0o600)
            return path
        good = launch.z85_encode(bytes(range(32)))
        cases = [
            (self.dir / "missing.key", "not found"),
            (self.dir, "not a file"),
            (key_file("empty.key", b""), "0 characters"),
            (key_file("short.key", good[:35].encode() + b"\n"),
             "35 characters"),
            (key_file("long.key", (good + "12345\n").encode()),
             "45 characters"),
            (key_file("char.key", ("~" + good[1:]).encode()),
             "not a Z85 character"),
            (key_file("big.key", ("#####" + good[5:]).encode()),
             "more than 32 bits"),
            (key_file("binary.key", b"\xff" * 40), "not ASCII"),
        ]
        for path, message in cases:
            with self.subTest(path=path.name):
                result = subprocess.run(
                    [sys.executable, str(LAUNCH), "-s", "1", "-w", "1",
                     "--key-file", str(path), "--", "true"],
                    capture_output=True, text=True, timeout=RUN_TIMEOUT)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(f"--key-file '{path}'", result.stderr)
                self.assertIn(message, result.stderr)
                self.assertEqual(result.stdout, "")


def memfd_key(pid):
    """(inode, line) of the key's memfd that process pid holds, or None."""
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            if os.readlink(fd).startswith("/memfd:ps-job-key"):
                with open(fd, "rb") as f:
                    return os.fstat(f.fileno()).st_ino, f.read().strip()
        except OSError:
            continue
    return None


def holders(inode):
    """The pids of the processes that hold a memfd of this inode."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = f"/proc/{pid}/fd/{fd}"
                if (os.readlink(link).startswith("/memfd:")
                        and os.stat(link).st_ino == inode):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def files_holding(roots, needle, limit=1 << 20):
    """The files under roots (files or directories) that hold needle (those
    over limit bytes are skipped), and the directories named like a key's
    (ps-key-*)."""
    found, paths = [], []
    for root in roots:
        if not os.path.isdir(root):
            paths.append(root)
            continue
        for top, dirs, names in os.walk(root, onerror=lambda err: None):
            found += [os.path.join(top, d) for d in dirs
                      if d.startswith("ps-key-")]
            paths += [os.path.join(top, name) for name in names]
    for path in paths:
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_size <= limit:
                with open(path, "rb") as f:
                    if needle in f.read():
                        found.append(path)
        except OSError:
            continue
    return found


class KilledLauncherTest(LaunchCase):
    """kill -9 of the launcher mid-job: no file or directory holds the key
    (in its TMPDIR, nor new in the system's temp dir), no process holds
    its memfd, and the job's processes are gone (SIGKILL when their parent
    dies), all within bounded waits."""

    def wait(self, test, what, timeout=10):
        end = time.monotonic() + timeout
        while not test():
            self.assertLess(time.monotonic(), end, f"waited for {what}")
            time.sleep(0.02)

    def test_kill_9_of_the_launcher_leaves_no_key_and_no_process(self):
        system_tmp = tempfile.gettempdir()
        before = set(os.listdir(system_tmp))
        own_tmp = self.dir / "launcher-tmp"
        own_tmp.mkdir()
        env = dict(os.environ, TMPDIR=str(own_tmp))
        cmd = [sys.executable, str(LAUNCH), "-s", "1", "-w", "2", "--",
               sys.executable, str(self.child), "sleep", str(self.pids)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)
        try:
            self.wait(lambda: len(list(self.pids.glob("*.keyfd"))) == 4,
                      "4 processes that read the key")
            inode, key = memfd_key(proc.pid)
        finally:
            proc.kill()
            proc.wait(timeout=RUN_TIMEOUT)
        self.assertEqual(len(key), 40)
        pids = self.pid_values()
        self.assertEqual(len(pids), 4)
        self.wait(lambda: not any(alive(p) for p in pids),
                  "the job's processes to go")
        self.assertEqual(holders(inode), [])
        self.assertEqual(list(own_tmp.iterdir()), [])
        new = [os.path.join(system_tmp, n)
               for n in set(os.listdir(system_tmp)) - before]
        self.assertEqual(files_holding(new + [str(self.dir)], key), [])


# Prints the path of a new JobKey (with its reaper), then sleeps.
MAKES_A_KEY_FILE = r'''
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("launch", sys.argv[1])
launch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launch)
key = launch.JobKey(parent=sys.argv[2])
print(key.path, flush=True)
time.sleep(60)
'''


class KeyFileReaperTest(unittest.TestCase):
    """mpi and slurm: the key file's directory goes with the launcher, kill
    -9 included (its reaper), and at once on remove()."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self._tmp.name)
        self.addCleanup(self._tmp.cleanup)

    def test_a_killed_launcher_leaves_no_key_file(self):
        proc = subprocess.Popen(
            [sys.executable, "-c", MAKES_A_KEY_FILE, str(LAUNCH),
             str(self.dir)], stdout=subprocess.PIPE, text=True)
        try:
            path = proc.stdout.readline().strip()
            self.assertTrue(os.path.isfile(path), path)
            self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        finally:
            proc.kill()
            proc.wait(timeout=RUN_TIMEOUT)
            proc.stdout.close()
        end = time.monotonic() + 10
        while os.path.exists(os.path.dirname(path)):
            self.assertLess(time.monotonic(), end, "the reaper is late")
            time.sleep(0.02)
        self.assertEqual(list(self.dir.iterdir()), [])

    def test_remove_removes_it_and_ends_the_reaper(self):
        key = launch.JobKey(parent=str(self.dir))
        reaper = key._reaper
        self.assertIsNone(launch.check_key_file(key.path))
        key.remove()
        self.assertEqual(list(self.dir.iterdir()), [])
        self.assertIsNotNone(reaper.poll())


if __name__ == "__main__":
    unittest.main()
