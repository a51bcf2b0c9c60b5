"""launch.py --metrics DIR: every node serves /metrics, DIR/targets.json
names them, and Prometheus scrapes them.

PrometheusTest starts Debian's real prometheus (/usr/bin/prometheus) with
a file_sd configuration on DIR/targets.json, against a live -s 2 -w 2 job
(tests/core/kv_job until-go: the workers push until the test drops a file),
and asks Prometheus's HTTP API that all five nodes are up and that the byte
counters rise; once as is, once with --metrics-token-file, Prometheus
sending the token from the same file (credentials_file) and a scrape
without it getting 401. Without prometheus (or kv_job) the test fails,
unless PS_ALLOW_MISSING_PROMETHEUS=1 lets it skip. TargetsTest checks the
file_sd file with tiny child programs: one target per node at the address
it says it listens on, labels role and rank, a restarted node's new port
in place of its old one, and the token file given to every node. Every
wait is bounded in time; no test asserts a duration.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "tracker" / "launch.py"
sys.path.insert(0, str(ROOT / "tracker"))
from ps_tracker.common import die_with_parent  # noqa: E402
KV_JOB = Path(os.environ.get("PS_KV_JOB", ROOT / "build/tests/core/kv_job"))
PROMETHEUS = os.environ.get("PS_PROMETHEUS",
                            shutil.which("prometheus") or "/usr/bin/prometheus")
MAY_SKIP = os.environ.get("PS_ALLOW_MISSING_PROMETHEUS") == "1"
WAIT = 90  # Seconds, at most, for any one thing to happen.
NODES = {("scheduler", "0"), ("server", "0"), ("server", "1"),
         ("worker", "0"), ("worker", "1")}


def need(path, what):
    """Fails (skips with PS_ALLOW_MISSING_PROMETHEUS=1) without `path`."""
    if os.access(path, os.X_OK):
        return
    why = f"missing {what} ({path}; scripts/install_deps.sh and the build)"
    if MAY_SKIP:
        raise unittest.SkipTest(why)
    raise AssertionError(why + "; PS_ALLOW_MISSING_PROMETHEUS=1 skips")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(what, probe, timeout=WAIT, interval=0.25):
    """probe()'s first truthy value within `timeout` s; else fails naming
    `what` and probe's last value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what} within {timeout} s; last: {last!r}")


