#!/usr/bin/env python3
"""Chaos runs: random schedules of two or three faults (kill -9, SIGSTOP,
1% drops, a full checkpoint disk, a cut link on netns hosts) against the
ConvNet job (mnist_dist -s 3 -w 2 through tracker/launch.py, --replicas 1,
--max-restarts 2, checkpoints), each checked bit for bit against the
fault-free run; bench/chaos/README.md says what is drawn and judged.

  python3 bench/chaos/run.py BUILD_DIR [--minutes M | --schedules N]
  python3 bench/chaos/run.py BUILD_DIR --seed S      # replays schedule S

Verdict: PASS (exit 0, the reference's weights); PASS-restore (exit 1, the
launcher's last line names a faulted node first, and a fault-free
--restore from the checkpoints ends with the reference's weights); else
FAIL. Exit 1 if any schedule failed.
"""

import argparse
import errno
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "tracker" / "launch.py"


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The regexes of bench/faults: a worker's progress line, the final accuracy.
FAULTS = load("bench_faults", ROOT / "bench" / "faults" / "run.py")
STEP, ACCURACY = FAULTS.STEP, FAULTS.ACCURACY
sys.path.insert(0, str(Path(__file__).resolve().parent))
from schedule import (HEARTBEAT_TIMEOUT_S, KINDS, MAX_RESTARTS,  # noqa: E402
                      NETNS_KINDS, NODES, SERVERS, WORKERS, Reach, describe,
                      by_kind, draw, faulted_nodes, restore_allowed)

ENV = {"PS_HEARTBEAT_INTERVAL_MS": "300",
       "PS_HEARTBEAT_TIMEOUT_MS": str(int(HEARTBEAT_TIMEOUT_S * 1000)),
       "PS_RESEND_TIMEOUT_MS": "100", "PS_CONNECT_TIMEOUT_MS": "5000",
       "PS_RENDEZVOUS_TIMEOUT_MS": "30000",
       "PS_BARRIER_TIMEOUT_MS": "60000", "GLOG_logtostderr": "1"}
BATCH = 16
# mnist_dist's defaults before the one-cycle recipe (the figures of the
# README were taken with them), then this bench's own.
FLAGS = ["--epochs", "1", "--batch_size", "32", "--lr", "1e-3",
         "--lr_schedule", "step", "--ema_decay", "0", "--lr_ref_batch", "0",
         "--max_shift", "0",
         "--threads", "1", "--consistency", "bsp", "--dropout=false",
         "--optimizer", "sgd", "--lr", "0.02", "--momentum", "0.5",
         "--batch_size", str(BATCH), "--test_limit", "500", "--overlap",
         "off", "--log_every_s", "0.1", "--replicas", "1",
         "--checkpoint_every_steps", "5"]
LAUNCH_OPTS = ["--max-restarts", str(MAX_RESTARTS)]
MODEL_BYTES = 1199882 * 4
DISK_MB = 64  # the tmpfs of a disk fault: two checkpoint sets fit
NAMED = re.compile(r"(scheduler|server \d+|worker \d+) \(pid \d+\)")
RESTORED = re.compile(r"restore: resuming from the checkpoint of step (\d+)")


# -- One job --------------------------------------------------------------

def job_processes(tag):
    """{pid: environ dict} of this run's mnist_dist processes."""
    found = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                raw = f.read()
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm, state = stat[stat.find("(") + 1:].rsplit(") ", 1)
        if (f"CHAOS_RUN={tag}".encode() not in raw.split(b"\0") or
                comm != "mnist_dist" or state[:1] == "Z"):
            continue
        found[int(entry)] = dict(v.split("=", 1) for v in
                                 raw.decode(errors="replace").split("\0")
                                 if "=" in v)
    return found


