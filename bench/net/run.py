#!/usr/bin/env python3
"""Scaling across hosts: the ConvNet job (mnist_dist) and a dense model
(kv_bench) on separate hosts with shaped links (tests/net/netns_hosts.py),
for S servers and W workers, each node on a host of its own, with
byte-balanced placement ("bytes") and whole tensors per server ("tensor",
the shape of ps-lite's one key per tensor). Prints tables and writes
scaling-MODEL.svg (samples/s against S, drawn with matplotlib: Debian's
python3-matplotlib for /usr/bin/python3) and results.json to --out.

  /usr/bin/python3 bench/net/run.py [--build build] [--rate 1gbit] [--out DIR]

Per-server bytes are what the server's host sent plus received on its link
(the link counters, so every header, ack and retransmit is counted) over
the whole job, divided by the job's steps. Needs root and iproute2 (exits
77, saying why, without them). Measures and prints; never asserts.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "net"))
import netns_hosts  # noqa: E402

EXIT_SKIPPED = 77  # What ctest's SKIP_RETURN_CODE expects.

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


def mnist_case(hosts, args, servers, workers, placement, log,
               compress="none"):
    images = args.steps * workers * args.batch_size
    command = [os.path.join(args.build, "examples", "mnist", "mnist_dist"),
               "--data_dir", args.mnist_dir, "--train_limit", str(images),
               "--test_limit", "100", "--batch_size", str(args.batch_size),
               "--threads", str(args.threads), "--placement", placement,
               "--log_every_s", "1000", "--compress", compress]
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
            "W": workers, "compress": compress, "rate": sum(rates),
            "unit": "samples/s",
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


def fmt(x):
    """Three significant figures or so: 208, 12.5, 1.23."""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def median_run(runs):
    """The run of median rate (the lower middle one), with every rate."""
    r = dict(sorted(runs, key=lambda r: r["rate"])[(len(runs) - 1) // 2])
    r["rates"] = [x["rate"] for x in runs]
    return r


def table(results, model):
    rows = [r for r in results if r["model"] == model
            and r.get("compress", "none") == "none"]
    if not rows:
        return ""
    # S=1 is the same job under either placement: its baseline pools both.
    pooled = {}
    for r in rows:
        if r["S"] == 1:
            pooled.setdefault(r["W"], []).extend(r.get("rates", [r["rate"]]))
    base = {w: sorted(v)[(len(v) - 1) // 2] for w, v in pooled.items()}
    out = [f"{model}: {rows[0]['unit']} (median of the runs listed); "
           f"vs S=1: over the median of all S=1 runs of that W; per-server "
           f"MB per step (sent + received on its link; share of the "
           f"servers' total)",
           "| W | S | placement | rate (runs) | vs S=1 | per-server MB/step "
           "(share) | max share / (1/S) |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        per = r["server_bytes_per_step"]
        total = sum(per) or 1
        shares = " ".join(f"{b / 1e6:.2f} ({b / total:.0%})" for b in per)
        worst = max(per) / total * r["S"]
        speedup = r["rate"] / base[r["W"]]
        runs = ", ".join(fmt(x) for x in r.get("rates", [r["rate"]]))
        out.append(f"| {r['W']} | {r['S']} | {r['placement']} | "
                   f"{fmt(r['rate'])} ({runs}) | {speedup:.2f}x | {shares} | "
                   f"{worst:.2f} |")
    return "\n".join(out)


def compress_lines(results):
    """One line per compressed case: its rate against the same case
    uncompressed, and its server's MB per step."""
    base = {(r["W"], r["S"], r["placement"]): r["rate"] for r in results
            if r["model"] == "mnist" and r.get("compress") == "none"}
    out = []
    for r in results:
        if r["model"] != "mnist" or "compress" not in r:
            continue
        none = base.get((r["W"], r["S"], r["placement"]))
        vs = f"{r['rate'] / none:.2f}" if none else "?"
        mb = " ".join(f"{b / 1e6:.2f}" for b in r["server_bytes_per_step"])
        runs = ",".join(fmt(x) for x in r.get("rates", [r["rate"]]))
        out.append(f"W={r['W']} S={r['S']} compress={r['compress']} "
                   f"samples/s={fmt(r['rate'])} vs_none={vs} "
                   f"server_MB/step={mb} (runs {runs})")
    return "\n".join(out)


