"""Tests tracker/launch.py end to end with tiny Python child programs.

Each child is tests' own script (written to a temp dir) run as
`python3 child.py MODE`; it reads DMLC_ROLE / PS_RANK and behaves by MODE.
Every launch is bounded by a subprocess timeout.
"""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

LAUNCH = Path(__file__).resolve().parents[2] / "tracker" / "launch.py"
RUN_TIMEOUT = 10  # Seconds; no launch below takes more than ~2.

_spec = importlib.util.spec_from_file_location("launch", LAUNCH)
launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launch)

CHILD = r'''
import hashlib, json, os, signal, subprocess, sys, time
mode, out = sys.argv[1], sys.argv[2]
role, rank = os.environ["DMLC_ROLE"], os.environ.get("PS_RANK")
me = role if rank is None else f"{role}{rank}"
with open(os.path.join(out, me + ".pid"), "w") as f:
    f.write(str(os.getpid()))
if "PS_KEY_FILE" in os.environ:
    with open(os.path.join(out, me + ".keyfile"), "w") as f:
        f.write(os.environ["PS_KEY_FILE"])
KEY = None  # The SHA-256 of the key's line read from PS_KEY_FD.
if "PS_KEY_FD" in os.environ:
    line = os.pread(int(os.environ["PS_KEY_FD"]), 4096, 0).split(b"\n")[0]
    KEY = hashlib.sha256(line).hexdigest()
    with open(os.path.join(out, me + ".keyfd"), "w") as f:
        f.write(KEY)

def wait_for_pids(n):  # Until all n processes have written their pid.
    end = time.time() + 10
    while time.time() < end:
        if len([p for p in os.listdir(out) if p.endswith(".pid")]) >= n:
            return
        time.sleep(0.01)

def state(name):  # Of a process by its pid file: "R", "S", "T", ..., "gone".
    with open(os.path.join(out, name + ".pid")) as f:
        pid = f.read()
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"

def wait_until(test):
    end = time.time() + 10
    while not test() and time.time() < end:
        time.sleep(0.01)

def declare_dead(name, why):  # As the library logs it (glog).
    print(f"E1123 11:22:33.444555  4242 postoffice.cc:123] {name} "
          f"(tcp://127.0.0.1:40123) was declared dead: {why}",
          file=sys.stderr, flush=True)

HEARTBEAT = "no heartbeat for more than 10000 ms (PS_HEARTBEAT_TIMEOUT_MS)"

RUN_KEYS = ["PS_RANK", "PS_KEY_FD", "PS_MAX_RESTARTS", "PS_RESTART_COUNT",
            "DMLC_PS_ROOT_PORT"]

def runs(name):  # How many runs of a process have started.
    try:
        with open(os.path.join(out, name + ".runs")) as f:
            return len(f.readlines())
    except FileNotFoundError:
        return 0

def record_run():  # A JSON line per run in ME.runs; the run's number.
    got = {"pid": os.getpid(), "key": KEY,
           **{k: os.environ.get(k) for k in RUN_KEYS}}
    with open(os.path.join(out, me + ".runs"), "a") as f:
        f.write(json.dumps(got) + "\n")
    run = runs(me)
    with open(os.path.join(out, f"{me}.run{run}.pid"), "w") as f:
        f.write(str(os.getpid()))
    print(f"{me} run {run}", flush=True)
    return run

def leave_grandchild(run):  # A process in this one's group, left behind.
    grandchild = subprocess.Popen(["sleep", "60"])
    with open(os.path.join(out, f"{me}.run{run}.grandchild.pid"), "w") as f:
        f.write(str(grandchild.pid))

if mode == "env":
    keys = ["DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
            "DMLC_NUM_SERVER", "DMLC_NUM_WORKER", "DMLC_NODE_HOST",
            "PS_RANK", "EXTRA", "INHERITED", "OMP_WAIT_POLICY"]
    print(json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
elif mode == "key":
    path, fd = os.environ.get("PS_KEY_FILE"), os.environ.get("PS_KEY_FD")
    got = {"path": path}
    if path is not None:
        got["mode"] = os.stat(path).st_mode & 0o7777
        got["dir_mode"] = os.stat(os.path.dirname(path)).st_mode & 0o7777
        with open(path) as f:
            got["key"] = f.readline().rstrip("\n")
    if fd is not None:  # What it is, its seals; the key from its start.
        import fcntl
        got["fd"] = os.readlink(f"/proc/self/fd/{fd}").split(" ")[0]
        got["seals"] = fcntl.fcntl(int(fd), fcntl.F_GET_SEALS)
        got["key"] = os.pread(int(fd), 4096, 0).decode().rstrip("\n")
    if "PS_JOB_TOKEN" in os.environ:
        got["token"] = os.environ["PS_JOB_TOKEN"]
    print(json.dumps(got), flush=True)
elif mode == "chatter":
    for i in range(200):
        print(f"{me} out {i} " + "x" * (i * 50), flush=True)
        print(f"{me} err {i}", file=sys.stderr, flush=True)
    sys.stdout.write(f"{me} unterminated")
elif mode == "fail":
    n = int(sys.argv[3])
    if me == "server0":  # Makes the launcher escalate to SIGKILL.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        grandchild = subprocess.Popen(["sleep", "60"])
        with open(os.path.join(out, "grandchild.pid"), "w") as f:
            f.write(str(grandchild.pid))
    wait_for_pids(n)
    victim, how = sys.argv[4], sys.argv[5]
    if me == victim and how == "exit3":
        sys.exit(3)
    if me == victim and how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
elif mode == "dead":
    n, scenario = int(sys.argv[3]), sys.argv[4]
    wait_for_pids(n)
    if scenario in ("frozen", "frozen-late") and me == "server0":
        os.kill(os.getpid(), signal.SIGSTOP)  # Frozen: no more heartbeats.
    elif scenario == "frozen" and me == "worker0":
        wait_until(lambda: state("server0") == "T")
        declare_dead("server 0", HEARTBEAT)
        sys.exit(1)
    elif scenario == "frozen-late" and me == "worker0":
        wait_until(lambda: state("server0") == "T")
        sys.exit(1)  # Before the scheduler's report is read.
    elif scenario == "frozen-late" and me == "scheduler":
        wait_until(lambda: state("worker0") == "gone")
        declare_dead("server 0", HEARTBEAT)
    elif scenario == "cut" and me == "worker0":
        # Cut off from the scheduler alone: the scheduler and the other
        # members are well and say nothing.
        declare_dead("scheduler", HEARTBEAT)
        sys.exit(1)
    elif scenario == "scheduler-restarted" and me == "scheduler":
        # Its first run freezes; the second (the launcher restarted it on
        # the members' word) says so and ends.
        marker = os.path.join(out, "scheduler.froze")
        if not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGSTOP)
        open(os.path.join(out, "scheduler.back"), "w").close()
        sys.exit(0)
    elif scenario == "scheduler-restarted":
        back = os.path.join(out, "scheduler.back")
        # (The launcher may kill it on the others' word first.)
        wait_until(lambda: state("scheduler") in ("T", "gone")
                   or os.path.exists(back))
        if not os.path.exists(back):
            declare_dead("scheduler", HEARTBEAT)
        wait_until(lambda: os.path.exists(back))
        sys.exit(0)
    elif scenario == "scheduler-frozen" and me == "scheduler":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif scenario == "scheduler-frozen" and me != "scheduler":
        wait_until(lambda: state("scheduler") == "T")
        declare_dead("scheduler", HEARTBEAT)
        open(os.path.join(out, me + ".said"), "w").close()
        if me == "worker0":
            # Exits once every member said so (the launcher read them all).
            wait_until(lambda: all(
                os.path.exists(os.path.join(out, m + ".said"))
                for m in ("server0", "worker1")))
            sys.exit(1)
    elif scenario == "finalize" and me == "worker1":
        sys.exit(3)
    elif scenario == "finalize" and me == "scheduler":
        wait_until(lambda: state("worker1") == "gone")
        declare_dead("worker 1", "it stopped without Finalize")
    elif scenario == "decoy" and me == "worker0":
        for line in ["server 0 was declared dead: no address",
                     "myserver 0 (tcp://127.0.0.1:1) was declared dead: x",
                     "server 0 (tcp://127.0.0.1:1) was declared dead",
                     "server x (tcp://127.0.0.1:1) was declared dead: y"]:
            print(line, file=sys.stderr, flush=True)
        sys.exit(2)
    time.sleep(60)
elif mode == "restart":
    # restart N VICTIMS HOW OTHERS: the victims (e.g. "worker1,worker0")
    # fail as HOW says once all N processes have started; OTHERS: "sleep",
    # or R: exit 0 once every victim has started R runs.
    n, victims, how, others = int(sys.argv[3]), sys.argv[4].split(","), \
        sys.argv[5], sys.argv[6]
    run = record_run()
    wait_until(lambda: len([p for p in os.listdir(out)
                            if p.endswith(".runs")]) >= n)
    if me not in victims:
        if others != "sleep":
            wait_until(lambda: all(runs(v) >= int(others) for v in victims))
            sys.exit(0)
    elif how == "kill-once":  # SIGKILL in the first run; exit 0 after.
        if run == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(0)
    elif how == "exit3":
        sys.exit(3)
    elif how == "exit3-once":  # Exit 3 in the first run; hang after.
        leave_grandchild(run)
        if run == 1:
            sys.exit(3)
    time.sleep(60)
elif mode == "stale":
    # worker 0 reports worker 1 dead; worker 1 then dies, and is restarted;
    # the scheduler reports it dead again (late, after the restart); then
    # server 0 fails on its own.
    run = record_run()
    if me == "worker0":
        declare_dead("worker 1", "connection lost")
        open(os.path.join(out, "reported-early"), "w").close()
    elif me == "worker1" and run == 1:
        wait_until(lambda: os.path.exists(os.path.join(out,
                                                       "reported-early")))
        os.kill(os.getpid(), signal.SIGKILL)
    elif me == "scheduler":
        wait_until(lambda: runs("worker1") >= 2)
        declare_dead("worker 1", HEARTBEAT)
        open(os.path.join(out, "reported-late"), "w").close()
    elif me == "server0":
        wait_until(lambda: os.path.exists(os.path.join(out, "reported-late")))
        time.sleep(0.2)  # The launcher has read the report by then.
        sys.exit(3)
    time.sleep(60)
elif mode == "straggle":
    if me != "worker0":
        time.sleep(60)
elif mode == "sleep":
    time.sleep(60)
'''


