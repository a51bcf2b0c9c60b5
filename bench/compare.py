#!/usr/bin/env python3
"""Runs the kv and fault benches of two checkouts, alternated, and compares.

  python3 bench/compare.py --before DIR_A --after DIR_B [--rounds N]
                           [--only kv|faults] [--logs DIR]

DIR_A and DIR_B are checkout roots, each with its build/ (raw_zmq_bench,
kv_bench and mnist_dist built, data/mnist present). Each side runs its own
bench/kv/run.py, bench/faults/run.py and tracker/launch.py with its own
build, from its own root, so each side runs its own code. A round runs each
step once for A, then once for B (A, B, A, B, ...):

  kv           bench/kv/run.py BUILD --enc_pairs 0 --resend_pairs 0
               (push/pull/pullin over raw ZeroMQ MB/s, the one-float round
               trip against raw REQ/REP, alternated in --rtt_pairs pairs)
  faults       bench/faults/run.py BUILD --only faults (detect and recover
               seconds of each fault, exits, accuracy)
  replication  bench/faults/run.py BUILD --only replication (samples/s with
               replicas 0 and 1)
  drops        bench/faults/run.py BUILD --only drops (samples/s with 0% and
               1% of messages lost)

It parses the key figures of every run's output and prints one table: the
median over rounds before and after, after/before, and which way is better.
A figure a run did not print is left out of its median ("n/a" if none). It
prints; it never asserts.
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HIGHER, LOWER, TEXT = "higher", "lower", "-"  # which way is better


def kv_figures(out):
    """[(figure, value, better)] from bench/kv/run.py's output."""
    figs, head = [], None
    for line in out.splitlines():
        cols = re.split(r"\s{2,}", line.strip())
        if cols[:3] == ["size", "layout", "config"] and "push/raw" in cols:
            head = cols
            continue
        if head and len(cols) == len(head):
            row = dict(zip(head, cols))
            for op in ("push", "pull", "pullin"):
                figs.append((f"kv {row['size']} {row['layout']} "
                             f"{row['config']} {op}/raw",
                             number(row[f"{op}/raw"]), HIGHER))
            continue
        head = None
    raw = re.search(r"^raw REQ/REP\s+median\s+([\d.]+)", out, re.M)
    ours = [float(m.group(1)) for m in re.finditer(
        r"^ours 2\+2 worker \d+\s+median\s+([\d.]+)", out, re.M)]
    if ours:
        mean = statistics.mean(ours)
        figs.append(("rtt 2+2 ours us (one run, mean of workers)", mean,
                     LOWER))
        if raw:
            figs.append(("rtt 2+2 ours/raw REQ/REP (one run)",
                         mean / float(raw.group(1)), LOWER))
    pairs = [(float(m.group(1)), float(m.group(2))) for m in re.finditer(
        r"^pair \d+: raw\s+([\d.]+)\s+ours\s+([\d.]+)", out, re.M)]
    if pairs:
        figs += [
            ("rtt raw REQ/REP us (median of pairs)",
             statistics.median(r for r, _ in pairs), LOWER),
            ("rtt 1+1 ours us (median of pairs)",
             statistics.median(o for _, o in pairs), LOWER),
            ("rtt 1+1 ours/raw REQ/REP (median of pairs)",
             statistics.median(o / r for r, o in pairs), LOWER)]
    return figs


def fault_figures(out):
    """[(figure, value, better)] from bench/faults/run.py --only faults."""
    figs, head = [], None
    m = re.search(r"^fault-free: exit (\d+), accuracy ([\d.]+)%", out, re.M)
    if m:
        figs.append(("fault-free accuracy %", float(m.group(2)), HIGHER))
    for line in out.splitlines():
        cols = re.split(r"\s{2,}", line.strip())
        if cols[:2] == ["fault", "exit"] and "detect s" in cols:
            head = cols
            continue
        if not head or len(cols) != len(head):
            head = None
            continue
        row = dict(zip(head, cols))
        name = f"fault {row['fault']}:"
        figs += [(f"{name} detect s", number(row["detect s"]), LOWER),
                 (f"{name} recover s", number(row["recover s"]), LOWER),
                 (f"{name} exit", row["exit"], TEXT),
                 (f"{name} accuracy vs fault-free",
                  None if row["vs fault-free"] == "-"
                  else row["vs fault-free"], TEXT)]
    return figs


def rate_figures(section):
    """A parser of bench/faults/run.py's ratio lines, e.g. "S = 2: replicas
    0 402 samples/s, replicas 1 332; replicas 1/replicas 0 median 0.826"."""
    line = re.compile(r"^(S = [^:]+): (.+?) (\d+) samples/s, (.+?) (\d+); "
                      r".* median ([\d.]+)", re.M)

    def parse(out):
        figs = []
        for m in line.finditer(out):
            label, a, b = m.group(1), m.group(2), m.group(4)
            figs += [(f"{section} {label}: {a} samples/s",
                      float(m.group(3)), HIGHER),
                     (f"{section} {label}: {b} samples/s",
                      float(m.group(5)), HIGHER),
                     (f"{section} {label}: {b}/{a}", float(m.group(6)),
                      HIGHER)]
        return figs
    return parse


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None  # "-": not measured in this run


