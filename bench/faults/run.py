#!/usr/bin/env python3
"""Measures what failures cost the ConvNet job (build/examples/mnist/
mnist_dist through tracker/launch.py), in one run, and prints it:

  replication  samples/s with --replicas 0 and 1, S = 2 and 3 servers,
               W = 2 workers, alternated in back-to-back pairs (ratio per
               pair and the median);
  drops        samples/s with PS_DROP_MSG=0 and 1 (S = W = 2), alternated;
  faults       per fault, from one job each: seconds from the fault to its
               detection (the first line naming it) and to the next training
               step (recovery), the job's exit, the steps every surviving
               server applied, and the final accuracy against the fault-free
               job (same flags):
                 a server killed (kill -9) at step 100 with --replicas 1 (the
                 job goes on), a server killed without replicas (the job
                 stops, naming it), a worker killed (the job stops, naming
                 it), a worker killed under --max-restarts 1 (the launcher
                 starts it again and it rejoins; recover: to its line
                 "rejoined at step"), 1% of messages lost, the scheduler
                 killed from outside (the job stops, naming it; detect: from
                 the kill), and the same under --max-restarts 1 (the
                 launcher starts it again; detect: to the launcher's line,
                 recover: to the new scheduler's takeover).

  python3 bench/faults/run.py BUILD_DIR [--only SECTION] [--pairs N]
                             [--train_limit N] [--ps_shm 0|1]

It prints; it never asserts. Times are wall-clock seconds of this machine,
read off the job's output lines as they arrive.
"""

import argparse
import hashlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "tracker" / "launch.py"
ENV = ["--env", "PS_HEARTBEAT_INTERVAL_MS=1000",
       "--env", "PS_HEARTBEAT_TIMEOUT_MS=10000"]
# mnist_dist's defaults before the one-cycle recipe (the figures of the
# README were taken with them), then this bench's own.
FLAGS = ["--epochs", "1", "--batch_size", "32", "--lr", "1e-3",
         "--lr_schedule", "step", "--ema_decay", "0", "--lr_ref_batch", "0",
         "--max_shift", "0",
         "--threads", "1", "--consistency", "bsp", "--batch_size", "32",
         "--test_limit", "2000", "--log_every_s", "0.2"]
RATE = re.compile(r"\[worker 0\] final: .* \(this worker; \d+ workers: ~(\d+)\)")
ACCURACY = re.compile(r"\[worker 0\] final: test accuracy ([0-9.]+)%")
STEP = re.compile(r"\[worker \d+\] worker \d+ epoch \d+ step (\d+)")
UPDATES = re.compile(r"server (\d+) done: consistency \w+ max_delay \d+: "
                     r"(\d+) updates applied")


def launch(build, servers, workers, flags, extra=(), timeout=600):
    """Runs one job; returns (exit code, [(seconds, line)])."""
    cmd = [sys.executable, str(LAUNCH), "-s", str(servers), "-w",
           str(workers), "--timeout", str(timeout), *ENV, *extra, "--",
           str(build / "examples/mnist/mnist_dist"), *FLAGS, *flags]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines = [(time.monotonic() - start, line.rstrip("\n"))
             for line in proc.stdout]
    return proc.wait(), lines


def kill_scheduler(build, flags, extra=()):
    """A job whose scheduler gets SIGKILL from here once worker 0 reports a
    step; returns (exit code, seconds from the kill to the first line naming
    the scheduler dead or restarted, to the restarted scheduler's takeover
    (None when not seen), [(seconds since the start, line)])."""
    port = 20000 + os.getpid() % 20000
    cmd = [sys.executable, str(LAUNCH), "-s", "2", "-w", "2", "--timeout",
           "300", "--port", str(port), *ENV, *extra, "--",
           str(build / "examples/mnist/mnist_dist"), *FLAGS, *flags]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    want = [b"DMLC_ROLE=scheduler", f"DMLC_PS_ROOT_PORT={port}".encode()]
    killed = detected = recovered = None
    lines = []
    for line in proc.stdout:
        lines.append((time.monotonic() - start, line.rstrip("\n")))
        if killed is None and "] worker 0 epoch 0 step" in line:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        env = f.read().split(b"\0")
                except OSError:
                    continue
                if all(w in env for w in want):
                    os.kill(int(pid), signal.SIGKILL)
                    killed = time.monotonic()
        elif (killed is not None and detected is None and
              re.search(r"scheduler \(tcp://[^)]*\) was declared dead|"
                        r"scheduler \(pid \d+\) was killed", line)):
            detected = time.monotonic() - killed
        elif (killed is not None and recovered is None and
              "took the running job over" in line):
            recovered = time.monotonic() - killed
    return proc.wait(), detected, recovered, lines