def find_node(tag, role, rank, processes=None):
    """The pid of the newest run of that node, or None (processes: a
    job_processes(tag) already read)."""
    best = None
    found = job_processes(tag) if processes is None else processes
    for pid, env in found.items():
        if env.get("DMLC_ROLE") != role or (
                rank is not None and env.get("PS_RANK") != str(rank)):
            continue
        n = int(env.get("PS_RESTART_COUNT", "0"))
        if best is None or n > best[0]:
            best = (n, pid)
    return None if best is None else best[1]


def fill(folder):
    """Writes folder/filler until the disk is full; returns the path."""
    path = os.path.join(folder, "chaos-filler")
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
    return path


class Job:
    """One launch of the job with its faults; run() gives (rc, lines)."""

    def __init__(self, build, out, flags, faults=(), hosts=None,
                 drops=False, timeout=240, log=None):
        self.tag = f"{os.getpid()}-{time.monotonic_ns()}"
        self.hosts = hosts
        self.reach = Reach(hosts)
        self.faults = [dict(f) for f in faults if f["kind"] != "drops"]
        self.lines = []
        self.step = -1
        self.undo = []  # (time, action): SIGCONT, a link up, a disk freed
        # Cut hosts, healed when their node runs again (a restarted node
        # is a replacement on a healthy host): [(role, rank, pid, heal)].
        self.cuts = []
        self.next_look = 0.0
        self.notes = []
        self.ckpt = None
        self.log = log
        env = dict(ENV, CHAOS_RUN=self.tag)
        if drops:
            env["PS_DROP_MSG"] = "1"
        port = free_port()
        opts = ["-s", str(SERVERS), "-w", str(WORKERS), "--timeout",
                str(timeout), "--port", str(port), *LAUNCH_OPTS]
        for k, v in env.items():
            opts += ["--env", f"{k}={v}"]
        program = [str(build / "examples/mnist/mnist_dist"), *FLAGS, *flags,
                   "--dump_weights", str(out)]
        if hosts is None:
            self.cmd = [sys.executable, str(LAUNCH), *opts, "--", *program]
        else:
            spec = json.dumps({"holders": hosts.holders, "tag": hosts.tag,
                               "count": hosts.count})
            self.cmd = [sys.executable, __file__, "--netns_launch", spec,
                        "--", "--host", hosts.addr(1), *opts, "--",
                        *program]
        self.timeout = timeout + 30

    def run(self, ckpt):
        self.ckpt = ckpt
        start = time.monotonic()
        proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                bufsize=1, start_new_session=True,
                                cwd=ROOT)
        reader = threading.Thread(target=self._read, args=(proc,),
                                  daemon=True)
        reader.start()
        rc = None
        try:
            while rc is None:
                if time.monotonic() - start > self.timeout:
                    self.notes.append(f"no exit within {self.timeout} s: "
                                      f"killed")
                    os.killpg(proc.pid, signal.SIGKILL)
                    rc = proc.wait()
                    break
                self._act(time.monotonic())
                time.sleep(0.02)
                rc = proc.poll()
        finally:
            for _, action in self.undo:
                action()
            self.undo = []
            self._kill_all(proc)
            reader.join(timeout=10)
        for f in self.faults:
            if not f.get("done"):
                self.notes.append(f"not fired (job over): {describe(f)}")
        return rc, self.lines

    def _read(self, proc):
        for line in proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if self.log is not None:
                self.log.write(line + "\n")
            m = STEP.search(line)
            if m:
                self.step = max(self.step, int(m.group(1)))

    def _act(self, now):
        for f in self.faults:
            if f.get("done"):
                continue
            if "due" not in f and self.step >= f["step"]:
                f["due"] = now + f["delay_ms"] / 1000
            if "due" in f and now >= f["due"]:
                f["done"] = True
                self._fire(f, now)
        for item in [u for u in self.undo if u[0] <= now]:
            self.undo.remove(item)
            item[1]()
        if self.cuts and now >= self.next_look:
            self.next_look = now + 0.2
            processes = job_processes(self.tag)
            for cut in list(self.cuts):
                role, rank, pid, heal = cut
                if find_node(self.tag, role, rank, processes) not in (None,
                                                                      pid):
                    self.cuts.remove(cut)
                    heal()

    def _fire(self, f, now):
        kind, hold = f["kind"], f["hold_s"]
        if kind == "disk":
            filler = fill(self.ckpt)
            self._later(now, hold, lambda: Path(filler).unlink(
                missing_ok=True))
            return
        if kind == "partition":
            self._partition(f, now)
            return
        pid = find_node(self.tag, f["role"], f["rank"])
        if pid is None:
            self.notes.append(f"{f['node']} not running: {describe(f)} "
                              f"skipped")
            return
        if kind == "kill":
            signal_quietly(pid, signal.SIGKILL)
        elif kind == "stop":
            # SIGCONT to its group: on a netns host the nsenter above it
            # (same group) stops itself when its child stops.
            group = os.getpgid(pid)
            signal_quietly(pid, signal.SIGSTOP)
            self._later(now, hold, lambda: continue_group(group))
        elif kind == "link":
            host = host_of(f["role"], f["rank"])
            self.hosts.set_link(host, False)
            self._later(now, hold, lambda: self.hosts.set_link(host, True))
            self.cuts.append((f["role"], f["rank"], pid,
                              lambda: self.hosts.set_link(host, True)))

    def _partition(self, f, now):
        """Cuts f's side off from the other hosts, both sides running."""
        side = {host_of(role, rank): (role, rank) for role, rank in f["side"]}
        rest = [h for h in range(1, len(NODES) + 1) if h not in side]
        pairs = {tuple(sorted((a, b))) for a in side for b in rest}
        key = id(f)
        self.reach.cut(key, pairs)
        self._later(now, f["hold_s"], lambda: self.reach.heal(key, pairs))
        processes = job_processes(self.tag)
        for host, (role, rank) in side.items():
            mine = {p for p in pairs if host in p}
            self.cuts.append((role, rank,
                              find_node(self.tag, role, rank, processes),
                              lambda m=mine: self.reach.heal(key, m)))

    def _later(self, now, hold, action):
        if hold is not None:
            self.undo.append((now + hold, action))

    def _kill_all(self, proc):
        """SIGKILL to whatever of the run is left, stopped or not."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        for pid in job_processes(self.tag):  # and the group around it
            try:
                signal_quietly(os.getpgid(pid), signal.SIGKILL, os.killpg)
            except OSError:
                pass
            signal_quietly(pid, signal.SIGKILL)


def continue_group(group):
    signal_quietly(group, signal.SIGCONT, os.killpg)


def signal_quietly(pid, signum, kill=os.kill):
    try:
        kill(pid, signum)
    except OSError:
        pass


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def host_of(role, rank):
    """netns host of a node: h1 the scheduler, then servers, workers."""
    return {"scheduler": 1, "server": 2, "worker": 2 + SERVERS}[role] + (
        rank or 0)


def netns_launch(spec, argv):
    """launch.py's main, each process on its netns host (child mode)."""
    hosts_mod = load("netns_hosts", ROOT / "tests" / "net" / "netns_hosts.py")
    sys.path.insert(0, str(ROOT / "tracker"))
    from ps_tracker import local, run as tracker_run  # noqa: E402
    state = json.loads(spec)
    hosts = hosts_mod.Hosts(state["count"], tag=state["tag"])
    hosts.holders = {int(h): pid for h, pid in state["holders"].items()}

    class NetnsJob(local.LocalJob):
        def popen(self, child, port):
            host = host_of(child.role, child.rank)
            env = local.child_env(self.args, port, child.role, child.rank,
                                  self.key_path, child.restarts)
            env["DMLC_NODE_HOST"] = hosts.addr(host)
            return subprocess.Popen(
                hosts.command(host, self.args.command, cwd=str(ROOT)),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=env, start_new_session=True)

    tracker_run.JOBS["local"] = NetnsJob
    return tracker_run.main(argv)