def alive(pid):
    """True while pid is a live (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


class LaunchCase(unittest.TestCase):
    """A temp dir with the child script; launch() runs launch.py on it."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self._tmp.name)
        self.child = self.dir / "child.py"
        self.child.write_text(CHILD)
        self.pids = self.dir / "pids"
        self.pids.mkdir()

    def tearDown(self):
        for pid in self.pid_values():  # Never leave a stray behind.
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        self._tmp.cleanup()

    def pid_values(self):
        return [int(p.read_text()) for p in self.pids.glob("*.pid")
                if p.read_text()]

    def launch(self, flags, mode, *extra, env=None):
        cmd = [sys.executable, str(LAUNCH), *flags, "--", sys.executable,
               str(self.child), mode, str(self.pids), *extra]
        start = time.monotonic()
        result = subprocess.run(cmd, capture_output=True, text=True,
                                timeout=RUN_TIMEOUT, env=env)
        result.elapsed = time.monotonic() - start
        return result

    def assert_all_dead(self):
        pids = self.pid_values()
        self.assertTrue(pids)
        end = time.monotonic() + 3  # Orphans are reaped asynchronously.
        while any(alive(p) for p in pids) and time.monotonic() < end:
            time.sleep(0.02)
        self.assertEqual([p for p in pids if alive(p)], [])

    def last_line(self, result):
        return result.stderr.rstrip("\n").split("\n")[-1]

    def key_files_seen(self):
        return {p.read_text() for p in self.pids.glob("*.keyfile")}

    def assert_key_by_descriptor(self):
        """Every process read the same key from PS_KEY_FD; none had a key
        file."""
        self.assertEqual(self.key_files_seen(), set())
        keys = {p.read_text() for p in self.pids.glob("*.keyfd")}
        self.assertEqual(len(keys), 1, keys)

    def key_outputs(self, result):
        """{prefix: what the "key" child mode printed}."""
        return {line.split("] ", 1)[0][1:]: json.loads(line.split("] ", 1)[1])
                for line in result.stdout.splitlines()}