def first(lines, pattern, after=0.0):
    """Seconds of the first line matching pattern at or after `after`."""
    for t, line in lines:
        if t >= after and re.search(pattern, line):
            return t
    return None


def value(lines, regex):
    for _, line in lines:
        m = regex.search(line)
        if m:
            return float(m.group(1))
    return None


def alternate(build, pairs, servers, flags, variants, weights=None):
    """samples/s of each variant (name -> (flags, launch options)),
    alternated in pairs; returns {name: [rates]}. With a dict `weights`,
    each job dumps its final weights and weights[name] gets their
    SHA-256s."""
    rates = {name: [] for name in variants}
    names = list(variants)
    for i in range(pairs):
        for name in (names if i % 2 == 0 else names[::-1]):
            vflags, extra = variants[name]
            with tempfile.TemporaryDirectory() as tmp:
                dump = Path(tmp) / "weights"
                wflags = ["--dump_weights", str(dump)] if weights is not None \
                    else []
                rc, lines = launch(build, servers, 2, flags + vflags + wflags,
                                   extra)
                if weights is not None and dump.exists():
                    weights.setdefault(name, []).append(
                        hashlib.sha256(dump.read_bytes()).hexdigest()[:12])
            rate = value(lines, RATE)
            if rc != 0 or rate is None:
                print(f"  {name}: job failed (exit {rc}); left out")
                continue
            rates[name].append(rate)
    return rates


def ratio_line(label, rates, base, other):
    a, b = rates[base], rates[other]
    n = min(len(a), len(b))
    if n == 0:
        print(f"{label}: no data")
        return
    ratios = [y / x for x, y in zip(a[:n], b[:n])]
    print(f"{label}: {base} {statistics.median(a):.0f} samples/s, {other} "
          f"{statistics.median(b):.0f}; {other}/{base} median "
          f"{statistics.median(ratios):.3f} (pairs: "
          f"{' '.join(f'{r:.2f}' for r in ratios)})")


def replication(build, pairs, limit, shm):
    print(f"\n== Cost of replication: W = 2, --train_limit {limit}, "
          f"--ps_shm {shm}, {pairs} pairs", flush=True)
    flags = ["--train_limit", str(limit), "--ps_shm", str(shm)]
    for servers in (2, 3):
        rates = alternate(build, pairs, servers, flags, {
            "replicas 0": (["--replicas", "0"], []),
            "replicas 1": (["--replicas", "1"], [])})
        ratio_line(f"S = {servers}", rates, "replicas 0", "replicas 1")


def drops(build, pairs, limit):
    print(f"\n== Cost of 1% lost messages: S = W = 2, --train_limit {limit}, "
          f"{pairs} rounds: no drops and 1% dropped with the default "
          f"(adaptive) resend timer; no drops with PS_RESEND_TIMEOUT_MS=1000 "
          f"(fixed, the old default), 1% dropped with =100",
          flush=True)
    flags = ["--train_limit", str(limit)]
    weights = {}
    rates = alternate(build, pairs, 2, flags, {
        "no drops": ([], []),
        "1% dropped": ([], ["--env", "PS_DROP_MSG=1"]),
        "no drops, fixed 1000 ms": ([], ["--env", "PS_RESEND_TIMEOUT_MS=1000"]),
        "1% dropped, fixed 100 ms": ([], ["--env", "PS_RESEND_TIMEOUT_MS=100",
                                          "--env", "PS_DROP_MSG=1"])},
        weights)
    ratio_line("S = 2, W = 2, default timer", rates, "no drops", "1% dropped")
    ratio_line("S = 2, W = 2, fixed 100 ms", rates, "no drops",
               "1% dropped, fixed 100 ms")
    ratio_line("S = 2, W = 2, no drops: default timer vs fixed 1000 ms",
               rates, "no drops, fixed 1000 ms", "no drops")
    hashes = {h for hs in weights.values() for h in hs}
    print(f"final weights (SHA-256): {weights}; "
          f"{'all the same' if len(hashes) == 1 else 'DIFFERENT'}")


