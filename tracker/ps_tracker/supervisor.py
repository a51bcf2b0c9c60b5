"""The supervisor: the job's process table and its policy.

It starts the processes (a launcher's plan and popen), copies their output,
reads what the job says about itself (the nodes' "declared dead" lines and
the scheduler's "ps-event:" lines), restarts what --max-restarts allows,
decides which exit fails the job, and stops everything on the way out.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

from . import reports as reports_mod
from .reports import DECLARED_DEAD, EVENT, GLOG_LINE, LEFT_ON_ITS_OWN
from .common import (DEAD_REPORT_GRACE, POLL_SECONDS, describe_exit, plural)
from .metrics import MetricsTargets

# How much of a process's last line the launcher repeats.
LAST_WORDS_CHARS = 500


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
        self.killed_as_dead = None  # The run the launcher killed (below).
        self.started_at = None  # time.monotonic() of its current run's start

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
        if self.killed_as_dead is self.proc:
            return ("was declared dead by the job and killed by the "
                    "launcher")
        if self.host is None:
            return describe_exit(returncode)
        if returncode == 255:
            return "exited with code 255 (or ssh failed)"
        if 128 < returncode < 128 + signal.NSIG:
            return (f"{describe_exit(128 - returncode)} (remote exit status "
                    f"{returncode})")
        return describe_exit(returncode)


class Job:
    """Starts the children, watches them, stops them all on the way out.

    A launcher gives plan() (the children) and popen(child, port); ssh
    also kill() and before_stop(). Which failure the job survives:
    - a worker or the scheduler with --max-restarts left: started again;
    - a process of a role named by --tolerate;
    - a server whose keys a replica took over, as the scheduler said
      ({"event":"dead",...,"covered_by":...}; the job said at its start
      that it replicates, so the launcher waits for that verdict).
    Anything else that exits non-zero stops the job. A process that the
    scheduler declared dead and that the job goes on without (tolerated,
    covered, or awaited back for a restart) is killed: a frozen one would
    never exit. (Only the scheduler's word counts there, and the word of
    more than half of the members on the scheduler: a node cut off from
    the others declares them all dead.)
    """

    def __init__(self, args, mux):
        self.args = args
        self.mux = mux
        # The job's key: a file (--key-file; mpi, slurm) or a KeyMemfd
        # (local, ssh); neither with --insecure.
        self.key_path = None
        self.key_memfd = None
        self.port = None  # The scheduler's, once started.
        self.start_failure = None  # The scheduler's start_failed reason.
        self.children = []
        self.exits = queue.Queue()  # (child, returncode) in reaping order.
        self.signal_received = None
        self.tolerated = []  # children whose failure the job survived
        self.survived = {}  # their names: why (for the last line)
        # (declared name, reason, reporter's name) in the order read.
        self._reports = []
        self._reports_lock = threading.Lock()
        self._reported = threading.Event()
        self.job_event = None  # The scheduler's {"event":"job",...}.
        self.verdicts = {}  # node name: the scheduler's first "dead" event
        # time.monotonic() of the last report of a member on the scheduler.
        self.scheduler_lost_at = None
        self.scheduler_quorum = reports_mod.SchedulerQuorum()
        self._declared = queue.Queue()  # Names declared dead, to act on.
        self._last_said = {}  # node name: its last line that is not a log
        # --metrics DIR: the nodes' /metrics addresses (DIR/targets.json).
        directory = getattr(args, "metrics", None)
        self.metrics = None if directory is None else MetricsTargets(directory)

    @property
    def total(self):
        """How many processes the job has."""
        return 1 + self.args.num_servers + self.args.worker_processes

    @property
    def key_fd(self):
        """The descriptor of the key's memfd, or None."""
        return None if self.key_memfd is None else self.key_memfd.fd

    def key_line(self):
        """The key's line (bytes, no newline), or None with --insecure."""
        if self.key_memfd is not None:
            return self.key_memfd.line()
        if self.key_path is None:
            return None
        with open(self.key_path, "rb") as f:
            return f.readline().rstrip(b"\n")

    @property
    def max_restarts(self):
        """--max-restarts (0 for a Job given args without it)."""
        return getattr(self.args, "max_restarts", 0)

    def plan(self):
        raise NotImplementedError

    def popen(self, child, port):
        raise NotImplementedError

    def start(self, port):
        self.port = port
        if self.metrics is not None:
            try:
                self.metrics.prepare()
            except OSError as err:
                self.mux.say(f"cannot write {self.metrics.path}: {err}")
                return False
        for child in self.plan():
            try:
                child.proc = self.popen(child, port)
                child.started_at = time.monotonic()
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
        """reporter: the name of the process that printed line."""
        text = line.strip()
        if text and not GLOG_LINE.match(text):
            self._last_said[reporter] = text
        if b"ps-event: " in line:
            self._read_event(reporter, line)
            return
        if b"was declared dead" not in line:  # Cheap test first.
            return
        match = DECLARED_DEAD.search(line.rstrip(b"\r\n"))
        if match is None:
            return
        name = match.group(1).decode()
        reason = match.group(2).decode(errors="replace").strip()
        with self._reports_lock:
            self._reports.append((name, reason, reporter))
        if reporter == "scheduler":
            self._declared.put(name)  # Its verdict: the others follow it.
        elif name == "scheduler":
            self._member_lost_scheduler(reporter)
        self._reported.set()

    def _member_lost_scheduler(self, reporter):
        """A member declared the scheduler dead: a majority's word on its
        current run is a verdict (reports.SchedulerQuorum)."""
        now = time.monotonic()
        self.scheduler_lost_at = now
        scheduler = next(c for c in self.children if c.role == "scheduler")
        if self.scheduler_quorum.report(
                reporter, scheduler.proc,
                scheduler.started_at if scheduler.restarts else None, now,
                reports_mod.heartbeat_timeout(self.job_event),
                self.num_members()):
            self._declared.put("scheduler")

    def _read_event(self, reporter, line):
        """Keeps the scheduler's events (no other process speaks for the
        job), and each node's metrics port."""
        match = EVENT.search(line.rstrip(b"\r\n"))
        if match is None:
            return
        try:
            event = json.loads(match.group(1))
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if event.get("event") == "metrics":
            self._node_serves_metrics(reporter, event.get("host"),
                                      event.get("port"))
            return
        if reporter != "scheduler":
            return
        if event.get("event") == "job":
            self.job_event = event
        elif (event.get("event") == "start_failed"
              and isinstance(event.get("reason"), str)):
            self.start_failure = event["reason"]  # Why nobody could start.
            self._reported.set()
        elif event.get("event") == "dead" and isinstance(event.get("node"),
                                                         str):
            with self._reports_lock:
                self.verdicts.setdefault(event["node"], event)
            self._declared.put(event["node"])

    def _node_serves_metrics(self, reporter, host, port):
        """The node's target: the address it says it listens on, or
        (0.0.0.0, or none said) the host it was launched on."""
        child = next((c for c in self.children if c.name == reporter), None)
        if (self.metrics is None or child is None or not isinstance(port, int)
                or not 0 < port < 65536):
            return
        if not isinstance(host, str) or host in ("", "0.0.0.0"):
            host = child.host or "127.0.0.1"
        rank = 0 if child.rank is None else child.rank
        try:
            self.metrics.node_serves(reporter, child.role, rank, host, port)
        except OSError as err:
            self.mux.say(f"cannot write {self.metrics.path}: {err}")

    def first_report(self):
        """(declared name, reason, reporter's name) whose word counts, read
        first, or None (reports.first_verdict). Reports that name a
        restarted process are left out, whenever they were read: one read
        before the restart is about the run that died, and one read after
        it may be too (the other nodes notice a death late, after missed
        heartbeats) or be about the new run; the launcher cannot tell
        which, so it never names a restarted process as the cause of a
        failure on that ground. A failure is then put on the first process
        that exited non-zero, which for a restarted worker whose restarts
        are spent is itself.
        """
        restarted = {c.name for c in self.children if c.restarts}
        with self._reports_lock:
            reports = [r for r in self._reports if r[0] not in restarted]
        return reports_mod.first_verdict(reports, self.num_members())

    def num_members(self):
        return sum(1 for c in self.children if c.role != "scheduler")

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
            if (self.first_report() is not None
                    or self.start_failure is not None):
                return
            self._reported.wait(
                min(POLL_SECONDS, max(0.0, end - time.monotonic())))

    def on_signal(self, signum, frame):
        self.signal_received = signum

    def wait(self, deadline):
        """Returns ('done'|'failed'|'timeout'|'signal', failed child, rc)."""
        left = len(self.children)
        # Dead servers awaiting the scheduler's verdict: {child: (rc, when)}.
        # The loop goes on meanwhile: the verdict may have to come from a
        # successor of the scheduler, which this loop starts.
        unjudged = {}
        while left:
            if self.signal_received is not None:
                return "signal", None, None
            if deadline is not None and time.monotonic() >= deadline:
                return "timeout", None, None
            self.kill_declared_dead()
            for child, returncode, why in self.judged(unjudged):
                if why is None:
                    self._await_report(deadline)
                    return "failed", child, returncode
                self.go_on_without(child, returncode, why)
                left -= 1
            if not left:
                break
            try:
                child, returncode = self.exits.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            if returncode != 0 and self.may_restart(child):
                if self.job_ended(child, returncode):
                    return "failed", child, returncode
                if self.restart(child, returncode):
                    continue  # Still one of the remaining, as a new run.
                return "failed", child, returncode
            if returncode == 0:
                left -= 1
            elif child.role in getattr(self.args, "tolerate", ()):
                self.go_on_without(child, returncode,
                                   f"--tolerate {child.role}")
                left -= 1
            elif child.role == "server":
                unjudged[child] = (returncode, time.monotonic())
            else:
                self._await_report(deadline)
                return "failed", child, returncode
        return "done", None, None

    def job_ended(self, child, returncode):
        """Whether the scheduler ended the job (exit 0) before child failed:
        a new run would find no job to rejoin, so it is not started."""
        scheduler = next(c for c in self.children if c.role == "scheduler")
        if child is scheduler or scheduler.proc.poll() != 0:
            return False
        self.mux.say(f"{child.label} {child.describe_exit(returncode)}; not "
                     f"restarted: the scheduler had ended the job (exit 0)")
        return True

    def go_on_without(self, child, returncode, why):
        """Says that the job goes on without child (failed), and why."""
        self.mux.say(f"{child.label} {child.describe_exit(returncode)}"
                     f"{self.restart_note(child)}; the job goes on ({why})")
        self.tolerated.append(child)
        self.survived[child.name] = why

    def judged(self, unjudged):
        """[(child, rc, why the job goes on without it, or None: it fails
        the job)] for the dead servers in `unjudged` whose verdict came or
        is overdue (verdict_due); those leave `unjudged`."""
        now = time.monotonic()
        out = []
        for child, (returncode, since) in list(unjudged.items()):
            with self._reports_lock:
                verdict = self.verdicts.get(child.name)
            if verdict is None and now < self.verdict_due(since):
                continue
            del unjudged[child]
            heir = None if verdict is None else verdict.get("covered_by")
            out.append((child, returncode,
                        f"the scheduler said {heir} took over its keys"
                        if isinstance(heir, str) else None))
        return out

    def replicated(self):
        """Whether the job said it has replicated servers (PS_REPLICAS)."""
        event = self.job_event or {}
        replicas = event.get("replicas")
        return isinstance(replicas, int) and replicas > 0

    def verdict_due(self, since):
        """When the scheduler's verdict on a server that died at `since` is
        due (reports.verdict_due); at once in a job that does not replicate
        (or never said): no replica takes its keys."""
        if not self.replicated():
            return since
        scheduler = next(c for c in self.children if c.role == "scheduler")
        signs = [t for t in (self.scheduler_lost_at, scheduler.started_at
                             if scheduler.restarts else None)
                 if t is not None]
        timeout = reports_mod.heartbeat_timeout(self.job_event)
        return reports_mod.verdict_due(since, timeout, signs,
                                       DEAD_REPORT_GRACE)

    def goes_on_without(self, child):
        """Whether the job survives child's death (named by a report)."""
        if child.role in getattr(self.args, "tolerate", ()):
            return True
        if self.may_restart(child):
            return True  # Awaited back; the launcher restarts it.
        with self._reports_lock:
            verdict = self.verdicts.get(child.name)
        return verdict is not None and isinstance(verdict.get("covered_by"),
                                                  str)

    def kill_declared_dead(self):
        """Kills the processes the job declared dead and goes on without
        (a frozen one would never exit, and the launcher would wait for it
        for ever). A restarted process is left alone: a report about it
        may be about its previous run (see first_report), unless a
        majority of the members declared the scheduler's current run dead."""
        while True:
            try:
                name = self._declared.get_nowait()
            except queue.Empty:
                return
            if getattr(self.args, "keep_declared_dead", False):
                continue  # A test's: it must find itself fenced and exit.
            child = next((c for c in self.children if c.name == name), None)
            current = child is not None and (
                not child.restarts
                or child.proc is self.scheduler_quorum.judged)
            if (child is None or not current
                    or child.killed_as_dead is child.proc
                    or child.proc.poll() is not None
                    or not self.goes_on_without(child)):
                continue
            child.killed_as_dead = child.proc
            self.kill(child)

    def kill(self, child):
        """Kills child's process group at once (SIGKILL needs no SIGCONT
        for a stopped process)."""
        self._signal_groups([child], signal.SIGKILL)

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
            child.started_at = time.monotonic()
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

    def running(self):
        """The children whose current run has not exited."""
        return [c for c in self.children if c.proc.poll() is None]

    def before_stop(self, children):
        """ssh: tells the sessions to stop their remote processes."""

    def stop(self, children):
        """SIGTERM each group, SIGKILL after the grace; reaps the leaders.

        SIGCONT first: a stopped (SIGSTOP) process would not act on SIGTERM.
        ssh sessions are first told to stop their remote processes.
        """
        self.before_stop([c for c in children if c.host is not None])
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

    def last_words(self, failed):
        """(child, its last line that is not a log line), or None: of the
        process declared dead first if it left on its own (the launcher may
        have stopped it while it was leaving), else of failed if it exited
        non-zero. A program's reason for giving up (e.g. a step refused,
        naming the member to blame) says more than its exit code."""
        report = self.first_report()
        if report is not None and LEFT_ON_ITS_OWN in report[1]:
            said = self._last_said.get(report[0])
            dead = next((c for c in self.children if c.name == report[0]),
                        None)
            if said is not None and dead is not None:
                return dead, said.decode(errors="replace")[:LAST_WORDS_CHARS]
        try:
            # Not poll(): it says None while _reap's wait holds the lock.
            code = failed.proc.wait(timeout=POLL_SECONDS)
        except subprocess.TimeoutExpired:
            return None
        said = self._last_said.get(failed.name)
        if code <= 0 or said is None or failed.killed_as_dead is failed.proc:
            return None
        return failed, said.decode(errors="replace")[:LAST_WORDS_CHARS]

    def describe_failure(self, failed, returncode, running):
        """The cause of a failed job: who was declared dead, else who failed.

        running: the processes that were still running when it was decided.
        """
        # The scheduler's word on why the job could not start (e.g. a node
        # launched for another shape) comes first: every node fails with it,
        # the first to exit is no more to blame than the others.
        parts = ([f"the job could not start: {self.start_failure}"]
                 if self.start_failure is not None else [])
        named = [failed]
        report = self.first_report()
        if report is not None:
            name, reason, reporter = report
            dead = next((c for c in self.children if c.name == name), None)
            who = name if dead is None else dead.label
            parts.append(f"{who} was cut off: {reason}" if name == reporter
                         else f"{who} was declared dead by {reporter}: "
                         f"{reason}")
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