# -- Schedules, verdicts and the table ------------------------------------

class Chaos:
    def __init__(self, args):
        self.args = args
        self.build = args.build_dir.resolve()
        self.work = Path(tempfile.mkdtemp(prefix="ps-chaos-"))
        self.logs = Path(args.logs).resolve() if args.logs else self.work
        self.logs.mkdir(parents=True, exist_ok=True)
        self.flags = ["--data_dir", str(ROOT / "data" / "mnist"),
                      "--train_limit", str(args.steps * WORKERS * BATCH)]
        self.reference = None
        self.kinds = args.faults.split(",")
        self.hosts_mod = None

    def job(self, name, flags, ckpt, faults=(), netns=False, drops=False):
        """Runs one job; (rc, lines, weights bytes or None, seconds)."""
        out = self.work / f"{name}.weights"
        Path(ckpt).mkdir(mode=0o700, exist_ok=True)
        hosts = None
        with open(self.logs / f"{name}.log", "w") as log:
            try:
                if netns:
                    hosts = self.hosts_mod.Hosts(1 + SERVERS + WORKERS)
                    hosts.up()
                job = Job(self.build, out, self.flags + flags +
                          ["--checkpoint_dir", str(ckpt)], faults, hosts,
                          drops, self.args.timeout, log)
                start = time.monotonic()
                rc, lines = job.run(str(ckpt))
                took = time.monotonic() - start
            finally:
                if hosts is not None:
                    hosts.down()
            for note in job.notes:
                log.write(f"chaos: {note}\n")
        weights = out.read_bytes() if out.exists() else None
        out.unlink(missing_ok=True)
        return rc, lines, weights, took, job.notes

    def check_environment(self):
        """Drops the fault kinds this machine cannot make, saying why."""
        if "disk" in self.kinds and os.geteuid() != 0:
            print("chaos: disk faults skipped: mounting a tmpfs needs root")
            self.kinds.remove("disk")
        if any(k in NETNS_KINDS for k in self.kinds):
            try:
                self.hosts_mod = load("netns_hosts", ROOT / "tests" / "net" /
                                      "netns_hosts.py")
                why = self.hosts_mod.missing_requirements()
            except Exception as err:  # noqa: BLE001 - any reason to skip
                why = str(err)
            if why:
                print(f"chaos: link and partition faults skipped: {why}")
                self.kinds = [k for k in self.kinds if k not in NETNS_KINDS]

    def make_reference(self):
        digests = []
        for i in range(self.args.reference_runs):
            ckpt = self.work / f"ref{i}.ckpt"
            rc, lines, weights, took, _ = self.job(f"reference-{i}", [],
                                                   ckpt)
            shutil.rmtree(ckpt, ignore_errors=True)
            acc = FAULTS.value([(0, l) for l in lines], ACCURACY)
            if rc != 0 or weights is None or len(weights) != MODEL_BYTES:
                tail = "\n  ".join(lines[-15:])
                sys.exit(f"chaos: the fault-free run failed (exit {rc}):\n  "
                         f"{tail}")
            digests.append(hashlib.sha256(weights).hexdigest()[:16])
            print(f"reference run {i}: exit 0 in {took:.1f} s, accuracy "
                  f"{acc}%, weights sha256 {digests[-1]}", flush=True)
            if self.reference is None:
                self.reference = weights
            elif weights != self.reference:
                sys.exit("chaos: two fault-free runs ended with different "
                         "weights: the job is not repeatable, nothing to "
                         "compare against")
        if any(k in NETNS_KINDS for k in self.kinds):
            ckpt = self.work / "ref-netns.ckpt"
            rc, _, weights, took, _ = self.job("reference-netns", [], ckpt,
                                               netns=True)
            shutil.rmtree(ckpt, ignore_errors=True)
            same = weights == self.reference
            print(f"reference run on netns hosts: exit {rc} in {took:.1f} s,"
                  f" {'the same weights' if same else 'OTHER WEIGHTS'}",
                  flush=True)
            if rc != 0 or not same:
                print("chaos: link and partition faults skipped: the "
                      "fault-free job on netns hosts does not end with the "
                      "reference weights")
                self.kinds = [k for k in self.kinds if k not in NETNS_KINDS]

    def schedule(self, seed):
        """Runs schedule `seed`; returns its row for the table."""
        faults = draw(seed, self.args.steps, self.kinds)
        text = "; ".join(describe(f) for f in faults)
        print(f"\nseed {seed}: {text}", flush=True)
        mount = None
        ckpt = self.work / f"seed-{seed}.ckpt"
        ckpt.mkdir(mode=0o700)
        start = time.monotonic()
        try:
            if any(f["kind"] == "disk" for f in faults):
                subprocess.run(["mount", "-t", "tmpfs", "-o",
                                f"size={DISK_MB}m,mode=0700", "chaos",
                                str(ckpt)], check=True)
                mount = ckpt
            verdict, why = self.judge(seed, faults, ckpt)
        finally:
            if mount is not None:
                subprocess.run(["umount", "-l", str(mount)])
            shutil.rmtree(ckpt, ignore_errors=True)
        took = time.monotonic() - start
        print(f"seed {seed}: {verdict}: {why} ({took:.0f} s)", flush=True)
        return seed, text, verdict, why, took

    def judge(self, seed, faults, ckpt):
        netns = any(f["kind"] in NETNS_KINDS for f in faults)
        drops = any(f["kind"] == "drops" for f in faults)
        rc, lines, weights, _, notes = self.job(
            f"seed-{seed}", [], ckpt, faults, netns, drops)
        extra = "".join(f"; {n}" for n in notes)
        if rc == 0:
            if weights == self.reference:
                return "PASS", "exit 0, bit-identical" + extra
            return self.fail(seed, rc, lines, "exit 0 but the weights differ "
                             "from the fault-free run" + extra)
        cause = [l for l in lines if l.startswith("launch: ")]
        if rc not in (1,) or not cause:
            return self.fail(seed, rc, lines, "no one-line cause (exit "
                             f"{rc})" + extra)
        blamed = NAMED.search(cause[-1])
        faulted = {n for f in faults for n in faulted_nodes(f)}
        if blamed is None or blamed.group(1) not in faulted:
            return self.fail(seed, rc, lines, "stopped, but the last line "
                             f"names {blamed and blamed.group(1)}, not a "
                             f"faulted node ({', '.join(sorted(faulted))}): "
                             f"{cause[-1]}" + extra)
        for filler in ckpt.glob("chaos-filler"):
            filler.unlink()  # the operator frees the disk first
        rc2, lines2, weights2, _, _ = self.job(
            f"seed-{seed}-restore", ["--restore"], ckpt)
        step = next((m.group(1) for l in lines2
                     for m in [RESTORED.search(l)] if m), None)
        stopped = f"stopped: {cause[-1][len('launch: '):]}"
        allowed = restore_allowed(faults)
        if rc2 == 0 and weights2 == self.reference and allowed is None:
            return self.fail(seed, rc, lines, f"{stopped}, though every "
                             "range kept a live copy and no restarts were "
                             f"spent (--restore from step {step}: "
                             f"bit-identical){extra}")
        if rc2 == 0 and weights2 == self.reference:
            return "PASS-restore", (f"{stopped}; {allowed}; --restore from "
                                    f"step {step}: bit-identical{extra}")
        what = ("weights differ" if rc2 == 0 else f"exit {rc2}")
        return self.fail(seed, rc2, lines2, f"{stopped}; --restore "
                         f"(step {step}): {what}{extra}")

    def fail(self, seed, rc, lines, why):
        print(f"seed {seed}: FAIL (exit {rc}): {why}; last lines:")
        for line in lines[-12:]:
            print(f"    {line}")
        print(f"  replay: python3 bench/chaos/run.py {self.args.build_dir} "
              f"--seed {seed}; logs: {self.logs}/seed-{seed}*.log",
              flush=True)
        return "FAIL", why


