#!/usr/bin/env python3
"""Multi-process tests: kv_job through tracker/launch.py, asserting every
exit code and every number printed. Usage: multiproc_test.py LAUNCH KV_JOB CASE
with CASE one of grid, varlen, threads, kill-worker, kill-server."""
import re
import subprocess
import sys
import time

LAUNCH, JOB, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
KEYS = 100
ENV = ["--env", "PS_HEARTBEAT_INTERVAL_MS=200",
       "--env", "PS_HEARTBEAT_TIMEOUT_MS=2000",
       "--env", "PS_CONNECT_TIMEOUT_MS=5000",
       "--env", "PS_RENDEZVOUS_TIMEOUT_MS=20000",
       "--env", "PS_BARRIER_TIMEOUT_MS=20000"]


def launch(s, w, mode, timeout=40):
    cmd = [sys.executable, LAUNCH, "-s", str(s), "-w", str(w), "--timeout",
           str(timeout)] + ENV + ["--", JOB, mode]
    start = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 20)
    return p.returncode, p.stdout + p.stderr, time.time() - start


def check(cond, what, out):
    if not cond:
        print(out)
        print("FAILED:", what)
        sys.exit(1)


def expect_sums(s, w, mode):
    rc, out, secs = launch(s, w, mode)
    check(rc == 0, f"S={s} W={w} {mode}: exit {rc}", out)
    lens = [i % 5 + 1 if mode == "varlen" else 4 for i in range(KEYS)]
    n = sum(lens)
    # value i holds (1+..+W) * (i+1)
    expected = w * (w + 1) // 2 * n * (n + 1) // 2
    workers = re.findall(r"\[worker (\d+)\] worker (\d+) pulled (\d+) (\w+)", out)
    check(len(workers) == w, f"{w} worker lines", out)
    for prefix, rank, total, verdict in workers:
        check(prefix == rank and int(total) == expected and verdict == "ok",
              f"worker {rank} pulled {total}, expected {expected}", out)
    servers = re.findall(r"\[server (\d+)\] server (\d+) holds (\d+) keys sum (\d+)",
                         out)
    check(len(servers) == s, f"{s} server lines", out)
    check(sum(int(x[2]) for x in servers) == KEYS, "keys over servers", out)
    check(sum(int(x[3]) for x in servers) == expected, "server sums", out)
    for prefix, rank, _, _ in servers:
        check(prefix == rank, "server prefix matches its rank", out)
    print(f"S={s} W={w} {mode}: ok in {secs:.1f}s")


def expect_failure(mode, who):
    rc, out, secs = launch(2, 2, mode)
    check(rc == 1, f"{mode}: exit {rc}, expected 1", out)
    check(secs < 20, f"{mode}: took {secs:.1f}s", out)
    check(who in out.splitlines()[-1] or who in out, f"{mode}: names {who}", out)
    print(f"{mode}: exit 1 in {secs:.1f}s naming {who}")


if CASE == "grid":
    for s in (1, 2, 3):
        for w in (1, 2, 4):
            expect_sums(s, w, "sum")
elif CASE == "varlen":
    expect_sums(2, 3, "varlen")
elif CASE == "threads":
    rc, out, _ = launch(2, 2, "threads")
    check(rc == 0, f"threads: exit {rc}", out)
    check(len(re.findall(r"worker \d+ threads ok", out)) == 2, "2 ok", out)
    print("threads: ok")
elif CASE == "kill-worker":
    expect_failure("kill-worker", "worker 0")
elif CASE == "kill-server":
    expect_failure("kill-server", "server 0")
else:
    sys.exit("unknown case " + CASE)
