"""What the job says of itself, as tracker/launch.py reads it: the
scheduler's "ps-event:" lines (a server taken over by its replica does not
stop the job), and the processes declared dead that the launcher kills.
Tiny Python child programs play the nodes; the last test runs mnist_dist
itself (skipped without the build and MNIST).
"""

import os
import re
import signal
import subprocess
import sys
import time
import unittest

from cluster_tools import MNIST_DATA, MNIST_DIST, MNIST_PINNED, need
from test_launch import LAUNCH, RUN_TIMEOUT, LaunchCase, alive

EVENTS = r'''
import json, os, signal, sys, time
mode, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
role, rank = os.environ["DMLC_ROLE"], os.environ.get("PS_RANK")
me = role if rank is None else f"{role}{rank}"
# MODE: how server 1 (the victim) goes, and what the scheduler says:
# kill|freeze, then the job's replicas (0, 1, or - for no job event), then
# covered (its replica took over), lost (no replica did), declared (only
# the human line), fake (a worker's event) or - (nothing: all sleep on).
how, replicas, says = mode.split(",")
victim = "server1"

def event(**fields):
    print("ps-event: " + json.dumps(fields, separators=(",", ":")),
          file=sys.stderr, flush=True)

if me == "scheduler" and replicas != "-":  # Before any server is up.
    event(event="job", servers=2, workers=1, replicas=int(replicas),
          heartbeat_timeout_ms=1000)
with open(os.path.join(out, me + ".pid"), "w") as f:
    f.write(str(os.getpid()))

def wait_until(test):
    end = time.time() + 10
    while not test() and time.time() < end:
        time.sleep(0.01)

def started():
    return len([p for p in os.listdir(out) if p.endswith(".pid")]) >= n

def state(name):  # Of a process by its pid file: "R", "T", ..., "gone".
    try:
        with open(os.path.join(out, name + ".pid")) as f:
            pid = f.read()
    except FileNotFoundError:
        return "unborn"
    if not pid:  # Opened, not written yet.
        return "unborn"
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return "gone"

def declare_dead(name, why):  # As the library logs it (glog).
    print(f"W1126 11:22:33.444555  4242 barrier_monitor.cc:411] {name} "
          f"(tcp://127.0.0.1:40123) was declared dead: {why}",
          file=sys.stderr, flush=True)

def verdict_given():
    return os.path.exists(os.path.join(out, "verdict"))

if me == "scheduler":
    wait_until(started)
    wait_until(lambda: state(victim) in ("gone", "Z", "T"))
    time.sleep(0.3)  # The launcher has reaped a killed victim by then.
    if says == "covered":
        declare_dead("server 1", "its connection closed; server 0 takes "
                     "over its keys (PS_REPLICAS)")
        event(event="dead", node="server 1", covered_by="server 0")
    elif says == "lost":
        declare_dead("server 1", "its connection closed")
        event(event="dead", node="server 1")
    elif says == "declared":
        declare_dead("server 1", "no heartbeat")
    if says in ("covered", "lost", "declared"):
        open(os.path.join(out, "verdict"), "w").close()
elif me == victim:
    wait_until(started)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGSTOP)
elif me == "worker0" and says == "fake":
    wait_until(lambda: state(victim) in ("gone", "Z", "T"))
    event(event="dead", node="server 1", covered_by="server 0")
if says in ("-", "fake", "worker-says"):
    time.sleep(60)
wait_until(verdict_given)
time.sleep(0.2)
'''

