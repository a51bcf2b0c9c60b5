"""Resend across a cut link: mnist_dist under BSP on separate hosts
(netns_hosts.py), the link between worker 0's host and the server's cut
for a few seconds mid-job and then restored, ends with the weights of the
same job without the cut, bit for bit.

The cut is a partition of two hosts (a blackhole route each way), so that
the scheduler still hears every node and nobody is declared dead, and it
lasts longer than the heartbeat timeout, so that ZeroMQ's own heartbeats
close the stalled connections between worker 0 and the server: what was
in them (a request, an answer) is lost, and the job can only end because
the worker sends again what was not answered (PS_RESEND_TIMEOUT_MS) and
the server applies each request once (docs/failures.md, "Lost messages").
With PS_RESEND_TIMEOUT_MS=0 the same job waits forever for the lost
answer (it ends by the launcher's timeout).

Skipped, saying why, without root or iproute2. Paths: PS_BUILD_DIR
(default build/), PS_MNIST_DIR (default data/mnist).
"""

import os
import re
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_hosts  # noqa: E402
# main: runs this file's tests (unittest's __main__), exit 77 if all skip.
from test_cross_host import (MNIST_DIR, MNIST_DIST, main,  # noqa: E402
                             why_skip)

JOB_TIMEOUT = 180  # Seconds; each job below takes ~15 on an idle machine.
CUT_SECONDS = 4.0  # > the heartbeat timeout below, so connections close.
SCHEDULER, SERVER, WORKER0, WORKER1 = 1, 2, 3, 4  # hosts
PLAN = [("scheduler", None, SCHEDULER), ("server", 0, SERVER),
        ("worker", 0, WORKER0), ("worker", 1, WORKER1)]
# 1920 images, 2 workers x 16 a step: 60 BSP steps.
# mnist_dist's defaults before the one-cycle recipe (the counts below).
ARGS = ["--epochs", "1", "--lr", "1e-3", "--lr_schedule", "step",
        "--ema_decay", "0", "--lr_ref_batch", "0", "--max_shift", "0",
        "--label_smoothing", "0", "--train_limit", "1920", "--test_limit", "100", "--dropout=false",
        "--optimizer", "sgd", "--lr", "0.01", "--momentum", "0.9",
        "--consistency", "bsp", "--threads", "1", "--batch_size", "16",
        "--log_every_s", "0.2", "--data_dir", MNIST_DIR]
ENV = {"PS_RESEND_TIMEOUT_MS": "300", "PS_HEARTBEAT_INTERVAL_MS": "300",
       "PS_HEARTBEAT_TIMEOUT_MS": "1500"}
RESENT = re.compile(r"\[worker 0\] .*worker 0 .*: (\d+) requests resent, "
                    r"(\d+) duplicates let go")
SERVER_DONE = re.compile(r"\[server 0\] server 0 done: .*?: (\d+) updates "
                         r"applied")


def partition(hosts, a, b, cut):
    """Cuts (cut=True) or restores the link between hosts a and b only."""
    verb = "add" if cut else "del"
    for here, there in ((a, b), (b, a)):
        r = hosts.run(here, ["ip", "route", verb, "blackhole",
                             f"{netns_hosts.Hosts.addr(there)}/32"])
        if r.returncode != 0:
            raise netns_hosts.HostsError(f"h{here}: {r.stdout.strip()}")


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


@unittest.skipIf(why_skip(), why_skip())
class LinkCutResend(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        netns_hosts.remove_stale()
        netns_hosts.exit_on_sigterm()

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ps-net-cut-")
        self.addCleanup(self.tmp.cleanup)

    def run_job(self, weights, cut, env=ENV):
        """The job on 4 hosts; with cut, worker 0 and the server are cut
        apart for CUT_SECONDS once worker 0 logged step 5. Returns (rc,
        why, output)."""
        with netns_hosts.Hosts(4) as hosts:
            job = hosts.job(PLAN, [MNIST_DIST, "--dump_weights", weights] +
                            ARGS, env=env)
            try:
                job.start(job.root_port)
                if cut:
                    step = job.wait_for_line(
                        r"\[worker 0\] worker 0 epoch 0 step ([5-9]|\d\d)",
                        JOB_TIMEOUT)
                    self.assertIsNotNone(step, "".join(job.lines))
                    partition(hosts, WORKER0, SERVER, cut=True)
                    try:
                        time.sleep(CUT_SECONDS)
                    finally:
                        partition(hosts, WORKER0, SERVER, cut=False)
                rc, why = job.finish(time.monotonic() + JOB_TIMEOUT)
            finally:
                job.close()
        return rc, why, "".join(job.lines)

    def test_cut_and_restored_link_ends_with_fault_free_weights(self):
        clean = os.path.join(self.tmp.name, "clean.bin")
        rc, why, out = self.run_job(clean, cut=False)
        self.assertEqual(rc, 0, f"{why}\n{out}")

        after_cut = os.path.join(self.tmp.name, "cut.bin")
        rc, why, out = self.run_job(after_cut, cut=True)
        self.assertEqual(rc, 0, f"{why}\n{out}")
        self.assertNotIn("declared dead", out)
        # Every step applied once, and worker 0 sent again what the cut
        # left unanswered.
        self.assertEqual([int(n) for n in SERVER_DONE.findall(out)], [60],
                         out)
        resent = RESENT.search(out)
        self.assertIsNotNone(resent, out)
        self.assertGreaterEqual(int(resent.group(1)), 1, out)

        a, b = read_bytes(clean), read_bytes(after_cut)
        self.assertEqual(len(a), 4 * 1199882)
        self.assertTrue(a == b, "the weights differ from the job's without "
                        "the cut")
        print(f"cut h{WORKER0}-h{SERVER} for {CUT_SECONDS} s: "
              f"{resent.group(1)} requests resent, {resent.group(2)} "
              f"duplicates let go; weights bit-equal")


if __name__ == "__main__":
    main()