def table(rows):
    head = ("seed", "faults", "verdict", "seconds")
    body = [(str(s), t, v, f"{d:.0f}") for s, t, v, _, d in rows]
    widths = [max(len(r[i]) for r in body + [head]) for i in range(4)]
    for r in [head] + body:
        print("  ".join(v.ljust(n) for v, n in zip(r, widths)))


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--netns_launch":
        return netns_launch(sys.argv[2], sys.argv[4:])
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build_dir", type=Path)
    parser.add_argument("--seed", type=int, help="run this schedule only")
    parser.add_argument("--first_seed", type=int,
                        help="seeds FIRST, FIRST+1, ... (default: drawn "
                             "from the clock)")
    parser.add_argument("--schedules", type=int, default=0,
                        help="run this many schedules (0: --minutes)")
    parser.add_argument("--minutes", type=float, default=35,
                        help="start schedules until this much time passed")
    parser.add_argument("--steps", type=int, default=50,
                        help="training steps of the job")
    parser.add_argument("--faults", default=",".join(KINDS),
                        help="the kinds to draw from (comma-separated)")
    parser.add_argument("--timeout", type=int, default=150,
                        help="launch.py --timeout of each job")
    parser.add_argument("--reference_runs", type=int, default=2)
    parser.add_argument("--logs", help="keep every job's output here")
    args = parser.parse_args()
    if not (args.build_dir / "examples/mnist/mnist_dist").is_file():
        sys.exit(f"chaos: {args.build_dir}/examples/mnist/mnist_dist is "
                 f"missing; build it first")
    if set(args.faults.split(",")) - set(KINDS):
        parser.error(f"--faults: kinds are {','.join(KINDS)}")
    # Both unwind through the cleanups, even in the background.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    chaos = Chaos(args)
    start = time.monotonic()
    rows = []
    try:
        chaos.check_environment()
        print(f"chaos: S={SERVERS} W={WORKERS}, {args.steps} steps, fault "
              f"kinds {','.join(chaos.kinds)}; logs in {chaos.logs}",
              flush=True)
        chaos.make_reference()
        seeds = [args.seed]
        if args.seed is None:
            first = (args.first_seed if args.first_seed is not None
                     else int(time.time()) % 1000000)
            print(f"chaos: seeds {first}, {first + 1}, ...", flush=True)
            seeds = range(first, first + 10**6)
        for seed in seeds:
            rows.append(chaos.schedule(seed))
            # The next one is started if it ends in time, on average.
            after = (time.monotonic() - start) * (len(rows) + 2) / (
                len(rows) + 1)
            if len(rows) == args.schedules or (
                    not args.schedules and after > args.minutes * 60):
                break
    except KeyboardInterrupt:
        print("chaos: interrupted")
    finally:
        # Without --logs the logs are in the work folder: kept on a FAIL.
        if args.logs or not any(r[2] == "FAIL" for r in rows):
            shutil.rmtree(chaos.work, ignore_errors=True)
    print(f"\n{len(rows)} schedules in "
          f"{(time.monotonic() - start) / 60:.1f} min")
    table(rows)
    by_kind(rows, lambda seed: draw(seed, args.steps, chaos.kinds))
    counts = {v: sum(r[2] == v for r in rows)
              for v in ("PASS", "PASS-restore", "FAIL")}
    print(", ".join(f"{n} {v}" for v, n in counts.items()))
    for seed, text, verdict, why, _ in rows:
        if verdict == "FAIL":
            print(f"FAIL seed {seed}: {text}: {why}")
    return 1 if any(r[2] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