# -s 1 -w 2 --max-restarts 1: worker 1 freezes in its first run; the
# scheduler declares it dead and awaits it back; its second run exits 0.
FROZEN_WORKER = r'''
import os, signal, sys, time
out = sys.argv[2]
role, rank = os.environ["DMLC_ROLE"], os.environ.get("PS_RANK")
me = role if rank is None else f"{role}{rank}"

def runs(name):
    try:
        with open(os.path.join(out, name + ".runs")) as f:
            return len(f.readlines())
    except FileNotFoundError:
        return 0

def wait_until(test):
    end = time.time() + 10
    while not test() and time.time() < end:
        time.sleep(0.01)

def frozen(name):
    try:
        with open(os.path.join(out, name + ".pid")) as f:
            pid = int(f.read())  # ValueError: opened, not written yet.
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, ValueError):
        return False

with open(os.path.join(out, me + ".runs"), "a") as f:
    f.write(f"{os.getpid()}\n")
run = runs(me)
with open(os.path.join(out, f"{me}.pid" if run == 1 else f"{me}.run{run}.pid"),
          "w") as f:
    f.write(str(os.getpid()))
if me == "worker1" and run == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(60)
if me == "scheduler":
    wait_until(lambda: frozen("worker1"))
    print("W1126 11:22:33.444555  4242 barrier_monitor.cc:411] worker 1 "
          "(tcp://127.0.0.1:40123) was declared dead: no heartbeat; the job "
          "waits up to 1000 ms for it to rejoin (PS_MAX_RESTARTS)",
          file=sys.stderr, flush=True)
    print('ps-event: {"event":"dead","node":"worker 1","awaited":true}',
          file=sys.stderr, flush=True)
if me != "worker1":
    wait_until(lambda: runs("worker1") >= 2)
'''

# -s 2 -w 1 --max-restarts 1: the scheduler freezes; server 1 then dies,
# so no scheduler is up to judge it; the members declare the scheduler
# dead, the launcher restarts it, and only its successor, more than the
# heartbeat timeout plus the grace after the death, says that server 0
# took over server 1's keys.
# What the nodes of the tests below share: who this process is, which run
# of it (PS_RESTART_COUNT), its pid file DIR/NAME.runN.pid, and marks in
# DIR (sys.argv[2]) that the nodes wait for.
NODE = r"""
import json, os, signal, sys, time
out = sys.argv[2]
role, rank = os.environ["DMLC_ROLE"], os.environ.get("PS_RANK")
me = role if rank is None else f"{role}{rank}"
run = int(os.environ.get("PS_RESTART_COUNT", "0")) + 1

def event(**fields):
    print("ps-event: " + json.dumps(fields, separators=(",", ":")),
          file=sys.stderr, flush=True)

def wait_until(test):
    end = time.time() + 15
    while not test() and time.time() < end:
        time.sleep(0.01)

def mark(name):
    open(os.path.join(out, name), "w").close()

def marked(name):
    return os.path.exists(os.path.join(out, name))

with open(os.path.join(out, f"{me}.run{run}.pid"), "w") as f:
    f.write(str(os.getpid()))
"""

SCHEDULER_AWAY = NODE + r"""
if me == "scheduler":
    event(event="job", servers=2, workers=1, replicas=1,
          heartbeat_timeout_ms=1000)
    if run == 1:
        wait_until(lambda: len(os.listdir(out)) >= 4)
        mark("frozen")
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(60)
    time.sleep(2.5)  # Its takeover: the members report, the timeout runs.
    print("W1126 11:22:33.444555  4242 peer_events.cc:178] server 1 "
          "(tcp://127.0.0.1:40125) was declared dead: no heartbeat",
          file=sys.stderr, flush=True)
    event(event="dead", node="server 1", covered_by="server 0")
    mark("verdict")
elif me == "server1":
    wait_until(lambda: marked("frozen"))
    os.kill(os.getpid(), signal.SIGKILL)
else:
    wait_until(lambda: marked("frozen"))
    time.sleep(1.0)  # Its heartbeat timeout.
    print(f"W1126 11:22:33.444555  4242 peer_events.cc:178] scheduler "
          f"(tcp://127.0.0.1:40123) was declared dead: no heartbeat for "
          f"more than 1000 ms (PS_HEARTBEAT_TIMEOUT_MS)",
          file=sys.stderr, flush=True)
    wait_until(lambda: marked("verdict"))
"""

