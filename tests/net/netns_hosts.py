#!/usr/bin/env python3
"""Separate hosts on one machine: H network + PID namespaces on one bridge.

Host i (1-based, named "h<i>") has its own network, PID and mount
namespaces, held by a `sleep` that is its pid 1 (and has /proc of its own).
Its one interface, eth0, has 198.18.0.<i>/24 (RFC 2544's benchmarking
range) and is a veth pair's end; the other end, "h<i>", is a port of bridge
br0 in a network namespace of its own, so nothing touches the machine's
real network and no traffic leaves these namespaces. ps derives its
shared-memory domain from the PID namespace (src/van/shm.cc), so nodes on
different hosts talk only through their sockets, as on real machines,
while nodes of one host may still share memory. With a rate, both
directions of every host's link are shaped by a tbf qdisc (this kernel has
no netem: no added delay).

The namespaces are named nowhere (no /run/netns; `ip netns` is not used,
so this works in a chroot too): they live as long as their holders, whose
argv[0] is "psn<pid>-br" or "psn<pid>-h<i>" (pid: the creating process), so
parallel runs never collide. `down()` (also on leaving the `with`, and at
exit) kills the holders, and with them every process of the hosts.

  with Hosts(4, rate="1gbit") as hosts:
      hosts.run(2, ["ip", "addr"])                 # like a command on h2
      job = hosts.job([("scheduler", None, 1), ("server", 0, 2),
                       ("worker", 0, 3)], ["build/bench/kv/kv_bench"])
      rc, why = job.run(timeout=60)

CLI (root): netns_hosts.py up H [--rate R]   -> prints the set's tag
            netns_hosts.py exec TAG HOST CMD...
            netns_hosts.py counters TAG
            netns_hosts.py down [TAG]  (no TAG: every set of this prefix
                                        whose creating process has exited,
                                        but those that `up` made)
Standard library only; needs root, iproute2, util-linux (nsenter, unshare),
mount and bash.
"""

import argparse
import atexit
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

PREFIX = "psn"
SUBNET = "198.18.0."  # Host i is SUBNET + str(i), i in [1, MAX_HOSTS].
MAX_HOSTS = 250
STATE_DIR = "/run/ps-netns"  # The CLI's sets: TAG.json = holder pids.
COMMAND_TIMEOUT = 20  # Seconds for one ip/tc command.
HOLDER = re.compile(PREFIX + r"(\d+)-(br|h\d+)")  # A holder's argv[0].

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location(
    "launch", os.path.join(ROOT, "tracker", "launch.py"))
launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launch)


class HostsError(RuntimeError):
    """A namespace command failed; the message names it and its output."""


def _sh(*cmd, check=True):
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True,
                       timeout=COMMAND_TIMEOUT)
    if check and r.returncode != 0:
        raise HostsError(f"'{' '.join(cmd)}' failed ({r.returncode}): "
                         f"{r.stdout.strip()}")
    return r.stdout


def _in_net(pid, *cmd):
    """cmd run in the network namespace of process pid."""
    return _sh("nsenter", "-t", str(pid), "-n", "--", *cmd)


def missing_requirements():
    """None if hosts can be made here, else why not (for a test's skip)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "tc", "nsenter", "unshare", "bash", "mount"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"],
                          stdout=subprocess.DEVNULL).returncode != 0:
            return (f"'{tool}' not found (apt-get install iproute2 "
                    f"util-linux bash mount)")
    try:
        _sh("unshare", "--net", "--", "ip", "link", "add", "probe0", "type",
            "bridge")
    except HostsError as err:
        return f"cannot make a network namespace with a bridge: {err}"
    return None


def tbf_burst(rate):
    """Bytes of tbf burst for a rate like '1gbit': 2 ms at the rate, at
    least 64 KiB (a GSO packet)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate)
    if m is None:
        raise ValueError(f"rate '{rate}' is not like 100mbit, 1gbit, 10gbit")
    bits = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[
        m.group(2)]
    return max(64 * 1024, int(bits / 8 * 0.002))


