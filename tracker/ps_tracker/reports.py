"""Whose word on a death counts, as the launcher reads the nodes' lines.

A report is (declared name, reason, reporter's name), as a node logged
"<name> (tcp://...) was declared dead: <reason>". The scheduler judges
the members, and a member judges only the scheduler. A member's word on
the scheduler counts when it found the scheduler's process gone (its
connection closed and every reconnect refused), or, for silence, when
more than half of the job's members gave it: a member that alone stopped
hearing the scheduler was cut off from it, and is the one to name.
"""

import re

from .common import plural

# What a node logs when it learns that a node failed; the scheduler logs it
# too for a node that stopped without Finalize.
DECLARED_DEAD = re.compile(
    rb"\b(scheduler|server \d+|worker \d+) \(tcp://[^)]*\) "
    rb"was declared dead: (.*)")

# The scheduler's machine-readable lines (src/postoffice, PrintEvent), one
# JSON object each: {"event":"job","replicas":1,"heartbeat_timeout_ms":..}
# when it starts; {"event":"dead","node":"server 1","covered_by":"server 2"}
# (covered_by only when a replica took the keys over; "awaited":true for a
# node the job waits to rejoin) for each node it declares dead. Every node,
# with PS_METRICS_PORT:
# {"event":"metrics","role":"server","host":"127.0.0.1","port":40123}.
EVENT = re.compile(rb"(?:^|\] )ps-event: (\{.*\})\s*$")

# A glog line ("I20261126 20:19:58.944772 24237 file.cc:12] ..."): the
# log, not what a program says when it gives up.
GLOG_LINE = re.compile(rb"[IWEF]\d{8} \d\d:\d\d:\d\d")

# The reason a node gives for a peer that left without Finalize: its
# process exited (src/postoffice, on the departure or the closed connection).
LEFT_ON_ITS_OWN = "stopped without Finalize"


# The reason a member gives for a scheduler it no longer hears: silence,
# which a cut link makes as well as a dead scheduler.
SILENCE = "no heartbeat"


def quorum_lost(reports, members):
    """(members that declared the scheduler dead, members) when more than
    half of the job's `members` did, else None."""
    saying = {rep for name, _, rep in reports
              if name == "scheduler" and rep != "scheduler"}
    return (len(saying), members) if 2 * len(saying) > members else None


class SchedulerQuorum:
    """The members that declared the scheduler's current run dead. More
    than half of them saying so is a verdict (a node cut off alone declares
    everyone dead). A restarted run is spoken of only after the heartbeat
    timeout from its start: a report sooner is about the run before (a
    member must hear the new run, then miss it that long)."""

    def __init__(self):
        self.run = None  # The run (its Popen) the members speak of.
        self.saying = set()
        self.judged = None  # The run that a majority declared dead.

    def report(self, reporter, run, restarted_at, now, timeout, members):
        """Whether `reporter`'s word at `now` makes a majority of `members`
        on `run` (started again at `restarted_at`, None for a first run)."""
        if restarted_at is not None and now < restarted_at + timeout:
            return False
        if run is not self.run:
            self.run, self.saying = run, set()
        self.saying.add(reporter)
        if 2 * len(self.saying) <= members:
            return False
        self.judged = run
        return True


def heartbeat_timeout(job_event):
    """The job's heartbeat timeout in seconds, as its "job" event said (0
    if it did not)."""
    timeout_ms = (job_event or {}).get("heartbeat_timeout_ms")
    if not isinstance(timeout_ms, (int, float)) or timeout_ms < 0:
        return 0
    return timeout_ms / 1000


def first_verdict(reports, members):
    """The first report whose word counts, in the order read; else, when a
    member alone lost the scheduler's heartbeats, (that member, why it is
    the one cut off, that member); else None."""
    quorum = quorum_lost(reports, members)
    for name, reason, reporter in reports:
        if (reporter == "scheduler" or name != "scheduler"
                or SILENCE not in reason or quorum):
            return name, reason, reporter
    lone = next((r for r in reports if r[0] == "scheduler"), None)
    if lone is None:
        return None
    saying = len({rep for name, _, rep in reports if name == "scheduler"})
    return (lone[2],
            f"it lost the scheduler ({lone[1]}), and {saying} of {members} "
            f"members did, not a majority: cut off from it",
            lone[2])


def verdict_due(since, timeout, away, grace):
    """When the launcher gives up waiting for the scheduler's verdict on a
    server that died at `since` (time.monotonic()): `grace` after the
    heartbeat `timeout` (a closed connection is noticed far sooner). And
    when the scheduler itself was away about then (`away`: the times of
    its signs, a member's report on it and its new run's start; one at
    most `timeout` before the death counts), `timeout` plus 2 graces after
    the last sign: a successor judges the members that died while no
    scheduler was up once the timeout has passed (docs/failures.md)."""
    due = since + timeout + grace
    if away and max(away) >= since - timeout:
        due = max(due, max(away) + timeout + 2 * grace)
    return due


def describe_restarts(children, max_restarts):
    """'worker 1 was restarted 1 time (--max-restarts 2)', or ''."""
    restarted = [c for c in children if c.restarts]
    if not restarted:
        return ""
    return (", ".join(f"{c.name} was restarted "
                      f"{plural(c.restarts, 'time', 's')}"
                      for c in restarted)
            + f" (--max-restarts {max_restarts})")


def describe_losses(tolerated, survived):
    """'the job survived the loss of worker 1 (--tolerate)', or '':
    `tolerated`, the children the job went on without; `survived`, their
    names: why."""
    if not tolerated:
        return ""
    whys = [survived.get(c.name, "--tolerate") for c in tolerated]
    if all(w.startswith("--tolerate") for w in whys):
        lost = ", ".join(c.name for c in tolerated)
        return f"the job survived the loss of {lost} (--tolerate)"
    lost = ", ".join(
        f"{c.name} ({'--tolerate' if w.startswith('--tolerate') else w})"
        for c, w in zip(tolerated, whys))
    return f"the job survived the loss of {lost}"