# -s 1 -w 2 --max-restarts 2: the scheduler freezes, the members declare it
# dead, the launcher kills it and starts it again; the new run freezes too,
# and the members' word on it (read after the heartbeat timeout from its
# start: it is about that run) has the launcher replace it once more.
SCHEDULER_FROZEN_TWICE = NODE + r"""
if me == "scheduler":
    event(event="job", servers=1, workers=2, replicas=0,
          heartbeat_timeout_ms=1000)
    if run < 3:
        wait_until(lambda: len(os.listdir(out)) >= 3)
        mark(f"frozen{run}")
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(60)
    mark("up3")
else:
    for frozen in ("frozen1", "frozen2"):
        wait_until(lambda: marked(frozen))
        time.sleep(1.5)  # The heartbeat timeout, and then some.
        print(f"W1126 11:22:33.444555  4242 peer_events.cc:178] scheduler "
              f"(tcp://127.0.0.1:40123) was declared dead: no heartbeat for "
              f"more than 1000 ms (PS_HEARTBEAT_TIMEOUT_MS); the job waits "
              f"up to 60000 ms for it to rejoin (PS_MAX_RESTARTS)",
              file=sys.stderr, flush=True)
    wait_until(lambda: marked("up3"))
"""

# -s 1 -w 2 --max-restarts 1: the scheduler ends the job (exit 0) while
# worker 1 still waits for it (its final barrier's release lost); worker 1
# then fails. A new run would find no job: it is not started.
AFTER_THE_END = NODE + r"""
if me == "worker1":
    wait_until(lambda: marked("ended"))
    time.sleep(0.5)
    print("ps: worker 1 stops: scheduler was declared dead: it did not "
          "rejoin", file=sys.stderr, flush=True)
    sys.exit(1)
if me == "scheduler":
    time.sleep(0.5)
    mark("ended")
"""

COVERED = "the scheduler said server 0 took over its keys"


class JobEventsTest(LaunchCase):
    """-s 2 -w 1; server 1 dies (kill) or freezes (SIGSTOP)."""

    def setUp(self):
        super().setUp()
        self.child.write_text(EVENTS)

    def run_job(self, mode, *flags):
        result = self.launch(["-s", "2", "-w", "1", "--grace", "0.5",
                              "--timeout", "8", *flags], mode, "4")
        pid = {p.stem: int(p.read_text()) for p in self.pids.glob("*.pid")}
        return result, pid

    def test_a_server_taken_over_by_its_replica_does_not_stop_the_job(self):
        result, pid = self.run_job("kill,1,covered")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"launch: server 1 (pid {pid['server1']}) was killed "
                      f"by signal SIGKILL; the job goes on ({COVERED})",
                      result.stderr.splitlines())
        self.assertRegex(self.last_line(result),
                         r"^launch: 3 processes exited 0 in [\d.]+ s; the "
                         r"job survived the loss of server 1 \(the "
                         r"scheduler said server 0 took over its keys\)$")
        self.assert_all_dead()

    def test_a_server_the_scheduler_says_is_lost_stops_the_job(self):
        result, pid = self.run_job("kill,1,lost")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertNotIn("goes on", result.stderr)
        self.assertEqual(
            self.last_line(result),
            f"launch: server 1 (pid {pid['server1']}) was declared dead by "
            "scheduler: its connection closed; it was killed by signal "
            "SIGKILL; stopped the other 3 processes")
        self.assert_all_dead()

    def test_without_replicas_a_dead_server_stops_the_job_at_once(self):
        for mode in ("kill,0,-", "kill,-,-"):
            with self.subTest(mode=mode):
                for p in self.pids.glob("*"):
                    p.unlink()
                result, pid = self.run_job(mode)
                self.assertEqual(result.returncode, 1, result.stderr)
                self.assertLess(result.elapsed, 5)
                self.assertEqual(
                    self.last_line(result),
                    f"launch: server 1 (pid {pid['server1']}) was killed by "
                    "signal SIGKILL; stopped the other 3 processes")

    def test_only_the_scheduler_speaks_for_the_job(self):
        result, pid = self.run_job("kill,1,fake")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("[worker 0] ps-event: ", result.stderr)
        self.assertNotIn("goes on", result.stderr)
        self.assert_all_dead()

    def test_a_frozen_server_taken_over_is_killed_and_the_job_ends(self):
        result, pid = self.run_job("freeze,1,covered")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertLess(result.elapsed, 5)
        self.assertIn(f"launch: server 1 (pid {pid['server1']}) was declared "
                      "dead by the job and killed by the launcher; the job "
                      f"goes on ({COVERED})", result.stderr.splitlines())
        self.assertFalse(alive(pid["server1"]))

    def test_a_frozen_tolerated_server_is_killed_and_the_job_ends(self):
        # The scheduler declares it dead; --tolerate server lets it go.
        result, pid = self.run_job("freeze,0,declared", "--tolerate",
                                   "server")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertLess(result.elapsed, 5)
        self.assertIn(f"launch: server 1 (pid {pid['server1']}) was declared "
                      "dead by the job and killed by the launcher; the job "
                      "goes on (--tolerate server)", result.stderr.splitlines())
        self.assertRegex(self.last_line(result),
                         r"^launch: 3 processes exited 0 in [\d.]+ s; the "
                         r"job survived the loss of server 1 \(--tolerate\)$")
        self.assertFalse(alive(pid["server1"]))

    def test_a_frozen_server_declared_dead_by_a_worker_is_not_killed(self):
        # Only the scheduler's word kills: a node cut off from the others
        # declares them all dead. The job then runs into its --timeout.
        self.child.write_text(EVENTS.replace(
            'elif me == "worker0" and says == "fake":',
            'elif me == "worker0" and says == "worker-says":\n'
            '    wait_until(lambda: state(victim) == "T")\n'
            '    declare_dead("server 1", "no heartbeat")\n'
            'elif False:'))
        result = self.launch(["-s", "2", "-w", "1", "--grace", "0.5",
                              "--timeout", "3", "--tolerate", "server"],
                             "freeze,0,worker-says", "4")
        self.assertEqual(result.returncode, 124, result.stderr)
        self.assertNotIn("killed by the launcher", result.stderr)
        self.assertIn("was declared dead: no heartbeat", result.stderr)
        self.assert_all_dead()


