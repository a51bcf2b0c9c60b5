"""Real cluster tools for the launcher tests, started by the tests.

Each runs in a temp dir of its own, on unused loopback ports, and is
stopped (SIGTERM, SIGKILL 5 s later) even when a test fails:
  Sshd   an sshd with a throwaway host key and client key, in a network
         namespace of its own (unshare --net: a loopback only) on 127.0.0.1
         and 127.0.0.2 (two "hosts", by address: a fresh system may not
         resolve localhost); the launcher runs in that namespace too
  Slurm  a one-node Slurm: munged, slurmctld and slurmd, no cgroups
Open MPI's mpirun needs no daemon. Without a tool (or without root) the
tests that need it are skipped, unless PS_REQUIRE_CLUSTER_TOOLS=1 (as
scripts/test.sh sets it): then they fail. Every wait is bounded.
"""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "tracker" / "launch.py"
KV_JOB = Path(os.environ.get("PS_KV_JOB", ROOT / "build/tests/core/kv_job"))
# mnist_dist's defaults before the one-cycle recipe: the tests' step counts
# and accuracies count on them.
MNIST_PINNED = ["--epochs", "1", "--batch_size", "32", "--lr", "1e-3",
                "--lr_schedule", "step", "--ema_decay", "0", "--max_shift", "0",
                "--lr_ref_batch", "0", "--label_smoothing", "0"]
MNIST_DIST = Path(os.environ.get(
    "PS_MNIST_DIST", ROOT / "build/examples/mnist/mnist_dist"))
MNIST_DATA = Path(os.environ.get("PS_MNIST_DATA", ROOT / "data/mnist"))
REQUIRED = os.environ.get("PS_REQUIRE_CLUSTER_TOOLS") == "1"
RUN_TIMEOUT = 120  # Seconds for one launch; each takes a few.
START_TIMEOUT = 60  # Seconds for a daemon to answer.


def need(*tools, root=False, files=(KV_JOB,)):
    """Skips the test (fails it with PS_REQUIRE_CLUSTER_TOOLS=1) when a
    tool is missing from PATH or /usr/sbin, root is needed, or one of the
    files (kv_job, say) is missing."""
    missing = [t for t in tools if find(t) is None]
    absent = [str(f) for f in files if not f.exists()]
    why = None
    if missing:
        why = f"missing {', '.join(missing)} (scripts/install_deps.sh)"
    elif root and os.geteuid() != 0:
        why = "needs root"
    elif absent:
        why = (f"no {', '.join(absent)} (build it; or set PS_KV_JOB, "
               "PS_MNIST_DIST, PS_MNIST_DATA)")
    if why is None:
        return
    if REQUIRED:
        raise AssertionError(why)
    raise unittest.SkipTest(why)


