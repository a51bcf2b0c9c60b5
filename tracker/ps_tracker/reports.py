"""Whose word on a death counts, as the launcher reads the nodes' lines.

A report is (declared name, reason, reporter's name), as a node logged
"<name> (tcp://...) was declared dead: <reason>". The scheduler judges
the members, and a member judges only the scheduler. A member's word on
the scheduler counts when it found the scheduler's process gone (its
connection closed and every reconnect refused), or, for silence, when
more than half of the job's members gave it: a member that alone stopped
hearing the scheduler was cut off from it, and is the one to name.
"""

# The reason a member gives for a scheduler it no longer hears: silence,
# which a cut link makes as well as a dead scheduler.
SILENCE = "no heartbeat"


def quorum_lost(reports, members):
    """(members that declared the scheduler dead, members) when more than
    half of the job's `members` did, else None."""
    saying = {rep for name, _, rep in reports
              if name == "scheduler" and rep != "scheduler"}
    return (len(saying), members) if 2 * len(saying) > members else None


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