class FrozenWorkerTest(LaunchCase):

    def test_a_frozen_worker_awaited_back_is_killed_and_restarted(self):
        self.child.write_text(FROZEN_WORKER)
        result = self.launch(["-s", "1", "-w", "2", "--grace", "0.5",
                              "--max-restarts", "1", "--timeout", "8"],
                             "frozen-worker")
        self.assertEqual(result.returncode, 0, result.stderr)
        first = int((self.pids / "worker1.pid").read_text())
        self.assertIn(f"launch: worker 1 (pid {first}) was declared dead by "
                      "the job and killed by the launcher; restarting it (1 "
                      "of 1, --max-restarts 1)", result.stderr.splitlines())
        self.assertRegex(self.last_line(result),
                         r"^launch: all 4 processes exited 0 in [\d.]+ s; "
                         r"worker 1 was restarted 1 time "
                         r"\(--max-restarts 1\)$", result.stderr)
        self.assertFalse(alive(first))


class SchedulerAwayTest(LaunchCase):

    def test_a_server_dead_while_no_scheduler_is_up_awaits_its_successor(
            self):
        self.child.write_text(SCHEDULER_AWAY)
        result = self.launch(["-s", "2", "-w", "1", "--grace", "0.5",
                              "--max-restarts", "1", "--timeout", "20"],
                             "scheduler-away")
        self.assertEqual(result.returncode, 0, result.stderr)
        pid = {p.stem: int(p.read_text()) for p in self.pids.glob("*.pid")}
        lines = result.stderr.splitlines()
        self.assertIn(f"launch: scheduler (pid {pid['scheduler.run1']}) was "
                      "declared dead by the job and killed by the launcher; "
                      "restarting it (1 of 1, --max-restarts 1)", lines)
        self.assertIn(f"launch: server 1 (pid {pid['server1.run1']}) was "
                      "killed by signal SIGKILL; the job goes on "
                      f"({COVERED})", lines)
        self.assertRegex(self.last_line(result),
                         r"^launch: 3 processes exited 0 in [\d.]+ s; the "
                         r"job survived the loss of server 1 \(the "
                         r"scheduler said server 0 took over its keys\); "
                         r"scheduler was restarted 1 time \(--max-restarts "
                         r"1\)$")
        self.assert_all_dead()


    def test_a_restarted_scheduler_frozen_in_its_turn_is_replaced_too(self):
        self.child.write_text(SCHEDULER_FROZEN_TWICE)
        result = self.launch(["-s", "1", "-w", "2", "--grace", "0.5",
                              "--max-restarts", "2", "--timeout", "25"],
                             "frozen-twice")
        self.assertEqual(result.returncode, 0, result.stderr)
        pid = {p.stem: int(p.read_text()) for p in self.pids.glob("*.pid")}
        lines = result.stderr.splitlines()
        for run in (1, 2):
            frozen = pid[f"scheduler.run{run}"]
            self.assertIn(f"launch: scheduler (pid {frozen}) was declared "
                          "dead by the job and killed by the launcher; "
                          f"restarting it ({run} of 2, --max-restarts 2)",
                          lines)
        self.assertRegex(self.last_line(result),
                         r"^launch: all 4 processes exited 0 in [\d.]+ s; "
                         r"scheduler was restarted 2 times "
                         r"\(--max-restarts 2\)$")
        self.assert_all_dead()


    def test_a_worker_failing_after_the_scheduler_ended_the_job_stays_down(
            self):
        self.child.write_text(AFTER_THE_END)
        result = self.launch(["-s", "1", "-w", "2", "--grace", "0.5",
                              "--max-restarts", "1", "--timeout", "20"],
                             "after-the-end")
        self.assertEqual(result.returncode, 1, result.stderr)
        pid = {p.stem: int(p.read_text()) for p in self.pids.glob("*.pid")}
        self.assertNotIn("worker1.run2", pid)
        self.assertNotIn("restarting it", result.stderr)
        self.assertIn(f"launch: worker 1 (pid {pid['worker1.run1']}) exited "
                      "with code 1; not restarted: the scheduler had ended "
                      "the job (exit 0)", result.stderr.splitlines())
        self.assert_all_dead()