def find(tool):
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(test, what, logs=(), timeout=START_TIMEOUT):
    """Polls test() until true; else fails naming what, with the logs."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if test():
            return
        time.sleep(0.1)
    tails = "".join(f"\n--- {log}:\n{tail(log)}" for log in logs)
    raise AssertionError(f"{what} not within {timeout} s{tails}")


def tail(path, lines=30):
    try:
        return "\n".join(Path(path).read_text(errors="replace")
                         .splitlines()[-lines:])
    except OSError as err:
        return str(err)


class Daemons:
    """Processes started in the foreground; stop() ends them all."""

    def __init__(self, workdir):
        self.dir = Path(workdir)
        self.procs = []

    def start(self, name, argv, env=None):
        log = open(self.dir / f"{name}.out", "wb")
        with log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
        self.procs.append(proc)
        return proc

    @contextlib.contextmanager
    def stopped_on_error(self):
        """Stops the daemons started so far if the block fails."""
        try:
            yield
        except BaseException:
            self.stop()
            raise

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        end = time.monotonic() + 5
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


class Sshd:
    """An sshd on 127.0.0.1:PORT and 127.0.0.2:PORT of a network namespace
    that only it and the commands prefixed with `enter` use; args() are
    the launcher's ssh options."""

    HOSTS = ("127.0.0.1", "127.0.0.2")
    PORT = 2222  # Free: the namespace is new.

    def __init__(self, workdir):
        d = Path(workdir)
        for key in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "",
                            "-f", str(d / key)], check=True, timeout=60)
        (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
        self.port = self.PORT
        host_key = (d / "host_key.pub").read_text().strip()
        (d / "known_hosts").write_text("".join(
            f"[{host}]:{self.port} {host_key}\n" for host in self.HOSTS))
        (d / "sshd_config").write_text(f"""\
Port {self.port}
ListenAddress 127.0.0.1
ListenAddress 127.0.0.2
HostKey {d}/host_key
AuthorizedKeysFile {d}/authorized_keys
PidFile {d}/sshd.pid
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
""")
        # sshd's privilege separation directory (a tmpfs on booted systems).
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.dir = d
        self.daemons = Daemons(d)
        with self.daemons.stopped_on_error():
            # The namespace lives as long as this process; its loopback up.
            holder = self.daemons.start("netns", [
                "unshare", "--net", "--", "sh", "-c",
                "ip link set lo up && echo up && exec sleep 900"])
            wait_for(lambda: "up" in tail(d / "netns.out"),
                     "a network namespace", [d / "netns.out"])
            self.enter = ["nsenter", f"--net=/proc/{holder.pid}/ns/net",
                          "--"]
            self.daemons.start("sshd", self.enter + [
                find("sshd"), "-D", "-e", "-f", str(d / "sshd_config")])
            for host in self.HOSTS:
                listening = f"Server listening on {host} port {self.port}."
                wait_for(lambda: listening in tail(d / "sshd.out"),
                         f"sshd on {host}:{self.port}", [d / "sshd.out"])

    def args(self):
        return [f"--launcher-arg={arg}" for arg in (
            f"-p{self.port}", f"-i{self.dir}/client_key",
            "-oIdentitiesOnly=yes", "-oStrictHostKeyChecking=yes",
            f"-oUserKnownHostsFile={self.dir}/known_hosts")]

    def stop(self):
        self.daemons.stop()


class Slurm:
    """munged, slurmctld and slurmd for one node, NODE (CPUs=8), in workdir.

    env() is the environment for salloc, sbatch and srun (SLURM_CONF).
    """

    NODE = "psnode"

    def __init__(self, workdir):
        d = Path(workdir)
        d.chmod(0o755)  # munged wants its socket's directories searchable.
        (d / "state").mkdir()
        (d / "spool").mkdir()
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.dir = d
        self.daemons = Daemons(d)
        with self.daemons.stopped_on_error():
            socket_path = d / "munge.sock"
            self.daemons.start("munged", [
                find("munged"), "-F", f"--key-file={key}",
                f"--socket={socket_path}", f"--pid-file={d}/munged.pid",
                f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"])
            wait_for(socket_path.exists, "munged's socket",
                     [d / "munged.out", d / "munged.log"])
            ctld_port, slurmd_port = free_port(), free_port()
            host = socket.gethostname().split(".")[0]
            (d / "slurm.conf").write_text(f"""\
ClusterName=pstest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket_path}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
DebugFlags=NO_CONF_HASH
NodeName={self.NODE} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=ps Nodes={self.NODE} Default=YES MaxTime=10 State=UP
""")
            # No cgroup is used (proctrack/linuxproc, task/none), but slurmd
            # loads a cgroup plugin anyway; named, it need not find a cgroup
            # filesystem (a chroot may have none).
            (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
            env = self.env()
            self.daemons.start("slurmctld", [find("slurmctld"), "-D", "-i"],
                               env)
            self.daemons.start("slurmd",
                               [find("slurmd"), "-D", "-N", self.NODE], env)
            logs = [d / n for n in ("slurmctld.out", "slurmctld.log",
                                    "slurmd.out", "slurmd.log")]
            wait_for(self.node_idle, f"Slurm node {self.NODE} idle", logs)

    def env(self):
        return dict(os.environ, SLURM_CONF=str(self.dir / "slurm.conf"))

    def node_idle(self):
        result = subprocess.run(["sinfo", "-h", "-n", self.NODE, "-o", "%T"],
                                capture_output=True, text=True,
                                env=self.env(), timeout=30)
        return result.stdout.strip() == "idle"

    def stop(self):
        self.daemons.stop()


def marked_processes(mark):
    """Pids of live processes whose environment holds PS_TEST_MARK=mark."""
    needle = f"PS_TEST_MARK={mark}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X") and needle in environ.split(b"\0"):
            pids.append(int(entry))
    return pids


class LauncherCase(unittest.TestCase):
    """launch() runs launch.py with a marker in every process's
    environment; assert_none_left() checks that none of them survived."""

    def setUp(self):
        self.mark = uuid.uuid4().hex
        self.addCleanup(self.kill_left)

    def kill_left(self):  # Never leave a stray behind, even on failure.
        for pid in marked_processes(self.mark):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def launch_argv(self, flags, program):
        return [sys.executable, str(LAUNCH), "--timeout", "90", *flags,
                "--env", f"PS_TEST_MARK={self.mark}", "--", *program]

    def launch(self, flags, program, env=None, cwd=None):
        return subprocess.run(self.launch_argv(flags, program),
                              capture_output=True, text=True, env=env,
                              cwd=cwd, timeout=RUN_TIMEOUT)

    def assert_none_left(self):
        """No process of the job remains (orphans die asynchronously)."""
        end = time.monotonic() + 15
        while marked_processes(self.mark) and time.monotonic() < end:
            time.sleep(0.1)
        self.assertEqual(marked_processes(self.mark), [])

    def last_line(self, result):
        return result.stderr.rstrip("\n").split("\n")[-1]

    def assert_kv_sum(self, result, servers, workers, tags=None):
        """kv_job sum's outcome: every worker pulled the exact total, the
        servers hold every key and together the total; tags: the exact
        "[role rank @host]" tag expected of each of them."""
        self.assertEqual(result.returncode, 0, result.stderr)
        total = workers * (workers + 1) // 2 * 400 * 401 // 2
        pulled, held = {}, {}
        for line in result.stdout.splitlines():
            m = re.fullmatch(r"\[(worker (\d+) @(\S+))\] worker (\d+) "
                             r"pulled (\d+) (ok|WRONG)", line)
            if m:
                self.assertEqual(m.group(2), m.group(4), line)
                pulled[m.group(1)] = (int(m.group(5)), m.group(6))
            m = re.fullmatch(r"\[(server (\d+) @(\S+))\] server (\d+) holds "
                             r"(\d+) keys sum (\d+)", line)
            if m:
                self.assertEqual(m.group(2), m.group(4), line)
                held[m.group(1)] = (int(m.group(5)), int(m.group(6)))
        self.assertEqual(len(pulled), workers, result.stdout)
        self.assertEqual(set(pulled.values()), {(total, "ok")})
        self.assertEqual(len(held), servers, result.stdout)
        self.assertEqual(sum(k for k, _ in held.values()), 100)
        self.assertEqual(sum(s for _, s in held.values()), total)
        if tags is not None:
            self.assertEqual(sorted([*pulled, *held]), sorted(tags))
        total_procs = 1 + servers + workers
        self.assertRegex(self.last_line(result),
                         rf"^launch: all {total_procs} processes exited 0 "
                         r"in [\d.]+ s$")


def temp_dir(case_class):
    """A temp dir removed after the class's tests (addClassCleanup)."""
    tmp = tempfile.TemporaryDirectory(prefix="ps-launch-test-")
    case_class.addClassCleanup(tmp.cleanup)
    return tmp.name