class LaunchTest(LaunchCase):

    def test_environment_of_each_role(self):
        env = dict(os.environ, INHERITED="kept", PS_RANK="99")
        result = self.launch(["-s", "2", "-w", "3", "--env", "EXTRA=a=b",
                              "--port", "23456"], "env", env=env)
        self.assertEqual(result.returncode, 0, result.stderr)
        seen = {}
        for line in result.stdout.splitlines():
            prefix, payload = re.fullmatch(r"\[([a-z]+(?: \d+)?)\] (.*)",
                                           line).groups()
            seen[prefix] = json.loads(payload)
        self.assertEqual(sorted(seen), ["scheduler", "server 0", "server 1",
                                        "worker 0", "worker 1", "worker 2"])
        for prefix, got in seen.items():
            role, _, rank = prefix.partition(" ")
            self.assertEqual(got, {
                "DMLC_ROLE": role, "DMLC_PS_ROOT_URI": "127.0.0.1",
                "DMLC_PS_ROOT_PORT": "23456", "DMLC_NUM_SERVER": "2",
                "DMLC_NUM_WORKER": "3", "DMLC_NODE_HOST": "127.0.0.1",
                "PS_RANK": rank or None, "EXTRA": "a=b",
                "INHERITED": "kept", "OMP_WAIT_POLICY": "PASSIVE"}, prefix)
        self.assertRegex(self.last_line(result),
                         r"^launch: all 6 processes exited 0 in [\d.]+ s$")

    def test_an_inherited_omp_wait_policy_is_kept(self):
        env = dict(os.environ, OMP_WAIT_POLICY="ACTIVE")
        result = self.launch(["-s", "1", "-w", "1"], "env", env=env)
        self.assertEqual(result.returncode, 0, result.stderr)
        policies = {json.loads(line.split("] ", 1)[1])["OMP_WAIT_POLICY"]
                    for line in result.stdout.splitlines()}
        self.assertEqual(policies, {"ACTIVE"})

    def test_free_port_is_picked_and_shared(self):
        result = self.launch(["-s", "1", "-w", "1"], "env")
        self.assertEqual(result.returncode, 0, result.stderr)
        ports = {json.loads(line.split("] ", 1)[1])["DMLC_PS_ROOT_PORT"]
                 for line in result.stdout.splitlines()}
        self.assertEqual(len(ports), 1)
        self.assertTrue(1024 <= int(ports.pop()) <= 65535)

    def test_every_line_is_prefixed_and_whole(self):
        result = self.launch(["-s", "1", "-w", "2"], "chatter")
        self.assertEqual(result.returncode, 0, result.stderr)
        names = {"scheduler": "scheduler", "server 0": "server0",
                 "worker 0": "worker0", "worker 1": "worker1"}
        counts = dict.fromkeys(names, 0)
        for line in result.stdout.splitlines():
            match = re.fullmatch(r"\[(\w+(?: \d)?)\] (\w+) out (\d+) (x*)",
                                 line)
            if match is None:
                self.assertIn(line, [f"[{p}] {n} unterminated"
                                     for p, n in names.items()])
                continue
            prefix, me, i, xs = match.groups()
            self.assertEqual(names[prefix], me)
            self.assertEqual(len(xs), int(i) * 50)
            counts[prefix] += 1
        self.assertEqual(counts, dict.fromkeys(names, 200))
        err_lines = result.stderr.splitlines()[:-1]  # Last: launch summary.
        self.assertEqual(len(err_lines), 4 * 200)
        for line in err_lines:
            prefix, me = re.fullmatch(r"\[(\w+(?: \d)?)\] (\w+) err \d+",
                                      line).groups()
            self.assertEqual(names[prefix], me)

    def test_failing_worker_stops_the_rest(self):
        result = self.launch(["-s", "2", "-w", "2", "--grace", "0.5"],
                             "fail", "6", "worker1", "exit3")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertLess(result.elapsed, 5)
        worker1 = int((self.pids / "worker1.pid").read_text())
        self.assertEqual(
            self.last_line(result),
            f"launch: worker 1 (pid {worker1}) exited with code 3; "
            "stopped the other 4 processes")
        self.assertTrue((self.pids / "grandchild.pid").exists())
        self.assert_all_dead()
        self.assert_key_by_descriptor()

    def test_child_killed_by_signal_is_named(self):
        result = self.launch(["-s", "1", "-w", "2", "--grace", "0.5"],
                             "fail", "5", "worker0", "kill")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertLess(result.elapsed, 5)
        worker0 = int((self.pids / "worker0.pid").read_text())
        self.assertEqual(
            self.last_line(result),
            f"launch: worker 0 (pid {worker0}) was killed by signal SIGKILL; "
            "stopped the other 3 processes")
        self.assert_all_dead()

    def test_timeout_names_the_stragglers(self):
        result = self.launch(["-s", "1", "-w", "2", "--timeout", "1",
                              "--grace", "0.5"], "straggle")
        self.assertEqual(result.returncode, 124, result.stderr)
        self.assertLess(result.elapsed, 5)
        pid = {p.stem: int(p.read_text()) for p in self.pids.glob("*.pid")}
        self.assertEqual(
            self.last_line(result),
            f"launch: timeout after 1 s; killed 3 still running: scheduler "
            f"(pid {pid['scheduler']}), server 0 (pid {pid['server0']}), "
            f"worker 1 (pid {pid['worker1']})")
        self.assert_all_dead()
        self.assert_key_by_descriptor()

    def test_sigterm_to_launcher_stops_children(self):
        cmd = [sys.executable, str(LAUNCH), "-s", "1", "-w", "1", "--grace",
               "0.5", "--", sys.executable, str(self.child), "sleep",
               str(self.pids)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        end = time.monotonic() + 10
        while len(self.pid_values()) < 3 and time.monotonic() < end:
            time.sleep(0.02)
        self.assertEqual(len(self.pid_values()), 3)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=RUN_TIMEOUT)
        self.assertEqual(proc.returncode, 128 + signal.SIGTERM, err)
        self.assertRegex(err.splitlines()[-1],
                         r"^launch: got SIGTERM; stopped 3 still running: ")
        self.assert_all_dead()
        self.assert_key_by_descriptor()

    def test_usage_errors_exit_2(self):
        not_executable = self.dir / "plain.txt"
        not_executable.write_text("not a program\n")
        cases = [
            (["-s", "-1", "-w", "1", "--", "true"], "-s/--num-servers"),
            (["-s", "1", "-w", "0", "--", "true"], "-w/--num-workers"),
            (["-s", "1", "-w", "1"], "missing PROGRAM"),
            (["-s", "1", "-w", "1", "--"], "missing PROGRAM"),
            (["-w", "1", "--", "true"], "-s/--num-servers"),
            (["-s", "1", "-w", "1", "--", "no-such-program-xyz"],
             "'no-such-program-xyz' not found"),
            (["-s", "1", "-w", "1", "--", str(not_executable)],
             "is not an executable file"),
            (["-s", "1", "-w", "1", "--", str(self.dir)],
             "is not an executable file"),
            (["-s", "1", "-w", "1", "--env", "NOEQUALS", "--", "true"],
             "KEY=VALUE"),
            (["-s", "1", "-w", "1", "--env", "DMLC_ROLE=x", "--", "true"],
             "cannot set DMLC_ROLE"),
            (["-s", "1", "-w", "1", "--timeout", "0", "--", "true"],
             "--timeout"),
            (["-s", "1", "-w", "1", "--env", "PS_KEY_FILE=x", "--", "true"],
             "cannot set PS_KEY_FILE"),
            (["-s", "1", "-w", "1", "--insecure", "--key-file", "k", "--",
              "true"], "--key-file"),
            (["--make-key", str(self.dir / "new.key"), "-s", "1"],
             "--make-key"),
            (["-s", "1", "-w", "1", "--max-restarts", "-1", "--", "true"],
             "--max-restarts must be >= 0, got -1"),
            (["-s", "1", "-w", "1", "--max-restarts", "x", "--", "true"],
             "--max-restarts: invalid int value"),
            (["-s", "1", "-w", "1", "--env", "PS_MAX_RESTARTS=1", "--",
              "true"], "cannot set PS_MAX_RESTARTS"),
            (["-s", "1", "-w", "1", "--env", "PS_RESTART_COUNT=1", "--",
              "true"], "cannot set PS_RESTART_COUNT"),
            (["-s", "1", "-w", "3", "--worker-customers", "2", "--", "true"],
             "-w/--num-workers 3 is not a multiple of --worker-customers 2"),
            (["-s", "1", "-w", "2", "--worker-customers", "0", "--", "true"],
             "--worker-customers must be >= 1, got 0"),
            (["-s", "1", "-w", "2", "--worker-customers", "2",
              "--max-restarts", "1", "--", "true"],
             "--max-restarts is not offered with --worker-customers"),
        ]
        for flags, message in cases:
            with self.subTest(flags=flags):
                result = subprocess.run(
                    [sys.executable, str(LAUNCH), *flags],
                    capture_output=True, text=True, timeout=RUN_TIMEOUT)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn(message, result.stderr)
                self.assertEqual(result.stdout, "")

    def test_help_documents_flags_env_and_exit_codes(self):
        result = subprocess.run([sys.executable, str(LAUNCH), "--help"],
                                capture_output=True, text=True,
                                timeout=RUN_TIMEOUT)
        self.assertEqual(result.returncode, 0)
        for word in ["--num-servers", "--num-workers", "--host", "--port",
                     "--env", "--grace", "--timeout", "DMLC_ROLE",
                     "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
                     "DMLC_NUM_SERVER", "DMLC_NUM_WORKER", "DMLC_NODE_HOST",
                     "PS_RANK", "OMP_WAIT_POLICY", "124", "PS_KEY_FILE",
                     "PS_KEY_FD",
                     "--key-file", "--insecure", "--make-key",
                     "--max-restarts", "PS_MAX_RESTARTS",
                     "PS_RESTART_COUNT", "--tolerate"]:
            self.assertIn(word, result.stdout)