def plot(rows, path):
    """One model's rate against S with matplotlib (the file's extension
    picks the format): a line per W and placement (dashed: tensor), the y
    axis in the model's unit from 0."""
    import matplotlib
    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    series = {}
    for r in rows:
        series.setdefault((r["W"], r["placement"]), []).append(r)
    workers = sorted({w for w, _ in series})
    fig, ax = plt.subplots(figsize=(9, 5))
    for (w, placement), line in sorted(series.items()):
        line = sorted(line, key=lambda r: r["S"])
        ax.plot([r["S"] for r in line], [r["rate"] for r in line],
                color=f"C{workers.index(w)}", marker="o",
                linestyle="-" if placement == "bytes" else "--",
                label=f"W={w}, placement {placement}")
    ax.set_title(f'{rows[0]["model"]}: {rows[0]["unit"]} against servers S '
                 "(each node on its own host)")
    ax.set_xlabel("servers S")
    ax.set_ylabel(rows[0]["unit"])
    ax.set_xticks(sorted({r["S"] for r in rows}))
    ax.set_ylim(bottom=0)
    ax.grid(True, color="#ddd")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


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
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of each case; the table shows the median")
    p.add_argument("--compress", default="none",
                   help="mnist: push codecs to compare, e.g. "
                   "none,bf16,topk:0.01,onebit (ps/compress.h)")
    p.add_argument("--pull", default="none",
                   help="mnist: pull codecs to combine with each, e.g. "
                   "none,bf16")
    p.add_argument("--insecure", action="store_true",
                   help="no job key (plain TCP; default: sealed frames)")
    p.add_argument("--timeout", type=float, default=600, help="per job")
    p.add_argument("--out", default=os.path.join(ROOT, "build", "bench-net"))
    args = p.parse_args()
    missing = netns_hosts.missing_requirements()
    if missing:
        print(f"bench/net: skipped: {missing}", file=sys.stderr)
        sys.exit(EXIT_SKIPPED)
    netns_hosts.remove_stale()
    netns_hosts.exit_on_sigterm()
    servers = [int(x) for x in args.servers.split(",")]
    workers = [int(x) for x in args.workers.split(",")]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "jobs.log"), "wb") as log, \
            netns_hosts.Hosts(1 + max(servers) + max(workers),
                              rate=args.rate) as hosts:
        rate = raw_rate(hosts)
        print(f"link {args.rate}: one TCP stream h1 -> h2 moved "
              f"{rate * 8 / 1e9:.3f} Gbit/s; "
              f"{'plain TCP' if args.insecure else 'sealed'} jobs; "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
        # Rounds over every case, so that a change of the machine's load
        # falls on all of them alike; each case's median is reported.
        codecs = []
        for push in args.compress.split(","):
            for pull in args.pull.split(","):
                codecs.append(push if pull == "none"
                              else f"{push},pull={pull}")
        cases = [(model, w, placement, s, c)
                 for model in args.models.split(",") for w in workers
                 for placement in args.placements.split(",")
                 for s in servers
                 for c in (codecs if model == "mnist" else ["none"])]
        runs = {case: [] for case in cases}
        for round_ in range(args.repeat):
            for model, w, placement, s, c in cases:
                if model == "mnist":
                    r = mnist_case(hosts, args, s, w, placement, log, c)
                else:
                    layout = "chunk" if placement == "bytes" else "tensor"
                    r = dense_case(hosts, args, s, w, layout, log)
                runs[(model, w, placement, s, c)].append(r)
                print(f"  round {round_ + 1}: {model} W={w} S={s} "
                      f"{placement} compress={c}: {r['rate']:.1f} "
                      f"{r['unit']}", flush=True)
        results = [median_run(runs[case]) for case in cases]
    for model in ("mnist", "dense"):
        text = table(results, model)
        if text:
            print("\n" + text)
    if args.compress != "none" or args.pull != "none":
        print("\ncompression (mnist; vs_none: over the same case "
              "uncompressed, which runs when the list has none)\n"
              + compress_lines(results))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"link_bytes_per_s": rate, "args": vars(args),
                   "results": results}, f, indent=1)
    written = ["results.json", "jobs.log"]
    for model in ("mnist", "dense"):
        rows = [r for r in results if r["model"] == model
                and r.get("compress", "none") == "none"]
        if not rows:
            continue
        try:
            plot(rows, os.path.join(args.out, f"scaling-{model}.svg"))
            written.append(f"scaling-{model}.svg")
        except ImportError as err:
            print(f"no plot: {err} (python3-matplotlib, with "
                  "/usr/bin/python3)", file=sys.stderr)
    print(f"\nwrote {', '.join(written)} to {args.out}")


if __name__ == "__main__":
    main()
