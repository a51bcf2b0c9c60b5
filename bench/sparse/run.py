#!/usr/bin/env python3
"""Runs the sparse-table benchmark and prints rows/s against raw ZeroMQ.

One command, builds nothing:  python3 bench/sparse/run.py BUILD_DIR
It runs sparse_bench through tracker/launch.py with 1 server and --workers
workers (1 by default), plain TCP (--insecure) with values through the
sockets (PS_SHM=0), as across hosts; then raw_zmq_bench for each cell's
payload (the unique rows' floats of one request), and prints one table:
rows per second pulled and pushed+applied (Adagrad) by the server, their
MB/s, raw ZeroMQ's MB/s for the same bytes (one message in flight, a
1-byte answer), the ratios, and the server's memory per row. It prints; it
never asserts.
"""

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "tracker/launch.py"


def fields(text):
    return dict(kv.split("=", 1) for kv in text.split() if "=" in kv)


def run(cmd, timeout):
    start = time.monotonic()
    proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True,
                          timeout=timeout)
    print(f"$ {' '.join(map(str, cmd))}  -> exit {proc.returncode} "
          f"in {time.monotonic() - start:.1f} s", flush=True)
    if proc.returncode != 0:
        print(proc.stdout[-3000:] + proc.stderr[-3000:])
        sys.exit(f"run failed: {' '.join(map(str, cmd[:3]))}")
    return proc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build", type=Path,
                    help="a build folder with bench/sparse/sparse_bench and "
                         "bench/kv/raw_zmq_bench")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--widths", default="16,64")
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=10000000)
    ap.add_argument("--shm", action="store_true",
                    help="let the co-located nodes share memory (PS_SHM=1)")
    args = ap.parse_args()
    bench = args.build / "bench/sparse/sparse_bench"
    raw = args.build / "bench/kv/raw_zmq_bench"
    for p in (bench, raw):
        if not p.exists():
            sys.exit(f"no {p}: build the targets sparse_bench and "
                     "raw_zmq_bench first")

    proc = run([sys.executable, LAUNCH, "-s", "1", "-w", str(args.workers),
                "--insecure", "--timeout", "900", "--env",
                f"PS_SHM={1 if args.shm else 0}", "--", bench,
                f"--widths={args.widths}", f"--batch={args.batch}",
                f"--vocab={args.vocab}", f"--seconds={args.seconds}"], 960)
    cells, memory = {}, []
    for line in proc.stdout.splitlines():
        m = re.match(r"\[(worker|server) (\d+)\] sparse (cell|memory) (.*)",
                     line)
        if not m:
            continue
        f = fields(m.group(4))
        if m.group(3) == "cell":
            cells.setdefault((int(f["width"]), f["ids"]), []).append(f)
        else:
            memory.append(f)
    if not cells:
        sys.exit("sparse_bench printed no cell")

    payload = sorted({round(float(c[0]["payload_bytes"]))
                      for c in cells.values()})
    rawp = run([raw, "--bytes=" + ",".join(map(str, payload)),
                f"--seconds={args.seconds}", "--rtt_rounds=10"], 300)
    raw_mbps = {}
    for line in rawp.stdout.splitlines():
        if line.startswith("raw throughput"):
            f = fields(line)
            raw_mbps[int(f["bytes"])] = float(f["mbps"])

    head = ("width", "ids", "rows/req", "pull rows/s", "push rows/s",
            "pull MB/s", "push MB/s", "raw MB/s", "pull/raw", "push/raw")
    rows = []
    for (width, ids), per_worker in sorted(cells.items()):
        # Per server: the workers' rates add up (one server serves them all).
        pull = sum(float(f["pull_rows_s"]) for f in per_worker)
        push = sum(float(f["push_rows_s"]) for f in per_worker)
        unique = float(per_worker[0]["rows"])
        bytes_ = round(float(per_worker[0]["payload_bytes"]))
        r = raw_mbps.get(bytes_, float("nan"))
        pull_mb, push_mb = pull * width * 4 / 1e6, push * width * 4 / 1e6
        rows.append((width, ids, f"{unique:.0f}", f"{pull:,.0f}",
                     f"{push:,.0f}", f"{pull_mb:.0f}", f"{push_mb:.0f}",
                     f"{r:.0f}", f"{pull_mb / r:.2f}", f"{push_mb / r:.2f}"))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    for row in (head, *rows):
        print("  ".join(str(x).rjust(w) for x, w in zip(row, widths)))
    print(f"(1 server, {args.workers} worker(s), Adagrad, one request in "
          f"flight per worker, {args.batch} ids drawn per request from "
          f"[0, {args.vocab}), Zipf exponent 1.1 or uniform; MB/s: the rows' "
          "floats, 1 MB = 1e6 bytes; raw: raw_zmq_bench for one request's "
          "payload)")
    for f in memory:
        print(f"memory, width {f['width']}: {int(f['rows']):,} rows in "
              f"{int(f['bytes']) / 1e6:.1f} MB = {float(f['bytes_per_row']):.1f} "
              f"bytes per row (its floats and Adagrad state: "
              f"{f['row_floats_bytes']} bytes; the rest is the hash index "
              "and the last block's unused rows)")


if __name__ == "__main__":
    main()
