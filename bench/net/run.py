#!/usr/bin/env python3
"""Scaling across hosts: the ConvNet job (mnist_dist) and a dense model
(kv_bench) on separate hosts with shaped links (tests/net/netns_hosts.py),
for S servers and W workers, each node on a host of its own, with
byte-balanced placement ("bytes") and whole tensors per server ("tensor",
the shape of ps-lite's one key per tensor). Prints tables and writes
scaling.svg (samples/s against S) and results.json to --out.

  python3 bench/net/run.py [--build build] [--rate 1gbit] [--out DIR]

Per-server bytes are what the server's host sent plus received on its link
(the link counters, so every header, ack and retransmit is counted) over
the whole job, divided by the job's steps. Needs root and iproute2.
Measures and prints; never asserts.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "net"))
import netns_hosts  # noqa: E402

RAW_RECEIVER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 9200)); s.listen(1)
c, _ = s.accept(); n = 0
while True:
    d = c.recv(1 << 20)
    if not d: break
    n += len(d)
print(n)
"""
RAW_SENDER = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], 9200)); b = bytes(1 << 20)
t = time.monotonic(); n = 0
while time.monotonic() - t < float(sys.argv[2]):
    c.sendall(b); n += len(b)
c.close(); print(n / (time.monotonic() - t))
"""


def raw_rate(hosts, seconds=3.0):
    """Bytes/s of one TCP stream from h1 to h2 (Python, 1 MiB sends)."""
    receiver = hosts.popen(2, [sys.executable, "-c", RAW_RECEIVER],
                           stdout=subprocess.DEVNULL)
    try:
        for _ in range(50):  # Until it listens.
            r = hosts.run(1, [sys.executable, "-c", RAW_SENDER,
                              hosts.addr(2), str(seconds)], timeout=60)
            if r.returncode == 0:
                return float(r.stdout.split()[-1])
            time.sleep(0.1)
        raise RuntimeError(f"raw transfer failed: {r.stdout}")
    finally:
        receiver.kill()
        receiver.wait()


def plan(servers, workers):
    """Scheduler on h1, servers on h2.., workers after them."""
    p = [("scheduler", None, 1)]
    p += [("server", s, 2 + s) for s in range(servers)]
    p += [("worker", w, 2 + servers + w) for w in range(workers)]
    return p


def run_job(hosts, servers, workers, command, key, timeout, log):
    """(lines, {server rank: bytes on its link}) of one job; exits on a
    failed job, naming why."""
    job_plan = plan(servers, workers)
    job = hosts.job(job_plan, command, key=key, out=log)
    before = hosts.counters()
    rc, why = job.run(timeout=timeout)
    after = hosts.counters()
    if rc != 0:
        sys.exit(f"bench/net: job S={servers} W={workers} failed: {why}\n"
                 + "".join(job.lines[-30:]))
    moved = {}
    for role, rank, host in job_plan:
        if role == "server":
            moved[rank] = sum(after[host]) - sum(before[host])
    return job.lines, moved


def mnist_case(hosts, args, servers, workers, placement, log):
    images = args.steps * workers * args.batch_size
    command = [os.path.join(args.build, "examples", "mnist", "mnist_dist"),
               "--data_dir", args.mnist_dir, "--train_limit", str(images),
               "--test_limit", "100", "--batch_size", str(args.batch_size),
               "--threads", str(args.threads), "--placement", placement,
               "--log_every_s", "1000"]
    lines, moved = run_job(hosts, servers, workers, command, not args.insecure,
                           args.timeout, log)
    text = "".join(lines)
    rates = [float(x) for x in re.findall(
        r"\[worker \d+\] .*final: .*? ([0-9.]+) train samples/s", text)]
    updates = [int(x) for x in re.findall(r"(\d+) updates applied", text)]
    if len(rates) != workers or not updates:
        sys.exit("bench/net: no final lines in the job's output:\n" + text)
    steps = max(updates)  # BSP: every server with keys applied each step.
    return {"model": "mnist", "placement": placement, "S": servers,
            "W": workers, "rate": sum(rates), "unit": "samples/s",
            "steps": steps,
            "server_bytes_per_step": [moved[s] / steps
                                      for s in sorted(moved)]}


def dense_case(hosts, args, servers, workers, layout, log):
    command = [os.path.join(args.build, "bench", "kv", "kv_bench"),
               "--sizes", str(args.dense_floats), "--layouts", layout,
               "--seconds", "0", "--rtt_rounds", "1"]
    lines, moved = run_job(hosts, servers, workers, command, not args.insecure,
                           args.timeout, log)
    text = "".join(lines)
    cells = re.findall(r"\[worker (\d+)\] kv cell .* op=(\w+) rounds=(\d+) "
                       r"median_ms=([0-9.]+)", text)
    if not cells:
        sys.exit("bench/net: no kv cell lines in the job's output:\n" + text)
    ms = {op: float(m) for w, op, _, m in cells if w == "0"}
    # Every worker's push, pull and pull_into rounds, 3 warm-ups each and
    # the assign: each one moves the whole model to or from the servers.
    moves = sum(int(r) + 3 for _, _, r, _ in cells) + workers
    step_s = (ms["push"] + ms["pull"]) / 1e3
    return {"model": "dense", "placement": "bytes" if layout == "chunk"
            else "tensor", "S": servers, "W": workers,
            "rate": workers / step_s, "unit": "steps/s (push+pull, all W)",
            "steps": moves / workers / 2,
            "server_bytes_per_step": [moved[s] * 2 / moves * workers
                                      for s in sorted(moved)]}


def table(results, model):
    rows = [r for r in results if r["model"] == model]
    if not rows:
        return ""
    base = {(r["W"], r["placement"]): r["rate"] for r in rows if r["S"] == 1}
    out = [f"{model}: {rows[0]['unit']}; per-server MB per step "
           f"(sent + received on its link; share of the servers' total)",
           "| W | S | placement | rate | vs S=1 | per-server MB/step "
           "(share) | max share / (1/S) |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        per = r["server_bytes_per_step"]
        total = sum(per) or 1
        shares = " ".join(f"{b / 1e6:.2f} ({b / total:.0%})" for b in per)
        worst = max(per) / total * r["S"]
        speedup = r["rate"] / base[(r["W"], r["placement"])]
        out.append(f"| {r['W']} | {r['S']} | {r['placement']} | "
                   f"{r['rate']:.1f} | {speedup:.2f}x | {shares} | "
                   f"{worst:.2f} |")
    return "\n".join(out)


def svg(results, path):
    """samples/s (or steps/s) against S, one line per model, W, placement;
    each model's rates relative to its S=1 so both fit one axis."""
    series = {}
    for r in results:
        series.setdefault((r["model"], r["W"], r["placement"]), []).append(r)
    width, height, pad = 640, 400, 60
    max_s = max(r["S"] for r in results)
    max_y = max(max(p["rate"] / v[0]["rate"] for p in v)
                for v in series.values())
    max_y = max(4.0, math.ceil(max_y))

    def xy(s, y):
        return (pad + (s - 1) / max(1, max_s - 1) * (width - 2 * pad),
                height - pad - y / max_y * (height - 2 * pad))
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
              "#8c564b", "#e377c2", "#7f7f7f"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height}" font-family="sans-serif" font-size="12">',
             '<rect width="100%" height="100%" fill="white"/>',
             f'<text x="{width / 2}" y="20" text-anchor="middle">rate '
             f'relative to S=1 against servers S (each on its own host)'
             f'</text>']
    for y in range(0, int(max_y) + 1):
        x0, y0 = xy(1, y)
        x1, _ = xy(max_s, y)
        parts.append(f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" '
                     f'stroke="#ddd"/><text x="{x0 - 8}" y="{y0 + 4}" '
                     f'text-anchor="end">{y}x</text>')
    for s in sorted({r["S"] for r in results}):
        x, y = xy(s, 0)
        parts.append(f'<text x="{x}" y="{y + 18}" text-anchor="middle">'
                     f'S={s}</text>')
    for i, ((model, w, placement), rows) in enumerate(sorted(series.items())):
        color = colors[i % len(colors)]
        dash = "" if placement == "bytes" else ' stroke-dasharray="6 4"'
        points = " ".join("%.1f,%.1f" % xy(r["S"], r["rate"] / rows[0]["rate"])
                          for r in rows)
        parts.append(f'<polyline points="{points}" fill="none" '
                     f'stroke="{color}" stroke-width="2"{dash}/>')
        ly = 40 + 16 * i
        parts.append(f'<line x1="{pad + 10}" y1="{ly}" x2="{pad + 40}" '
                     f'y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>'
                     f'<text x="{pad + 46}" y="{ly + 4}">{model} W={w} '
                     f'{placement} (S=1: {rows[0]["rate"]:.0f})</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--mnist-dir", default=os.path.join(ROOT, "data", "mnist"))
    p.add_argument("--rate", default="1gbit", help="each host's link")
    p.add_argument("--servers", default="1,2,4")
    p.add_argument("--workers", default="2,4")
    p.add_argument("--models", default="mnist,dense")
    p.add_argument("--placements", default="bytes,tensor")
    p.add_argument("--steps", type=int, default=60, help="mnist steps a job")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="per worker")
    p.add_argument("--dense-floats", type=int, default=10_000_000)
    p.add_argument("--insecure", action="store_true",
                   help="no job key (plain TCP; default: CurveZMQ)")
    p.add_argument("--timeout", type=float, default=600, help="per job")
    p.add_argument("--out", default=os.path.join(ROOT, "build", "bench-net"))
    args = p.parse_args()
    missing = netns_hosts.missing_requirements()
    if missing:
        sys.exit(f"bench/net: {missing}")
    netns_hosts.remove_stale()
    netns_hosts.exit_on_sigterm()
    servers = [int(x) for x in args.servers.split(",")]
    workers = [int(x) for x in args.workers.split(",")]
    os.makedirs(args.out, exist_ok=True)
    results = []
    with open(os.path.join(args.out, "jobs.log"), "wb") as log, \
            netns_hosts.Hosts(1 + max(servers) + max(workers),
                              rate=args.rate) as hosts:
        rate = raw_rate(hosts)
        print(f"link {args.rate}: one TCP stream h1 -> h2 moved "
              f"{rate * 8 / 1e9:.3f} Gbit/s; "
              f"{'plain TCP' if args.insecure else 'CurveZMQ'} jobs; "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
        for model in args.models.split(","):
            for w in workers:
                for placement in args.placements.split(","):
                    for s in servers:
                        if model == "mnist":
                            r = mnist_case(hosts, args, s, w, placement, log)
                        else:
                            layout = "chunk" if placement == "bytes" \
                                else "tensor"
                            r = dense_case(hosts, args, s, w, layout, log)
                        results.append(r)
                        print(f"  {model} W={w} S={s} {placement}: "
                              f"{r['rate']:.1f} {r['unit']}", flush=True)
    for model in ("mnist", "dense"):
        text = table(results, model)
        if text:
            print("\n" + text)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"link_bytes_per_s": rate, "args": vars(args),
                   "results": results}, f, indent=1)
    svg(results, os.path.join(args.out, "scaling.svg"))
    print(f"\nwrote {args.out}/scaling.svg, results.json, jobs.log")


if __name__ == "__main__":
    main()