class CulpritTest(LaunchCase):
    """The cause named: who was declared dead, else the first to fail."""

    HEARTBEAT = "no heartbeat for more than 10000 ms (PS_HEARTBEAT_TIMEOUT_MS)"

    def launch_dead(self, scenario, grace="0.5"):
        result = self.launch(["-s", "1", "-w", "2", "--grace", grace,
                              "--timeout", "8"], "dead", "4", scenario)
        pid = {p.stem: int(p.read_text()) for p in self.pids.glob("*.pid")}
        return result, pid

    def test_frozen_server_is_named_not_the_worker_that_reported_it(self):
        result, pid = self.launch_dead("frozen")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(
            self.last_line(result),
            f"launch: server 0 (pid {pid['server0']}) was declared dead by "
            f"worker 0: {self.HEARTBEAT}; worker 0 (pid {pid['worker0']}) "
            "exited with code 1; stopped the other 2 processes")
        self.assert_all_dead()  # The stopped server too.
        self.assert_key_by_descriptor()

    def test_report_read_after_the_first_exit_still_names_the_cause(self):
        result, pid = self.launch_dead("frozen-late")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(
            self.last_line(result),
            f"launch: server 0 (pid {pid['server0']}) was declared dead by "
            f"scheduler: {self.HEARTBEAT}; worker 0 (pid {pid['worker0']}) "
            "exited with code 1; stopped the other 2 processes")
        self.assert_all_dead()

    def test_a_member_that_alone_lost_the_scheduler_is_named_cut_off(self):
        # Its word on the scheduler's silence is not a verdict: one member
        # of three is not a majority.
        result, pid = self.launch_dead("cut")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(
            self.last_line(result),
            f"launch: worker 0 (pid {pid['worker0']}) was cut off: it lost "
            f"the scheduler ({self.HEARTBEAT}), and 1 of 3 members did, not "
            "a majority: cut off from it; it exited with code 1; stopped "
            "the other 3 processes")
        self.assert_all_dead()

    def test_a_scheduler_every_member_lost_is_named(self):
        result, pid = self.launch_dead("scheduler-frozen")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertRegex(
            self.last_line(result),
            rf"^launch: scheduler \(pid {pid['scheduler']}\) was declared "
            rf"dead by (server 0|worker [01]): {re.escape(self.HEARTBEAT)}; "
            rf"worker 0 \(pid {pid['worker0']}\) exited with code 1; "
            "stopped the other 2 processes$")
        self.assert_all_dead()  # The frozen scheduler too.

    def test_a_scheduler_most_members_lost_is_restarted(self):
        # Frozen for good: the launcher kills it on the members' word and
        # starts it again (--max-restarts), as a killed one.
        result = self.launch(["-s", "1", "-w", "2", "--grace", "0.5",
                              "--max-restarts", "1", "--timeout", "8"],
                             "dead", "4", "scheduler-restarted")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(result.stderr,
                         r"(?m)^launch: scheduler \(pid \d+\) was declared "
                         r"dead by the job and killed by the launcher; "
                         r"restarting it \(1 of 1, --max-restarts 1\)$")

    def test_declared_dead_process_that_exited(self):
        # The scheduler reports after it saw worker 1 gone: the grace must
        # cover a loaded machine's delay (0.5 s did not, under ctest -j2).
        result, pid = self.launch_dead("finalize", grace="3")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(
            self.last_line(result),
            f"launch: worker 1 (pid {pid['worker1']}) was declared dead by "
            "scheduler: it stopped without Finalize; it exited with code 3; "
            "stopped the other 3 processes")
        self.assert_all_dead()

    def test_a_restarted_worker_is_not_blamed_for_a_later_failure(self):
        # worker 1 is reported dead before it dies and again after its
        # restart; then server 0 fails on its own.
        result = self.launch(["-s", "1", "-w", "2", "--grace", "0.5",
                              "--max-restarts", "1", "--timeout", "8"],
                             "stale")
        self.assertEqual(result.returncode, 1, result.stderr)
        for reporter in ["worker 0", "scheduler"]:
            self.assertRegex(result.stderr, rf"(?m)^\[{reporter}\] .* worker "
                             r"1 \(tcp://[^)]*\) was declared dead: ")
        self.assertIn("restarting it (1 of 1, --max-restarts 1)",
                      result.stderr)
        server0 = int((self.pids / "server0.run1.pid").read_text())
        self.assertEqual(
            self.last_line(result),
            f"launch: server 0 (pid {server0}) exited with code 3; "
            "stopped the other 3 processes")
        self.assert_all_dead()

    def test_without_a_report_the_first_failure_is_named(self):
        result, pid = self.launch_dead("decoy")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("[worker 0] myserver 0 (tcp://", result.stderr)
        self.assertEqual(
            self.last_line(result),
            f"launch: worker 0 (pid {pid['worker0']}) exited with code 2; "
            "stopped the other 3 processes")
        self.assert_all_dead()


