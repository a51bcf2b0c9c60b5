"""bench/chaos's schedules: what a seed draws (2 or 3 faults, each with
its node, step, delay and hold), what a fault may lose, when a schedule
may end the job (PASS-restore), a fault's description, which host pairs
partitions cut (Reach), and the verdicts by kind. bench/chaos/README.md
says what is drawn."""

import random

SERVERS, WORKERS = 3, 2
NODES = ([("scheduler", None)] + [("server", i) for i in range(SERVERS)] +
         [("worker", i) for i in range(WORKERS)])
HEARTBEAT_TIMEOUT_S = 3.0
MAX_RESTARTS = 2  # the job's --max-restarts
KINDS = ("kill", "stop", "drops", "disk", "link", "partition")
# The kinds a schedule drawn before partitions existed was drawn from:
# `--faults kill,stop,drops,disk,link --seed S` replays it.
NETNS_KINDS = ("link", "partition")


# -- Schedules ------------------------------------------------------------

def node_name(role, rank):
    return role if rank is None else f"{role} {rank}"


def draw(seed, steps, kinds):
    """The faults of schedule `seed`: 2 or 3 dicts {kind, node, step,
    delay_ms, hold_s (None: never undone)}, in the order they fire; a
    partition's also `side`, the [(role, rank)] it cuts off from the rest."""
    rng = random.Random(seed)
    faults = []
    for _ in range(rng.choice((2, 3))):
        left = [k for k in kinds if not any(
            f["kind"] == k for f in faults if k in ("drops", "disk"))]
        if not left:
            break
        kind = rng.choice(left)
        role, rank = rng.choice(NODES)
        fault = {"kind": kind, "node": node_name(role, rank), "role": role,
                 "rank": rank, "step": rng.randint(8, steps - 6),
                 "delay_ms": rng.randrange(0, 400), "hold_s": None}
        if kind == "stop" or kind == "link":
            fault["hold_s"] = rng.choice(
                (round(rng.uniform(0.3, 0.6 * HEARTBEAT_TIMEOUT_S), 1),
                 round(rng.uniform(1.5, 2.5) * HEARTBEAT_TIMEOUT_S, 1),
                 None))
        elif kind == "disk":
            fault["hold_s"] = rng.choice((round(rng.uniform(1, 5), 1), None))
        elif kind == "partition":
            fault["side"] = draw_side(rng)
            fault["hold_s"] = rng.choice((round(rng.uniform(0.3, 8), 1),
                                          None))
        if kind in ("drops", "disk", "partition"):
            fault["node"] = fault["role"] = fault["rank"] = None
        if kind == "drops":
            fault["step"] = 0
        faults.append(fault)
    return sorted(faults, key=lambda f: (f["step"], f["delay_ms"]))


def draw_side(rng):
    """A minority of the hosts, both sides alive: the scheduler alone, a
    server with its replica (server r+1 holds server r's keys), or a
    worker with a server."""
    shape = rng.choice(("scheduler", "server+replica", "worker+server"))
    if shape == "scheduler":
        return [("scheduler", None)]
    server = rng.randrange(SERVERS)
    if shape == "server+replica":
        return [("server", server), ("server", (server + 1) % SERVERS)]
    return [("worker", rng.randrange(WORKERS)), ("server", server)]


def faulted_nodes(fault):
    """The names of the nodes a fault hits (none for drops and disk)."""
    if fault["kind"] == "partition":
        return [node_name(role, rank) for role, rank in fault["side"]]
    return [fault["node"]] if fault["node"] else []


def may_lose(fault):
    """Whether the fault may end the runs of the nodes it hits: the others
    may declare them dead (a hold within a fifth of the heartbeat timeout
    counts as long enough)."""
    return fault["kind"] == "kill" or (
        fault["kind"] in ("stop", "link", "partition") and (
            fault["hold_s"] is None
            or fault["hold_s"] >= 0.8 * HEARTBEAT_TIMEOUT_S))


def restore_allowed(faults):
    """Why the schedule may end the job (and be judged on a --restore), or
    None: it must end with exit 0. Either two servers may be lost (any two
    of three hold both copies of a range: server r+1 is server r's
    replica) or one node may be lost more often than --max-restarts."""
    servers, runs = set(), {}
    for fault in faults:
        if not may_lose(fault):
            continue
        for name in faulted_nodes(fault):
            if name.startswith("server"):
                servers.add(name)
            else:
                runs[name] = runs.get(name, 0) + 1
    if len(servers) >= 2:
        return (f"{' and '.join(sorted(servers))} lost: a range lost both "
                f"copies")
    spent = [(n, c) for n, c in sorted(runs.items()) if c > MAX_RESTARTS]
    if spent:
        return f"{spent[0][0]} lost {spent[0][1]} times: restarts spent"
    return None


def describe(fault):
    kind = fault["kind"]
    if kind == "drops":
        return "1% drops"
    hold = ("never undone" if fault["hold_s"] is None
            else f"for {fault['hold_s']} s")
    at = f"at step {fault['step']}+{fault['delay_ms']}ms"
    if kind == "kill":
        return f"kill -9 {fault['node']} {at}"
    if kind == "stop":
        return f"SIGSTOP {fault['node']} {at} {hold}"
    if kind == "link":
        return f"link of {fault['node']} cut {at} {hold}"
    if kind == "partition":
        hold = ("never healed" if fault["hold_s"] is None
                else f"healed after {fault['hold_s']} s")
        side = ", ".join(faulted_nodes(fault))
        return f"partition {{{side}}} | the rest {at}, {hold}"
    return f"disk full {at} {hold}"


class Reach:
    """The host pairs that partitions cut, by fault: a pair is healed when
    the last fault that cuts it is (two partitions may share pairs)."""

    def __init__(self, hosts):
        self.hosts = hosts
        self.held = {}  # fault: the pairs (a, b), a < b, it still cuts

    def cut(self, fault, pairs):
        self.held.setdefault(fault, set()).update(pairs)
        self.hosts.set_reach(sorted(pairs), False)

    def heal(self, fault, pairs):
        mine = self.held.get(fault, set()) & set(pairs)
        self.held[fault] = self.held.get(fault, set()) - mine
        still = set().union(*self.held.values())
        if mine - still:
            self.hosts.set_reach(sorted(mine - still), True)


def by_kind(rows, faults_of):
    """Per fault kind: how many schedules held it, by verdict."""
    verdicts = ("PASS", "PASS-restore", "FAIL")
    print("\nby fault kind (a schedule counts once under each kind it holds)")
    print("kind       schedules  " + "  ".join(verdicts))
    for kind in KINDS:
        held = [r for r in rows if any(f["kind"] == kind
                                       for f in faults_of(r[0]))]
        if held:
            counts = [sum(r[2] == v for r in held) for v in verdicts]
            print(f"{kind:<10} {len(held):>9}  " + "  ".join(
                f"{c:>{len(v)}}" for c, v in zip(counts, verdicts)))