def read_targets(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def stop(proc):
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class PrometheusTest(unittest.TestCase):

    def setUp(self):
        need(PROMETHEUS, "Debian's prometheus")
        need(KV_JOB, "kv_job")
        self.tmp = Path(tempfile.mkdtemp(prefix="ps-metrics-"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.job = self.prom = None
        self.addCleanup(lambda: stop(self.job))
        self.addCleanup(lambda: stop(self.prom))

    def api(self, path, **query):
        url = f"http://127.0.0.1:{self.prom_port}{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                return json.load(reply)
        except (OSError, ValueError):
            return None

    def query(self, expr):
        """The result vector of an instant query ([] on any failure)."""
        answer = self.api("/api/v1/query", query=expr)
        if not answer or answer.get("status") != "success":
            return []
        return answer["data"]["result"]

    def up_targets(self):
        answer = self.api("/api/v1/targets", state="active")
        if not answer or answer.get("status") != "success":
            return None
        up = {(t["labels"].get("role"), t["labels"].get("rank"))
              for t in answer["data"]["activeTargets"]
              if t["health"] == "up"}
        return up if up == NODES else None

    def bytes_sent(self):
        result = self.query("sum(ps_bytes_sent_total)")
        return float(result[0]["value"][1]) if result else 0.0

    def test_prometheus_scrapes_every_node_of_a_live_job(self):
        self.scrape_a_live_job()

    def test_prometheus_scrapes_with_the_token_and_others_get_401(self):
        token = self.tmp / "token"
        token.write_text("job-token-" + os.urandom(12).hex() + "\n")
        token.chmod(0o600)
        self.scrape_a_live_job(token)

    def check_token(self, target, token_file):
        """A scrape of `target` without the token, or with another, gets
        401 and no metrics; with it, the metrics."""
        token = token_file.read_text().strip()
        for sent in (None, token[:-1] + "x"):
            request = urllib.request.Request(f"http://{target}/metrics")
            if sent is not None:
                request.add_header("Authorization", f"Bearer {sent}")
            with self.assertRaises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            self.assertEqual(refused.exception.code, 401)
            self.assertNotIn(b"ps_", refused.exception.read())
        request = urllib.request.Request(
            f"http://{target}/metrics",
            headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            self.assertIn(b"ps_bytes_sent_total", reply.read())

    def scrape_a_live_job(self, token_file=None):
        metrics_dir = self.tmp / "metrics"
        go = self.tmp / "go"
        log = open(self.tmp / "job.log", "wb")
        self.addCleanup(log.close)
        token_args = ([] if token_file is None
                      else ["--metrics-token-file", str(token_file)])
        self.job = subprocess.Popen(
            [sys.executable, str(LAUNCH), "-s", "2", "-w", "2",
             "--metrics", str(metrics_dir), *token_args, "--timeout", "280",
             "--env", f"KV_JOB_GO={go}", "--", str(KV_JOB), "until-go"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent())  # and its job with it
        targets_path = metrics_dir / "targets.json"

        def five_targets():
            targets = read_targets(targets_path)
            if not targets or len(targets) != 5:
                return None
            return targets
        targets = wait_for("targets.json naming five nodes", five_targets)
        self.assertEqual(
            {(t["labels"]["role"], t["labels"]["rank"]) for t in targets},
            NODES)
        for t in targets:
            self.assertEqual(len(t["targets"]), 1)
            self.assertTrue(t["targets"][0].startswith("127.0.0.1:"), t)
        if token_file is not None:
            for t in targets:
                self.check_token(t["targets"][0], token_file)

        self.prom_port = free_port()
        config = self.tmp / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "scrape_configs:\n"
            "  - job_name: ps\n"
            "    honor_labels: true\n"
            + ("" if token_file is None else
               "    authorization:\n"
               f"      credentials_file: '{token_file}'\n")
            + "    file_sd_configs:\n"
            f"      - files: ['{targets_path}']\n"
            "        refresh_interval: 1s\n")
        prom_log = open(self.tmp / "prometheus.log", "wb")
        self.addCleanup(prom_log.close)
        self.prom = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}",
             f"--storage.tsdb.path={self.tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.prom_port}"],
            stdout=prom_log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent())
        try:
            wait_for("all five nodes up in /api/v1/targets", self.up_targets)
            first = wait_for("bytes sent in /api/v1/query", self.bytes_sent)
            wait_for(f"bytes sent past {first}",
                     lambda: self.bytes_sent() > first)
            # Every node's own series carry its role and rank.
            for role, rank in sorted(NODES):
                result = self.query(
                    f'ps_bytes_received_total{{role="{role}",rank="{rank}"}}')
                self.assertTrue(result, (role, rank))
            pushes = wait_for(
                "pushes in ps_request_seconds",
                lambda: self.query(
                    'sum(ps_request_seconds_count{op="push"})'))
            self.assertGreater(float(pushes[0]["value"][1]), 0)
            # The scheduler's view of the four members (a loaded host may
            # make one suspected for a moment: waited for, not asserted).
            wait_for("the scheduler seeing four live members", lambda: len(
                self.query('ps_peer_state{role="scheduler",state="live"} '
                           '== 1')) == 4)
        except AssertionError:
            self.dump()
            raise
        go.touch()
        try:
            rc = self.job.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            self.dump()
            raise
        if rc != 0:
            self.dump()
        self.assertEqual(rc, 0)

    def dump(self):
        for name in ("job.log", "prometheus.log"):
            path = self.tmp / name
            if path.exists():
                text = path.read_text(errors="replace")
                print(f"--- {name} (last 4000 characters)\n{text[-4000:]}",
                      file=sys.stderr)


# A tiny node: says a metrics port (20000 + 10 * rank + its restart count)
# as a node does, then exits 0, or 1 when it is worker 0's first run. The
# address it says: none (the scheduler), every interface (the server),
# 127.0.0.1 (worker 0), 127.0.0.5 (worker 1).
CHILD = r'''
import json, os, sys, time
role, rank = os.environ["DMLC_ROLE"], int(os.environ.get("PS_RANK", "0"))
restarts = int(os.environ.get("PS_RESTART_COUNT", "0"))
assert os.environ["PS_METRICS_PORT"] == "0"
assert os.environ.get("PS_METRICS_TOKEN_FILE") == os.environ.get(
    "WANT_TOKEN_FILE"), os.environ.get("PS_METRICS_TOKEN_FILE")
port = 20000 + 10 * rank + restarts + (100 if role == "server" else 0)
event = {"event": "metrics", "role": role, "port": port}
if role != "scheduler":
    event["host"] = ("0.0.0.0" if role == "server" else
                     "127.0.0.1" if rank == 0 else "127.0.0.5")
print("ps-event: " + json.dumps(event), file=sys.stderr, flush=True)
# The scheduler ends the job after worker 0's second run is over (the
# launcher restarts no one once the scheduler has ended the job).
time.sleep(4 if role == "scheduler" else 1)
sys.exit(1 if role == "worker" and rank == 0 and restarts == 0 else 0)
'''


class TargetsTest(unittest.TestCase):

    def test_a_restarted_node_replaces_its_target(self):
        with tempfile.TemporaryDirectory(prefix="ps-targets-") as tmp:
            child = Path(tmp) / "child.py"
            child.write_text(CHILD)
            out = Path(tmp) / "metrics"
            run = subprocess.run(
                [sys.executable, str(LAUNCH), "-s", "1", "-w", "2",
                 "--insecure", "--metrics", str(out), "--max-restarts", "1",
                 "--", sys.executable, str(child)],
                capture_output=True, timeout=60)
            self.assertEqual(run.returncode, 0, run.stderr.decode())
            targets = read_targets(out / "targets.json")
            by_node = {(t["labels"]["role"], t["labels"]["rank"]):
                       t["targets"] for t in targets}
            self.assertEqual(by_node, {
                ("scheduler", "0"): ["127.0.0.1:20000"],
                ("server", "0"): ["127.0.0.1:20100"],
                ("worker", "0"): ["127.0.0.1:20001"],  # its second run's
                ("worker", "1"): ["127.0.0.5:20010"],
            })
            self.assertEqual(sorted(os.listdir(out)), ["targets.json"])

    def test_the_token_file_goes_to_every_node_by_its_absolute_path(self):
        with tempfile.TemporaryDirectory(prefix="ps-targets-") as tmp:
            child = Path(tmp) / "child.py"
            child.write_text(CHILD)
            token = Path(tmp) / "token"
            token.write_text("a-token-of-twenty-characters\n")
            token.chmod(0o600)
            env = dict(os.environ, WANT_TOKEN_FILE=str(token))
            run = subprocess.run(
                [sys.executable, str(LAUNCH), "-s", "1", "-w", "2",
                 "--insecure", "--metrics", "metrics",
                 "--metrics-token-file", "token", "--max-restarts", "1",
                 "--", sys.executable, str(child)],
                capture_output=True, timeout=60, cwd=tmp, env=env)
            self.assertEqual(run.returncode, 0, run.stderr.decode())
            self.assertNotIn(b"warning", run.stderr)

    def test_a_token_file_needs_metrics_and_a_small_regular_file(self):
        with tempfile.TemporaryDirectory(prefix="ps-targets-") as tmp:
            big = Path(tmp) / "big"
            big.write_text("x" * 5000)
            cases = (
                (["--metrics-token-file", str(big)], b"needs --metrics DIR"),
                (["--metrics", tmp, "--metrics-token-file",
                  f"{tmp}/missing"], f"'{tmp}/missing'".encode()),
                (["--metrics", tmp, "--metrics-token-file", tmp],
                 b"is not a regular file"),
                (["--metrics", tmp, "--metrics-token-file", str(big)],
                 b"5000 bytes"),
            )
            for flags, said in cases:
                run = subprocess.run(
                    [sys.executable, str(LAUNCH), "-s", "1", "-w", "1",
                     *flags, "--", "true"],
                    capture_output=True, timeout=60)
                self.assertEqual(run.returncode, 2, (flags, run.stderr))
                self.assertIn(said, run.stderr, flags)
                self.assertIn(b"--metrics-token-file", run.stderr, flags)

    def test_metrics_needs_a_local_or_ssh_launcher(self):
        run = subprocess.run(
            [sys.executable, str(LAUNCH), "-s", "1", "-w", "1",
             "--launcher", "mpi", "--metrics", "/tmp/x", "--", "true"],
            capture_output=True, timeout=60)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn(b"--metrics", run.stderr)


if __name__ == "__main__":
    unittest.main()