def steps(args):
    """[(name, bench, script args after BUILD, timeout s, parser)]."""
    kv = [("kv", "kv", ["--enc_pairs", "0", "--resend_pairs", "0",
                        "--rtt_pairs", args.rtt_pairs,
                        "--seconds", args.kv_seconds], 900, kv_figures)]
    rate = ["--pairs", args.rate_pairs, "--train_limit", args.rate_limit]
    faults = [
        ("faults", "faults", ["--only", "faults", "--train_limit",
                              args.fault_limit], 1800, fault_figures),
        ("replication", "faults", ["--only", "replication", *rate], 1200,
         rate_figures("replication")),
        ("drops", "faults", ["--only", "drops", *rate], 900,
         rate_figures("drops"))]
    return {"kv": kv, "faults": faults, None: kv + faults}[args.only]


NEEDS = {"kv": ["bench/kv/raw_zmq_bench", "bench/kv/kv_bench"],
         "faults": ["examples/mnist/mnist_dist"]}


def check(root, plan):
    """Exits with a message when root lacks what plan runs."""
    need = [f"bench/{b}/run.py" for _, b, _, _, _ in plan] + \
        ["tracker/launch.py"]
    need += [f"build/{p}" for _, b, _, _, _ in plan for p in NEEDS[b]]
    if any(b == "faults" for _, b, _, _, _ in plan):
        need.append("data/mnist")
    missing = [p for p in dict.fromkeys(need) if not (root / p).exists()]
    if missing:
        sys.exit(f"compare.py: {root} lacks {', '.join(missing)} (build "
                 "with cmake --build build --target raw_zmq_bench kv_bench "
                 "mnist_dist; link data/ from a checkout that has MNIST)")


def run(root, bench, script_args, timeout):
    """Runs root's bench script on root/build from root; (exit, output)."""
    cmd = [sys.executable, str(root / "bench" / bench / "run.py"),
           str(root / "build"), *map(str, script_args)]
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher's jobs too
        out, _ = proc.communicate()
        return "timeout", out
    return proc.returncode, out


def show(value):
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    return f"{value:.0f}" if abs(value) >= 100 else \
        f"{value:.1f}" if abs(value) >= 10 else f"{value:.3f}"


def summary(values):
    """The median of numbers; the distinct values of text, in order."""
    if not values:
        return None
    if isinstance(values[0], str):
        return "/".join(dict.fromkeys(values))
    return statistics.median(values)


def print_table(order, better, found):
    head = ("figure", "before", "after", "after/before", "better")
    rows = []
    for fig in order:
        a, b = summary(found[0].get(fig)), summary(found[1].get(fig))
        if a is None and b is None:
            continue  # e.g. the recovery of a fault that stops the job
        if better[fig] == TEXT:
            ratio = "n/a" if a is None or b is None else \
                "same" if a == b else "differs"
        else:
            ratio = show(b / a) if a and b is not None else "n/a"
        rows.append((fig, show(a), show(b), ratio, better[fig]))
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join([r[0].ljust(widths[0])] +
                        [v.rjust(n) for v, n in zip(r[1:], widths[1:])]))


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True,
                        help="checkout root with build/ (A)")
    parser.add_argument("--after", type=Path, required=True,
                        help="checkout root with build/ (B)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=("kv", "faults"),
                        help="kv: bench/kv/run.py only; faults: the faults, "
                        "replication and drops sections only")
    parser.add_argument("--rtt_pairs", type=int, default=3,
                        help="kv run.py --rtt_pairs (default 3)")
    parser.add_argument("--kv_seconds", type=float, default=0.5,
                        help="kv run.py --seconds per cell (default 0.5)")
    parser.add_argument("--fault_limit", type=int, default=9600,
                        help="--train_limit of the faults section (default "
                        "9600: 150 steps per worker, the kill at step 100)")
    parser.add_argument("--rate_pairs", type=int, default=1,
                        help="--pairs of replication and drops (default 1)")
    parser.add_argument("--rate_limit", type=int, default=4800,
                        help="--train_limit of replication and drops "
                        "(default 4800)")
    parser.add_argument("--logs", type=Path,
                        help="also write each run's whole output here")
    args = parser.parse_args()
    roots = [args.before.resolve(), args.after.resolve()]
    plan = steps(args)
    for root in roots:
        check(root, plan)
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)

    print(f"before: {roots[0]}\nafter:  {roots[1]}", flush=True)
    subprocess.run(["uptime"])
    found = [{}, {}]  # side -> figure -> [value per round]
    order, better = [], {}
    start = time.monotonic()
    for rnd in range(args.rounds):
        for name, bench, script_args, timeout, parse in plan:
            for side, label in enumerate(("before", "after")):
                t = time.monotonic()
                rc, out = run(roots[side], bench, script_args, timeout)
                figs = parse(out)
                load = " ".join(f"{v:.1f}" for v in os.getloadavg())
                print(f"round {rnd + 1}/{args.rounds} {label:6} {name:11} "
                      f"exit {rc}, {time.monotonic() - t:5.0f} s, "
                      f"{len(figs)} figures, load {load}", flush=True)
                if rc != 0:
                    print("  " + "\n  ".join(out.splitlines()[-15:]))
                if args.logs:
                    (args.logs / f"{rnd + 1}-{label}-{name}.log").write_text(
                        out)
                for fig, value, way in figs:
                    if fig not in better:
                        order.append(fig)
                        better[fig] = way
                    if value is not None:
                        found[side].setdefault(fig, []).append(value)
    print(f"\n{args.rounds} rounds in {(time.monotonic() - start) / 60:.1f} "
          "min", flush=True)
    subprocess.run(["uptime"])
    print()
    print_table(order, better, found)
    print(f"(before: {roots[0]}, after: {roots[1]}; each: the median over "
          f"{args.rounds} rounds, run alternated before/after; after/before "
          "> 1 is slower where lower is better and faster where higher is; "
          "text figures list their distinct values; kv ratios: our MB/s "
          "over raw ZeroMQ's in the same run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