def faults(build, limit):
    print(f"\n== Faults: S = W = 2, --train_limit {limit}, one job each",
          flush=True)
    flags = ["--train_limit", str(limit)]
    rc, lines = launch(build, 2, 2, flags)
    base = value(lines, ACCURACY)
    print(f"fault-free: exit {rc}, accuracy {base}%")
    cases = [
        ("server 1 killed, --replicas 1",
         ["--replicas", "1", "--die_node", "server:1", "--die_after_steps",
          "100"], ["--tolerate", "server"], r"takes over its keys", None),
        ("server 1 killed, no replicas",
         ["--die_node", "server:1", "--die_after_steps", "100"], [],
         r"server 1 \(tcp://[^)]*\) was declared dead", None),
        ("worker 1 killed (policy stop)",
         ["--die_node", "worker:1", "--die_after_steps", "100"], [],
         r"worker 1 \(tcp://[^)]*\) was declared dead", None),
        ("worker 1 killed (restart)",
         ["--die_node", "worker:1", "--die_after_steps", "100"],
         ["--max-restarts", "1"],
         r"worker 1 \(tcp://[^)]*\) was declared dead",
         r"worker 1 rejoined at step"),
        ("1% of messages lost", [],
         ["--env", "PS_DROP_MSG=1", "--env", "PS_RESEND_TIMEOUT_MS=100"],
         None, None),
    ]
    head = ("fault", "exit", "detect s", "recover s", "updates", "accuracy",
            "vs fault-free")
    rows = []
    for name, fflags, extra, detected, recovered in cases:
        rc, lines = launch(build, 2, 2, flags + fflags, extra)
        fault = first(lines, r"killing itself")
        detect = (first(lines, detected, fault) if detected and fault
                  is not None else None)
        recover = None
        if detect is not None and rc == 0:
            recover = first(lines, recovered or STEP.pattern, detect)
        updates = sorted({(m.group(1), m.group(2)) for _, l in lines
                          for m in [UPDATES.search(l)] if m})
        acc = value(lines, ACCURACY)
        rows.append((name, rc,
                     "-" if detect is None else f"{detect - fault:.3f}",
                     "-" if recover is None else f"{recover - fault:.3f}",
                     " ".join(f"s{s}:{u}" for s, u in updates) or "-",
                     "-" if acc is None else f"{acc:.2f}%",
                     "-" if acc is None or base is None
                     else f"{acc - base:+.2f}"))
    for name, extra in (("scheduler killed (from outside)", []),
                        ("scheduler killed (from outside), restart",
                         ["--max-restarts", "1"])):
        rc, detect, recover, lines = kill_scheduler(build, flags, extra)
        updates = sorted({(m.group(1), m.group(2)) for _, l in lines
                          for m in [UPDATES.search(l)] if m})
        acc = value(lines, ACCURACY)
        rows.append((name, rc, "-" if detect is None else f"{detect:.3f}",
                     "-" if recover is None else f"{recover:.3f}",
                     " ".join(f"s{s}:{u}" for s, u in updates) or "-",
                     "-" if acc is None else f"{acc:.2f}%",
                     "-" if acc is None or base is None
                     else f"{acc - base:+.2f}"))
    widths = [max(len(str(r[i])) for r in rows + [head])
              for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(v).ljust(n) for v, n in zip(r, widths)))
    print("(detect: seconds from the victim's last line to the first line "
          "naming its death or takeover; recover: to the next training step "
          "printed after that; updates: steps each surviving server applied)")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build_dir", type=Path)
    parser.add_argument("--only", choices=("replication", "drops", "faults"))
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--train_limit", type=int, default=16000)
    parser.add_argument("--ps_shm", type=int, choices=(0, 1), default=1,
                        help="replication: values through shared memory "
                        "(1) or through the sockets (0)")
    args = parser.parse_args()
    build = args.build_dir.resolve()
    if not (build / "examples/mnist/mnist_dist").is_file():
        sys.exit(f"run.py: {build}/examples/mnist/mnist_dist is missing; "
                 f"build it first")
    if args.only in (None, "replication"):
        replication(build, args.pairs, args.train_limit, args.ps_shm)
    if args.only in (None, "drops"):
        drops(build, args.pairs, args.train_limit)
    if args.only in (None, "faults"):
        faults(build, args.train_limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