def gone(pid):
    """True once pid is no process (os.kill(pid, 0) fails), or a zombie
    that whoever adopted it has yet to reap."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return not alive(pid)


class RestartTest(LaunchCase):
    """--max-restarts: failed workers start again, with the same rank."""

    def launch_restart(self, flags, victims, how, others, n=4, env=None):
        """-s 1 -w 2 (n = 4 processes), --grace 0.5, plus flags."""
        return self.launch(["-s", "1", "-w", "2", "--grace", "0.5", *flags],
                           "restart", str(n), victims, how, others, env=env)

    def runs(self, name):
        """What each run of a process recorded (its pid, the RUN_KEYS)."""
        path = self.pids / f"{name}.runs"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def restart_lines(self, result):
        return [line for line in result.stderr.splitlines()
                if "restarting it" in line]

    def test_killed_worker_is_restarted_with_its_rank_and_key(self):
        result = self.launch_restart(["--max-restarts", "2"], "worker1",
                                     "kill-once", "2")
        self.assertEqual(result.returncode, 0, result.stderr)
        first, second = self.runs("worker1")
        self.assertEqual(self.restart_lines(result), [
            f"launch: worker 1 (pid {first['pid']}) was killed by signal "
            "SIGKILL; restarting it (1 of 2, --max-restarts 2)"])
        self.assertEqual(first["PS_RESTART_COUNT"], None)
        self.assertEqual(second["PS_RESTART_COUNT"], "1")
        self.assertEqual(first["PS_RANK"], "1")
        self.assertEqual(second["PS_RANK"], "1")
        self.assertIsNotNone(first["PS_KEY_FD"])
        self.assertIsNotNone(first["key"])  # The memfd kept for restarts.
        self.assertEqual(second["key"], first["key"])
        self.assertNotEqual(second["pid"], first["pid"])
        # The new run's output keeps the tag.
        self.assertIn("[worker 1] worker1 run 2\n", result.stdout)
        for name in ["scheduler", "server0", "worker0"]:
            self.assertEqual(len(self.runs(name)), 1, name)
        for name in ["scheduler", "server0", "worker0", "worker1"]:
            for run in self.runs(name):
                self.assertEqual(run["PS_MAX_RESTARTS"], "2", name)
        self.assertEqual(self.runs("scheduler")[0]["PS_RANK"], None)
        self.assertRegex(self.last_line(result),
                         r"^launch: all 4 processes exited 0 in [\d.]+ s; "
                         r"worker 1 was restarted 1 time "
                         r"\(--max-restarts 2\)$")
        self.assert_all_dead()
        self.assert_key_by_descriptor()

    def test_each_rank_has_its_own_budget(self):
        result = self.launch_restart(["--max-restarts", "1"],
                                     "worker0,worker1", "kill-once", "2")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(len(self.runs("worker0")), 2)
        self.assertEqual(len(self.runs("worker1")), 2)
        self.assertEqual(len(self.restart_lines(result)), 2)
        self.assertRegex(self.last_line(result),
                         r"^launch: all 4 processes exited 0 in [\d.]+ s; "
                         r"worker 0 was restarted 1 time, worker 1 was "
                         r"restarted 1 time \(--max-restarts 1\)$")

    def test_worker_that_always_fails_stops_the_job_once_its_budget_is_spent(
            self):
        result = self.launch_restart(["--max-restarts", "2"], "worker1",
                                     "exit3", "sleep")
        self.assertEqual(result.returncode, 1, result.stderr)
        runs = self.runs("worker1")
        self.assertEqual(len(runs), 3)
        self.assertEqual([r["PS_RESTART_COUNT"] for r in runs],
                         [None, "1", "2"])
        self.assertEqual(self.restart_lines(result), [
            f"launch: worker 1 (pid {runs[0]['pid']}) exited with code 3; "
            "restarting it (1 of 2, --max-restarts 2)",
            f"launch: worker 1 (pid {runs[1]['pid']}) exited with code 3; "
            "restarting it (2 of 2, --max-restarts 2)"])
        self.assertEqual(
            self.last_line(result),
            f"launch: worker 1 (pid {runs[2]['pid']}) exited with code 3 "
            "(after 2 restarts, --max-restarts 2); stopped the other 3 "
            "processes")
        for name in ["scheduler", "server0", "worker0"]:
            self.assertEqual(len(self.runs(name)), 1, name)
        self.assert_all_dead()
        self.assert_key_by_descriptor()

    def test_tolerated_worker_goes_once_its_budget_is_spent(self):
        result = self.launch_restart(["--max-restarts", "1", "--tolerate",
                                      "worker"], "worker1", "exit3", "2")
        self.assertEqual(result.returncode, 0, result.stderr)
        runs = self.runs("worker1")
        self.assertEqual(len(runs), 2)
        self.assertIn(
            f"launch: worker 1 (pid {runs[1]['pid']}) exited with code 3 "
            "(after 1 restart, --max-restarts 1); the job goes on "
            "(--tolerate worker)", result.stderr.splitlines())
        self.assertRegex(self.last_line(result),
                         r"^launch: 3 processes exited 0 in [\d.]+ s; the "
                         r"job survived the loss of worker 1 \(--tolerate\); "
                         r"worker 1 was restarted 1 time "
                         r"\(--max-restarts 1\)$")

    def test_failing_server_is_not_restarted(self):
        result = self.launch_restart(["--max-restarts", "3"], "server0",
                                     "exit3", "sleep")
        self.assertEqual(result.returncode, 1, result.stderr)
        runs = self.runs("server0")
        self.assertEqual(len(runs), 1)
        self.assertEqual(runs[0]["PS_MAX_RESTARTS"], "3")
        self.assertEqual(self.restart_lines(result), [])
        self.assertEqual(
            self.last_line(result),
            f"launch: server 0 (pid {runs[0]['pid']}) exited with code 3; "
            "stopped the other 3 processes")
        self.assert_all_dead()

    def test_killed_scheduler_is_restarted_at_the_same_address(self):
        result = self.launch_restart(["--max-restarts", "1"], "scheduler",
                                     "kill-once", "2")
        self.assertEqual(result.returncode, 0, result.stderr)
        first, second = self.runs("scheduler")
        self.assertEqual(self.restart_lines(result), [
            f"launch: scheduler (pid {first['pid']}) was killed by signal "
            "SIGKILL; restarting it (1 of 1, --max-restarts 1)"])
        self.assertEqual(second["PS_RESTART_COUNT"], "1")
        self.assertEqual(second["DMLC_PS_ROOT_PORT"],
                         first["DMLC_PS_ROOT_PORT"])
        self.assertIsNotNone(first["key"])
        self.assertEqual(second["key"], first["key"])
        for name in ["server0", "worker0", "worker1"]:
            self.assertEqual(len(self.runs(name)), 1, name)
        self.assertRegex(self.last_line(result),
                         r"^launch: all 4 processes exited 0 in [\d.]+ s; "
                         r"scheduler was restarted 1 time "
                         r"\(--max-restarts 1\)$")
        self.assert_all_dead()

    def test_without_max_restarts_nothing_restarts(self):
        # Variables of the launcher's own environment are not passed on.
        env = dict(os.environ, PS_MAX_RESTARTS="5", PS_RESTART_COUNT="7")
        result = self.launch_restart([], "worker1", "kill-once", "sleep",
                                     env=env)
        self.assertEqual(result.returncode, 1, result.stderr)
        runs = self.runs("worker1")
        self.assertEqual(len(runs), 1)
        self.assertEqual(self.restart_lines(result), [])
        for name in ["scheduler", "server0", "worker0", "worker1"]:
            got = self.runs(name)
            self.assertEqual(len(got), 1, name)
            self.assertEqual(got[0]["PS_MAX_RESTARTS"], None, name)
            self.assertEqual(got[0]["PS_RESTART_COUNT"], None, name)
        self.assertEqual(
            self.last_line(result),
            f"launch: worker 1 (pid {runs[0]['pid']}) was killed by signal "
            "SIGKILL; stopped the other 3 processes")
        self.assert_all_dead()

    def test_timeout_kills_the_restarted_worker_and_what_it_started(self):
        result = self.launch_restart(["--max-restarts", "1", "--timeout",
                                      "3"], "worker1", "exit3-once", "sleep")
        self.assertEqual(result.returncode, 124, result.stderr)
        first, second = self.runs("worker1")
        self.assertEqual(second["PS_RESTART_COUNT"], "1")
        pid = {name: self.runs(name)[0]["pid"]
               for name in ["scheduler", "server0", "worker0"]}
        self.assertEqual(
            self.last_line(result),
            f"launch: timeout after 3 s; killed 4 still running: scheduler "
            f"(pid {pid['scheduler']}), server 0 (pid {pid['server0']}), "
            f"worker 0 (pid {pid['worker0']}), worker 1 (pid "
            f"{second['pid']})")
        # Every run, and the process each run of worker 1 left in its group
        # (the first run's went when it was restarted).
        pids = [first["pid"], second["pid"], *pid.values()]
        for run in (1, 2):
            path = self.pids / f"worker1.run{run}.grandchild.pid"
            pids.append(int(path.read_text()))
        end = time.monotonic() + 3  # Orphans are reaped asynchronously.
        while not all(gone(p) for p in pids) and time.monotonic() < end:
            time.sleep(0.02)
        self.assertEqual([p for p in pids if not gone(p)], [])
        self.assert_key_by_descriptor()


if __name__ == "__main__":
    unittest.main()