class NoServerTest(unittest.TestCase):

    def test_a_job_without_a_server_is_refused(self):
        result = subprocess.run([sys.executable, str(LAUNCH), "-s", "0",
                                 "-w", "1", "--", "true"],
                                capture_output=True, text=True,
                                timeout=RUN_TIMEOUT)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stdout, "")
        self.assertEqual(result.stderr,
                         "launch: -s/--num-servers must be >= 1, got 0: a "
                         "job needs a server (see --help)\n")


class TrainingJobTest(unittest.TestCase):
    """mnist_dist --replicas 1 with 3 servers: kill -9 of server 1 (from
    outside, mid-training); no --tolerate; the job ends well."""

    def test_killed_server_with_a_replica_survives_without_tolerate(self):
        need(files=(MNIST_DIST, MNIST_DATA / "train-images-idx3-ubyte"))
        cmd = [sys.executable, str(LAUNCH), "-s", "3", "-w", "2",
               "--timeout", "240", "--", str(MNIST_DIST), *MNIST_PINNED,
               "--data_dir",
               str(MNIST_DATA), "--replicas", "1", "--threads", "1",
               "--train_limit", "6400", "--test_limit", "500",
               "--batch_size", "16", "--overlap", "off",
               "--log_every_s", "0.1", "--slow_worker_ms", "20"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        lines = []
        try:
            victim = None
            end = time.monotonic() + 120
            for line in proc.stdout:
                lines.append(line)
                if victim is None and re.match(r"\[worker 0\] .*step", line):
                    victim = server_pid(proc.pid, 1)
                    self.assertIsNotNone(victim, "".join(lines))
                    os.kill(victim, signal.SIGKILL)
                if time.monotonic() > end:
                    break
            rc = proc.wait(timeout=240)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            proc.stdout.close()
        out = "".join(lines)
        self.assertIsNotNone(victim, out)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"\"event\":\"dead\",\"node\":\"server 1\","
                              r"\"covered_by\":\"server 2\"")
        self.assertIn(f"launch: server 1 (pid {victim}) was killed by signal "
                      "SIGKILL; the job goes on (the scheduler said server 2 "
                      "took over its keys)", out)
        self.assertRegex(out, r"launch: 5 processes exited 0 in [\d.]+ s; "
                              r"the job survived the loss of server 1 \(the "
                              r"scheduler said server 2 took over its keys\)")


def server_pid(launcher, rank):
    """The pid of the launcher's child with DMLC_ROLE=server, PS_RANK."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != launcher:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if (b"DMLC_ROLE=server" in env
                and f"PS_RANK={rank}".encode() in env):
            return int(entry)
    return None


if __name__ == "__main__":
    unittest.main()
