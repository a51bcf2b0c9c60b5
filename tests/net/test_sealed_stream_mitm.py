"""An attacker on the path of a sealed job: mnist_dist (one server, one
worker, BSP, the launcher's job key) on separate hosts (netns_hosts.py),
every connection the worker makes passing through a ZMTP proxy on a host
of its own (zmtp_proxy.py) that deletes, repeats and swaps whole messages,
or records the worker's connection to the scheduler and replays it into a
restarted scheduler. Each job must end with the weights of the same job
without a fault, bit for bit, and the logs show the refusal or the new
session the fault costs.

The proxy is put on the path by routing, not by configuration: the proxy's
host holds the scheduler's and the server's addresses on its loopback, and
the worker's host routes both through it; the proxy reaches the real
nodes by a rule for its own packets (iif lo) that looks them up in a table
of their own. So the worker's connections to the scheduler (its
registration, barriers, heartbeats: control) and to the server (its pushes
and pulls: data), with the answers (WELCOME, ACK, RESET) on them, pass the
proxy; the scheduler's and the server's own connections to the worker go
direct.

Skipped, saying why, without root or iproute2. Paths: PS_BUILD_DIR
(default build/), PS_MNIST_DIR (default data/mnist). MITM_TRACE=1 prints
every message the proxy passes and each job's output.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_hosts  # noqa: E402
from test_cross_host import (MNIST_DIR, MNIST_DIST, main,  # noqa: E402
                             why_skip)

PROXY_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "zmtp_proxy.py")
JOB_TIMEOUT = 120  # Seconds; each job takes ~10 on an idle machine.
SCHEDULER, SERVER, WORKER, PROXY = 1, 2, 3, 4  # hosts
PLAN = [("scheduler", None, SCHEDULER), ("server", 0, SERVER),
        ("worker", 0, WORKER)]
ROOT_PORT, SERVER_PORT = 9100, 9200
ADDR = netns_hosts.Hosts.addr
TO_SCHEDULER = f"{ADDR(SCHEDULER)}:{ROOT_PORT}"
TO_SERVER = f"{ADDR(SERVER)}:{SERVER_PORT}"
# 1280 images, one worker x 16 a step: 80 BSP steps; mnist_dist's defaults
# before the one-cycle recipe, pinned.
ARGS = ["--epochs", "1", "--lr_schedule", "step", "--ema_decay", "0",
        "--lr_ref_batch", "0", "--max_shift", "0", "--label_smoothing", "0",
        "--train_limit", "1280", "--test_limit", "100", "--dropout=false",
        "--optimizer", "sgd", "--lr", "0.01", "--momentum", "0.9",
        "--consistency", "bsp", "--threads", "1", "--batch_size", "16",
        "--log_every_s", "0.2", "--data_dir", MNIST_DIR]
# The server binds the first port of the range on its host: the proxy's.
ENV = {"PS_PORT_RANGE": f"{SERVER_PORT}-{SERVER_PORT + 9}"}
REFUSED = re.compile(r"(a gap|a repeat or reorder) in the sealed stream: "
                     r"message numbered \d+, expected \d+")
NEW_SESSION = re.compile(r"a new session to tcp://\S+: \d+ messages sent "
                         r"again|refused a message out of order|no answer "
                         r"from \S+ to \d+ probes: starting a new session")
REFUSED_LINE = re.compile(r"^\[[^]]*\] .*(a gap|a repeat or reorder) in "
                          r"the sealed stream", re.M)
SERVER_DONE = re.compile(r"\[server 0\] server 0 done: .*?: (\d+) updates "
                         r"applied")
STEPS = 80


def _check(result, what):
    if result.returncode != 0:
        raise netns_hosts.HostsError(f"{what}: {result.stdout.strip()}")


def put_proxy_on_path(hosts):
    """Routes the worker's connections to the scheduler and the server through
    the proxy's host, which takes them as its own (their addresses on its
    loopback) and reaches the real nodes through table 100."""
    def sysctl(host, name, value):
        _check(hosts.run(host, ["sh", "-c", f"echo {value} > "
                                f"/proc/sys/net/ipv4/conf/{name}"]), name)
    for name in ("all/arp_ignore", "eth0/arp_ignore"):
        sysctl(PROXY, name, 1)  # ARP answers for eth0's own address only
    for name in ("all/arp_announce", "eth0/arp_announce"):
        sysctl(PROXY, name, 2)
    for name in ("all/accept_local", "eth0/accept_local"):
        sysctl(PROXY, name, 1)  # the real nodes' packets, from "its" address
    # The local table after the proxy's own rule, not before it.
    _check(hosts.run(PROXY, ["ip", "rule", "add", "pref", "1000", "lookup",
                             "local"]), "ip rule")
    _check(hosts.run(PROXY, ["ip", "rule", "del", "pref", "0"]), "ip rule")
    for target, port in ((SCHEDULER, ROOT_PORT), (SERVER, SERVER_PORT)):
        a = f"{ADDR(target)}/32"
        for host, cmd in (
                # The worker's connections only: not its answers to the
                # scheduler's and the server's connections to it.
                (WORKER, ["ip", "rule", "add", "pref", "10", "to", a,
                          "ipproto", "6", "dport", str(port), "lookup",
                          "100"]),
                (WORKER, ["ip", "route", "add", a, "via", ADDR(PROXY),
                          "table", "100"]),
                (PROXY, ["ip", "addr", "add", a, "dev", "lo"]),
                (PROXY, ["ip", "rule", "add", "pref", "10", "iif", "lo", "to",
                         a, "lookup", "100"]),
                (PROXY, ["ip", "route", "add", a, "dev", "eth0", "src",
                         ADDR(PROXY), "table", "100"])):
            _check(hosts.run(host, cmd), " ".join(cmd))


class ProxiedJob(netns_hosts.HostJob):
    """HostJob whose nodes the launcher's logic can restart (--max-restarts
    N: a killed scheduler is started again on its host)."""

    def __init__(self, hosts, command, max_restarts=0):
        super().__init__(hosts, PLAN, command, dict(ENV), ROOT_PORT, True,
                         None)
        self.args.max_restarts = max_restarts

    def popen(self, child, port):
        host = next(h for role, rank, h in self.plan
                    if role == child.role and rank == child.rank)
        self.args.extra_env["DMLC_NODE_HOST"] = self.hosts.addr(host)
        env = netns_hosts.launch.child_env(self.args, port, child.role,
                                           child.rank, self.key_path,
                                           restarts=child.restarts)
        return self.hosts.popen(host, self.args.command,
                                stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)

    def start(self, port):
        self.port = port
        for role, rank, _ in self.plan:
            child = netns_hosts.launch.Child(role, rank)
            child.proc = self.popen(child, port)
            self.children.append(child)
            self.read_output(child, f"[{child.tag}] ")
        return True


class Proxy:
    """zmtp_proxy.py on the proxy's host, forwarding the worker's two
    connections; its output kept as lines."""

    def __init__(self, hosts, faults=(), record=None):
        cmd = [sys.executable, "-u", PROXY_PY, "proxy",
               "--forward", f"{TO_SCHEDULER}={TO_SCHEDULER}",
               "--forward", f"{TO_SERVER}={TO_SERVER}",
               "--seconds", str(3 * JOB_TIMEOUT)]
        if os.environ.get("MITM_TRACE"):
            cmd.append("--trace")
        for fault in faults:
            cmd += ["--fault", json.dumps(fault)]
        if record:
            cmd += ["--record", f"{TO_SCHEDULER},0,{record}"]
        self.proc = hosts.popen(PROXY, cmd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        first = self.proc.stdout.readline()
        if "proxy: listening" not in first:
            raise AssertionError(f"the proxy did not start: {first}"
                                 f"{self.proc.stdout.read()}")
        self.lines = [first]
        self.reader = threading.Thread(target=self._read,
                                                   daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=20)
        self.reader.join(timeout=5)
        self.proc.stdout.close()
        return "".join(self.lines)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


@unittest.skipIf(why_skip(), why_skip())
class SealedStreamMitm(unittest.TestCase):
    """Each case a job with the proxy on the worker's path."""

    @classmethod
    def setUpClass(cls):
        netns_hosts.remove_stale()
        netns_hosts.exit_on_sigterm()
        cls.tmp = tempfile.TemporaryDirectory(prefix="ps-net-mitm-")
        cls.clean = os.path.join(cls.tmp.name, "clean.bin")
        rc, why, out, proxied = cls.run_job(cls.clean, [])
        if rc != 0:
            raise AssertionError(f"the fault-free job failed: {why}\n{out}"
                                 f"\n--- proxy\n{proxied}")
        cls.clean_out = out
        if os.environ.get("MITM_TRACE"):
            print(proxied)
        cls.clean_proxied = proxied

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @staticmethod
    def run_job(weights, faults, during=None, max_restarts=0, record=None):
        """The job with the proxy and its faults; `during(hosts, job,
        proxy)` runs, in a thread of its own, once the job started.
        Returns (rc, why, the job's output, the proxy's)."""
        with netns_hosts.Hosts(4) as hosts:
            put_proxy_on_path(hosts)
            proxy = Proxy(hosts, faults, record)
            job = ProxiedJob(hosts, [MNIST_DIST, "--dump_weights", weights] +
                             ARGS, max_restarts)
            failed = []

            def act():
                try:
                    during(hosts, job, proxy)
                except BaseException as err:  # re-raised below
                    failed.append(err)
            actor = threading.Thread(target=act, daemon=True)
            try:
                job.start(job.root_port)
                if during is not None:
                    # Alongside the launcher's logic, which restarts what
                    # it kills.
                    actor.start()
                rc, why = job.finish(time.monotonic() + JOB_TIMEOUT)
            finally:
                if actor.ident is not None:  # started
                    actor.join(timeout=JOB_TIMEOUT)
                job.close()
                proxied = proxy.stop()
            if failed:
                raise failed[0]
        return rc, why, "".join(job.lines), proxied

    def expect_fault_free(self, name, faults, refused=True, new_session=True,
                          **kwargs):
        """Runs the job with faults; asserts the fault was applied, the job
        ended 0 with every step applied once and the fault-free weights,
        and (refused) that the receiver refused the stream after it and the
        sender started a new session. Returns (job's output, proxy's)."""
        weights = os.path.join(self.tmp.name, name + ".bin")
        rc, why, out, proxied = self.run_job(weights, faults, **kwargs)
        report = f"{why}\n--- job\n{out}\n--- proxy\n{proxied}"
        if faults:
            self.assertIn(" fault: ", proxied, report)
        self.assertEqual(rc, 0, report)
        self.assertEqual([int(n) for n in SERVER_DONE.findall(out)],
                         [STEPS], report)
        if refused:
            self.assertRegex(out, REFUSED, report)
        if new_session:
            self.assertRegex(out, NEW_SESSION, report)
        a, b = read_bytes(self.clean), read_bytes(weights)
        self.assertEqual(len(a), 4 * 1199882)
        self.assertTrue(a == b, f"{name}: the weights differ from the "
                        f"fault-free job's\n{report}")
        faults_seen = [line.split(" fault: ", 1)[1]
                       for line in proxied.splitlines() if " fault: " in line]
        if os.environ.get("MITM_TRACE"):
            print(report)
        print(f"{name}: {'; '.join(faults_seen) or 'no fault'}; weights "
              f"bit-equal")
        return out, proxied

    def test_worker_barrier_deleted(self):
        # The worker's first 38-byte message to the scheduler after its
        # registration: its first barrier (control).
        out, _ = self.expect_fault_free("barrier", [{
            "listen": TO_SCHEDULER, "dir": "c2s", "action": "drop",
            "kind": "sealed", "min_bytes": 38, "max_bytes": 38}])
        self.assertIn("[scheduler]", REFUSED_LINE.search(out).group(0))

    def test_push_record_deleted(self):
        # A record (128 KiB of a streamed push) mid-job (data).
        out, _ = self.expect_fault_free("data", [{
            "listen": TO_SERVER, "dir": "c2s", "action": "drop",
            "kind": "sealed", "min_bytes": 100000, "nth": 400}])
        self.assertIn("[server 0]", REFUSED_LINE.search(out).group(0))

    def test_push_record_repeated(self):
        self.expect_fault_free("repeat", [{
            "listen": TO_SERVER, "dir": "c2s", "action": "repeat",
            "kind": "sealed", "min_bytes": 100000, "nth": 300}])

    def test_two_messages_swapped(self):
        # A push's header and its first record.
        self.expect_fault_free("swap", [{
            "listen": TO_SERVER, "dir": "c2s", "action": "swap",
            "kind": "sealed", "min_bytes": 1000, "max_bytes": 2000,
            "nth": 20}])

    def test_welcome_and_ack_deleted(self):
        # The answers: the WELCOME of the worker's connection to the
        # scheduler and an ACK of the server's. The sender offers again and
        # probes: nothing is refused, no session is given up.
        self.expect_fault_free("answers", [
            {"listen": TO_SCHEDULER, "dir": "s2c", "action": "drop",
             "kind": "welcome"},
            {"listen": TO_SERVER, "dir": "s2c", "action": "drop",
             "kind": "ack", "nth": 5}], refused=False, new_session=False)

    def test_replayed_connection_into_a_restarted_scheduler(self):
        record = os.path.join(self.tmp.name, "worker-to-scheduler.bin")
        replayed = []

        def kill_and_replay(hosts, job, proxy):
            self.assertIsNotNone(job.wait_for_line(
                r"\[worker 0\] worker 0 epoch 0 step ([2-9]\d)",
                JOB_TIMEOUT), "".join(job.lines))
            # The worker's connections to the scheduler go nowhere until
            # the replay is done, so that the replay is the first the
            # restarted scheduler hears of the worker's address.
            route = ["ip", "route", "replace", f"{ADDR(SCHEDULER)}/32",
                     "table", "100"]
            _check(hosts.run(WORKER, route[:3] + ["blackhole"] + route[3:]),
                   "blackhole")
            try:
                scheduler = job.children[0]
                os.killpg(scheduler.proc.pid, signal.SIGKILL)
                r = hosts.run(PROXY, [sys.executable, "-B", PROXY_PY,
                                      "replay", record, TO_SCHEDULER],
                              timeout=60)
                replayed.append(r.stdout)
                _check(r, "replay")
            finally:
                _check(hosts.run(WORKER, route + ["via", ADDR(PROXY)]),
                       "route")

        out, _ = self.expect_fault_free(
            "replay", [], refused=False, new_session=False,
            during=kill_and_replay, max_restarts=1, record=record)
        self.assertIn("scheduler (pid", out)
        self.assertIn("restarting it", out)
        self.assertIn("the restarted scheduler took the running job over",
                      out)
        # Admitted (the token proves the job's key and names the
        # scheduler's static key, which a restart keeps), its session's
        # HELLO answered with fresh keys, and its recorded messages
        # refused: they were sealed for the first scheduler's session.
        self.assertIn("sent INITIATE, got READY", replayed[0])
        self.assertIn("sent the session HELLO, got welcome", replayed[0])
        self.assertRegex(out, r"\[scheduler\] .*dropped a message from .*"
                         r"sealed frames refused")
        print(replayed[0])

    def test_fault_free_job_passes_the_proxy(self):
        # Both of the worker's connections went through the proxy.
        for where in (TO_SCHEDULER, TO_SERVER):
            self.assertIn(f"proxy: {where} connection 0 from "
                          f"{ADDR(WORKER)}:", self.clean_proxied)
        self.assertNotRegex(self.clean_out, REFUSED)


if __name__ == "__main__":
    main()