class Hosts:
    """H hosts on one bridge; see the module's docstring. Not thread-safe."""

    def __init__(self, count, rate=None, tag=None):
        if not 1 <= count <= MAX_HOSTS:
            raise ValueError(f"hosts: count must be in [1, {MAX_HOSTS}], "
                             f"got {count}")
        if rate is not None:
            tbf_burst(rate)  # Checks it.
        self.count = count
        self.rate = rate
        self.tag = tag or f"{PREFIX}{os.getpid()}"
        self.bridge = None  # pid of the bridge namespace's holder
        self.holders = {}  # host -> pid (as we see it) of its pid 1
        self._unshares = []

    @staticmethod
    def addr(host):
        return f"{SUBNET}{host}"

    def __enter__(self):
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc):
        self.down()

    def up(self):
        atexit.register(self.down)
        self.bridge = self._start_holder(f"{self.tag}-br", pid_ns=False)
        br = self.bridge
        _in_net(br, "ip", "link", "set", "lo", "up")
        _in_net(br, "ip", "link", "add", "br0", "type", "bridge")
        _in_net(br, "ip", "link", "set", "br0", "up")
        for h in range(1, self.count + 1):
            pid = self._start_holder(f"{self.tag}-h{h}", pid_ns=True)
            self.holders[h] = pid
            _in_net(br, "ip", "link", "add", f"h{h}", "type", "veth", "peer",
                    "name", "eth0", "netns", str(pid))
            _in_net(br, "ip", "link", "set", f"h{h}", "master", "br0")
            _in_net(br, "ip", "link", "set", f"h{h}", "up")
            _in_net(pid, "ip", "addr", "add", f"{self.addr(h)}/24", "dev",
                    "eth0")
            _in_net(pid, "ip", "link", "set", "eth0", "up")
            _in_net(pid, "ip", "link", "set", "lo", "up")
            if self.rate is not None:
                self._shape(pid, "eth0")  # host -> bridge
                self._shape(br, f"h{h}")  # bridge -> host
        self._wait_links()

    def _shape(self, pid, dev):
        _in_net(pid, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                "rate", self.rate, "burst", str(tbf_burst(self.rate)),
                "latency", "20ms")

    def _start_holder(self, name, pid_ns):
        """Starts a `sleep` named `name` in a new network namespace (and,
        with pid_ns, as pid 1 of new PID and mount namespaces with /proc of
        their own); returns its pid as we see it."""
        if pid_ns:
            # Propagation unchanged: "/" need not be a mount point (chroot);
            # /proc alone is made private before the new one covers it.
            cmd = ["unshare", "--net", "--pid", "--mount", "--fork",
                   "--kill-child", "--propagation", "unchanged", "--",
                   "bash", "-c", 'mount --make-rprivate /proc && '
                   'mount -t proc proc /proc && exec -a "$0" sleep infinity',
                   name]
        else:
            cmd = ["unshare", "--net", "--", "bash", "-c",
                   'exec -a "$0" sleep infinity', name]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE,
                                start_new_session=True)
        self._unshares.append(proc)
        for _ in range(200):  # 10 s
            for pid in [proc.pid] + _children(proc.pid):
                if _argv0(pid) == name:
                    return pid
            if proc.poll() is not None:
                raise HostsError(f"holder {name} exited {proc.returncode}: "
                                 f"{proc.stderr.read().decode().strip()}")
            time.sleep(0.05)
        raise HostsError(f"holder {name} did not start within 10 s")

    def _wait_links(self):
        """Until every eth0 is up (veth carrier comes asynchronously)."""
        for h, pid in self.holders.items():
            for _ in range(100):  # 5 s
                if "LOWER_UP" in _in_net(pid, "ip", "link", "show", "eth0"):
                    break
                time.sleep(0.05)
            else:
                raise HostsError(f"h{h}'s eth0 has no carrier after 5 s")

    def down(self):
        """Kills every process of the hosts, and so their namespaces.

        Idempotent; never raises (it runs from finally and atexit)."""
        for pid in list(self.holders.values()) + [self.bridge]:
            if pid is not None:
                _kill(pid)  # A pid 1: all of its PID namespace dies too.
        self.holders = {}
        self.bridge = None
        for proc in self._unshares:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stderr.close()
        self._unshares = []
        remove_set(self.tag)

    def command(self, host, cmd, cwd=None):
        """cmd run on `host` (its network, PID and mount namespaces)."""
        if host not in self.holders:
            raise ValueError(f"no host h{host} (1..{self.count}) is up")
        # -r: the holder's root, which a chroot's holder keeps (entering
        # a mount namespace alone would move to the machine's real root).
        return ["nsenter", "-t", str(self.holders[host]), "-n", "-p", "-m",
                "-r", f"--wd={cwd or os.getcwd()}", "--"] + list(cmd)

    def run(self, host, cmd, timeout=COMMAND_TIMEOUT, **kwargs):
        """subprocess.run of cmd on host, output captured as text."""
        return subprocess.run(self.command(host, cmd), text=True,
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout,
                              **kwargs)

    def popen(self, host, cmd, **kwargs):
        """Popen of cmd on host in a new session (so killpg reaches it)."""
        return subprocess.Popen(self.command(host, cmd),
                                start_new_session=True, **kwargs)

    def counters(self):
        """{host: (bytes host sent, bytes host received)} on its link."""
        out = json.loads(_in_net(self.bridge, "ip", "-j", "-s", "link",
                                 "show", "master", "br0"))
        stats = {}
        for link in out:
            m = re.fullmatch(r"h(\d+)", link["ifname"])
            if m:
                s = link["stats64"]
                stats[int(m.group(1))] = (s["rx"]["bytes"], s["tx"]["bytes"])
        return stats

    def set_link(self, host, up):
        """Plugs (up=True) or cuts host's link at the bridge."""
        _in_net(self.bridge, "ip", "link", "set", f"h{host}",
                "up" if up else "down")

    def set_reach(self, pairs, reach):
        """Cuts (reach=False) or restores the path between the hosts of each
        pair (a, b), both ways, with blackhole routes in each host's own
        namespace: what one sends to the other is dropped on the way out,
        as by a partitioned network, while both links stay up. (A connect
        across the cut fails at once, EINVAL, where a real partition lets
        it time out.)"""
        others = {}
        for a, b in pairs:
            others.setdefault(a, set()).add(b)
            others.setdefault(b, set()).add(a)
        verb = "del" if reach else "replace"
        for host, far in sorted(others.items()):
            batch = "".join(f"route {verb} blackhole {self.addr(h)}/32\n"
                            for h in sorted(far))
            # -force: a route already gone (healed twice) is no error.
            r = subprocess.run(
                ["nsenter", "-t", str(self.holders[host]), "-n", "--", "ip",
                 "-force", "-batch", "-"], input=batch, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                timeout=COMMAND_TIMEOUT)
            if r.returncode != 0 and not reach:
                raise HostsError(f"h{host}: ip -batch failed "
                                 f"({r.returncode}): {r.stdout.strip()}")

    def job(self, plan, command, env=None, root_port=9100, key=True,
            out=None):
        """A ps job with each node on its host; see HostJob."""
        return HostJob(self, plan, command, env or {}, root_port, key, out)


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _argv0(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return None


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def holders():
    """{pid: argv[0]} of every holder of PREFIX on this machine."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            name = _argv0(int(entry))
            if name and HOLDER.fullmatch(name):
                found[int(entry)] = name
    return found


def remove_set(tag):
    """Kills the holders of set `tag` (and so everything on its hosts)."""
    for pid, name in holders().items():
        if name.startswith(tag + "-"):
            _kill(pid)
    try:
        os.unlink(os.path.join(STATE_DIR, tag + ".json"))
    except OSError:
        pass


def remove_stale():
    """Removes every set of PREFIX whose creating process has exited (a run
    killed before its cleanup), except those made by the CLI's `up`;
    returns their tags."""
    tags = {HOLDER.fullmatch(name).group(1) for name in holders().values()}
    stale = sorted(PREFIX + t for t in tags
                   if not os.path.exists(f"/proc/{t}")
                   and not os.path.exists(os.path.join(
                       STATE_DIR, PREFIX + t + ".json")))
    for tag in stale:
        remove_set(tag)
    return stale


def exit_on_sigterm():
    """SIGTERM (a test runner's timeout) raises SystemExit, so that `with`
    blocks and atexit still remove the hosts. For a program's main."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, handler)


class _Mux(launch.OutputMux):
    """launch.py's prefixed output, kept as lines (and copied to `out`)."""

    def __init__(self, out):
        super().__init__()
        self.out = out
        self.lines = []

    def write(self, stream, data):
        with self._lock:
            self.lines.append(data.decode(errors="replace"))
            if self.out is not None:
                self.out.write(data)
                self.out.flush()


class HostJob(launch.Job):
    """One ps job whose nodes run on hosts, as tracker/launch.py runs them.

    plan: [(role, rank or None, host)], the scheduler first. Each node gets
    launch.py's environment (launch.child_env: DMLC_*, PS_RANK, PS_KEY_FILE
    of a new job key unless key=False, OMP_WAIT_POLICY) plus env, with
    DMLC_PS_ROOT_URI = the scheduler's host address and DMLC_NODE_HOST =
    its own, and GLOG_logtostderr=1 unless env says otherwise: the hosts
    share one /tmp, and their first nodes, all pid 2, would collide in
    glog's file names (program.host.user.log.LEVEL.time.pid). run() watches
    them with launch.py's logic (the first failure stops the rest, and the
    job's last line names a node "declared dead" if one was), except that
    the scheduler's verdict comes first (first_report).
    """

    def __init__(self, hosts, plan, command, env, root_port, key, out):
        if not plan or plan[0][0] != "scheduler":
            raise ValueError("plan: the scheduler comes first")
        self.hosts = hosts
        self.plan = plan
        servers = sum(1 for role, _, _ in plan if role == "server")
        workers = sum(1 for role, _, _ in plan if role == "worker")
        args = argparse.Namespace(
            command=list(command), host=hosts.addr(plan[0][2]),
            num_servers=servers, num_workers=workers, extra_env=dict(env),
            grace=3.0, timeout=None, tolerate=[])
        args.extra_env.setdefault("GLOG_logtostderr", "1")
        super().__init__(args, _Mux(out))
        self.root_port = root_port
        self._key = launch.JobKey() if key else None
        self.key_path = self._key.path if key else None

    @property
    def lines(self):
        return self.mux.lines

    def _await_report(self, deadline):
        """Waits the whole grace: a node cut off from the others declares
        them dead as they declare it dead, so the first report may not be
        the scheduler's (launch.py stops at the first)."""
        end = time.monotonic() + launch.DEAD_REPORT_GRACE
        if deadline is not None:
            end = min(end, deadline)
        while self.signal_received is None and time.monotonic() < end:
            time.sleep(launch.POLL_SECONDS)

    def first_report(self):
        """Who was lost: the first node the scheduler declared dead, else
        launch.py's first report. A cut link splits the job and each side
        declares the other dead, by a hair in either order; the scheduler
        keeps the job's membership, so its verdict names the node cut off.
        (A cut scheduler, which then declares the others dead, is not
        tested.)"""
        with self._reports_lock:
            by_scheduler = [r for r in self._reports
                            if r[2] == "scheduler"]
        return by_scheduler[0] if by_scheduler else super().first_report()

    def start(self, port):
        for role, rank, host in self.plan:
            child = launch.Child(role, rank)
            self.args.extra_env["DMLC_NODE_HOST"] = self.hosts.addr(host)
            env = launch.child_env(self.args, port, role, rank, self.key_path)
            child.proc = self.hosts.popen(
                host, self.args.command, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            self.children.append(child)
            prefix = f"[{child.name}] "

            def watch(line, reporter=child.name):
                self._watch(reporter, line)
            child.readers = [
                self.mux.start_reader(child.proc.stdout, prefix, sys.stdout,
                                      watch),
                self.mux.start_reader(child.proc.stderr, prefix, sys.stderr,
                                      watch)]
            threading.Thread(target=self._reap, args=(child,),
                                    daemon=True).start()
        return True

    def run(self, timeout):
        """Starts, waits (at most timeout s); returns (rc, message) with
        launch.py's exit codes and last line."""
        try:
            self.start(self.root_port)
            return self.finish(time.monotonic() + timeout)
        finally:
            self.close()

    def close(self):
        """Stops what still runs; removes the job's key. Idempotent."""
        self.stop(self.running())
        if self._key is not None:
            self._key.remove()

    def finish(self, deadline):
        """Waits for a started job until the deadline; (rc, message)."""
        outcome, failed, returncode = self.wait(deadline)
        others = self.running()
        if outcome != "done":
            self.stop(self.children)
        self.drain_output()
        if outcome == "done":
            return launch.EXIT_OK, "all processes exited 0"
        if outcome == "failed":
            return launch.EXIT_FAILED, self.describe_failure(
                failed, returncode, others)
        names = ", ".join(c.name for c in others)
        return launch.EXIT_TIMEOUT, f"timeout; killed {names}"

    def wait_for_line(self, pattern, timeout):
        """The first output line matching the regex, or None after timeout
        (or once every node has exited)."""
        regex = re.compile(pattern)
        end = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < end:
            lines = list(self.lines)
            for line in lines[seen:]:
                if regex.search(line):
                    return line
            seen = len(lines)
            if self.children and not self.running():
                return None
            time.sleep(0.05)
        return None


def _save_state(hosts):
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(os.path.join(STATE_DIR, hosts.tag + ".json"), "w") as f:
        json.dump({"count": hosts.count, "bridge": hosts.bridge,
                   "holders": hosts.holders}, f)


def _load(tag):
    try:
        with open(os.path.join(STATE_DIR, tag + ".json")) as f:
            state = json.load(f)
    except OSError:
        sys.exit(f"netns_hosts: no set '{tag}' (made by `up`) is up")
    hosts = Hosts(state["count"], tag=tag)
    hosts.bridge = state["bridge"]
    hosts.holders = {int(h): pid for h, pid in state["holders"].items()}
    return hosts


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="netns_hosts.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("up", help="make H hosts; prints the set's tag")
    p.add_argument("count", type=int, metavar="H")
    p.add_argument("--rate", help="link rate each way, e.g. 1gbit")
    p = sub.add_parser("exec", help="run CMD on host h<HOST> of set TAG")
    p.add_argument("tag")
    p.add_argument("host", type=int)
    p.add_argument("command", nargs=argparse.REMAINDER)
    p = sub.add_parser("counters", help="bytes each host sent/received")
    p.add_argument("tag")
    p = sub.add_parser("down", help="remove set TAG, or every set of this "
                       "prefix whose creating process has exited (not made "
                       "by up)")
    p.add_argument("tag", nargs="?")
    args = parser.parse_args(argv)
    if args.cmd == "up":
        hosts = Hosts(args.count, rate=args.rate)
        with_cleanup = hosts.__enter__()
        atexit.unregister(hosts.down)  # The set outlives this command.
        _save_state(with_cleanup)
        print(hosts.tag)
    elif args.cmd == "exec":
        hosts = _load(args.tag)
        return subprocess.call(hosts.command(args.host, args.command))
    elif args.cmd == "counters":
        for h, (sent, received) in sorted(_load(args.tag).counters().items()):
            print(f"h{h} {Hosts.addr(h)} sent {sent} received {received}")
    elif args.tag:
        remove_set(args.tag)
    else:
        for tag in remove_stale():
            print(f"removed {tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
