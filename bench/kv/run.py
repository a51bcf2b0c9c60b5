#!/usr/bin/env python3
"""Runs the KV benchmark and prints our Push/Pull against raw ZeroMQ.

One command, builds nothing:  python3 bench/kv/run.py BUILD_DIR
It runs raw_zmq_bench, then kv_bench through tracker/launch.py with 1 server
+ 1 worker and with 2 servers + 2 workers, and prints one table (ratios
taken in this one run), the one-float round trip against raw REQ/REP (also
measured in back-to-back pairs, whose median ratio is the bar), the
2-server placement, the 1+1 run's pushes and pulls from and into
ps::SharedArray against ordinary SArrays, and whether each bar holds. These
jobs run with --insecure (plain TCP), like raw ZeroMQ, so the ratios compare
like with like. Last, the cost of encryption: 1+1 jobs with --insecure and
with the launcher's default job key (sealed frames), alternated in back-to-back pairs
(--only encryption runs just that section), and the cost of resending at
0% drops: 1+1 and 2+2 jobs with resending off and on, alternated in pairs
(--only resend). It prints; it never asserts.
"""

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "tracker" / "launch.py"
MODEL = 1199882  # The ConvNet's floats.
CONFIGS = [(1, 1), (2, 2)]
LABELS = {1000: "1K", 100000: "100K", MODEL: "1.2M", 10000000: "10M"}
PUSH_PULL_BAR = 0.80  # of raw zero-copy ZeroMQ MB/s, for the model
RTT_BAR = 1.25  # times the raw REQ/REP round trip
EVEN_BAR = 1.10  # largest server's bytes over the mean
# kv_bench's ops: push, zero-copy pull (the one the bar judges), presized pull.
OPS = ("push", "pull", "pull_into")
# The 1+1 run also compares ps::SharedArray with ordinary SArrays at these
# sizes (kv_bench --shm_sizes, chunk layout), with these ops and labels.
SHM_SIZES = (MODEL, 10000000)
SHM_OPS = {"push": "push", "push_add": "push+add", "pull_into": "pullin"}
# The encryption section's sizes: ordinary SArrays, and ps::SharedArray.
ENC_SIZES = (100000, MODEL, 10000000)
ENC_SHM_SIZES = (MODEL, 10000000)


def print_table(head, rows):
    """Prints head and rows as right-aligned columns."""
    widths = [max(len(str(r[i])) for r in rows + [head])
              for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(v).rjust(n) for v, n in zip(r, widths)))


def fields(line):
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def run(cmd, timeout):
    start = time.monotonic()
    proc = subprocess.run(list(map(str, cmd)), capture_output=True,
                          text=True, timeout=timeout)
    print(f"$ {' '.join(map(str, cmd))}  -> exit {proc.returncode} "
          f"in {time.monotonic() - start:.1f} s", flush=True)
    if proc.returncode != 0:
        print(proc.stdout[-3000:] + proc.stderr[-3000:])
    return proc


def run_raw(build, seconds):
    proc = run([build / "bench/kv/raw_zmq_bench", f"--seconds={seconds}"], 120)
    mbps, rtt = {}, None
    for line in proc.stdout.splitlines():
        if line.startswith("raw throughput"):
            f = fields(line)
            mbps[int(f["bytes"]) // 4] = float(f["mbps"])
        elif line.startswith("raw rtt"):
            rtt = fields(line)
    return mbps, rtt


def run_kv(build, servers, workers, seconds, extra=(), secure=False, env=()):
    """{(floats, layout, op): [per-worker fields]}, rtt per worker, lines,
    shared-memory fields, and the workers' "kv security" fields. Plain TCP
    (--insecure) unless secure: then the launcher's default job key. env:
    KEY=VALUE settings for every node."""
    keys = [] if secure else ["--insecure"]
    for e in env:
        keys += ["--env", e]
    proc = run([sys.executable, LAUNCH, "-s", str(servers), "-w", str(workers),
                "--timeout", "150", *keys, "--", build / "bench/kv/kv_bench",
                f"--seconds={seconds}", *extra], 170)
    cells, rtts, placement, shm, security = {}, [], [], [], []
    for line in proc.stdout.splitlines():
        m = re.match(r"\[worker (\d+)\] kv (\w+) (.*)", line)
        if not m:
            continue
        kind, rest = m.group(2), m.group(3)
        if kind == "cell":
            f = fields(rest)
            key = (int(f["floats"]), f["layout"], f["op"])
            cells.setdefault(key, []).append(f)
        elif kind == "rtt":
            rtts.append((int(m.group(1)), fields(rest)))
        elif kind in ("shm", "shm_total"):
            shm.append((int(m.group(1)), {"kind": kind, **fields(rest)}))
        elif kind == "security":
            security.append(fields(rest))
        else:
            placement.append((kind, rest))
    return proc.returncode, cells, sorted(rtts), placement, shm, security


def rtt_pairs(build, pairs):
    """Alternates raw REQ/REP and our 1+1 Push+Wait round trips, so that each
    ratio compares two runs taken back to back under the same load."""
    out = []
    for _ in range(pairs):
        raw = run([build / "bench/kv/raw_zmq_bench", "--bytes=4",
                   "--seconds=0.01", "--rtt_rounds=2000"], 60)
        ours = run([sys.executable, LAUNCH, "-s", "1", "-w", "1", "--timeout",
                    "60", "--insecure", "--", build / "bench/kv/kv_bench",
                    "--sizes=",
                    "--rtt_rounds=2000"], 80)
        r = [fields(l) for l in raw.stdout.splitlines()
             if l.startswith("raw rtt")]
        o = [fields(l.split("kv rtt", 1)[1]) for l in ours.stdout.splitlines()
             if "kv rtt" in l]
        if r and o:
            out.append((float(r[0]["median_us"]), float(o[0]["median_us"])))
    return out


def table(raw, results):
    head = ("size", "layout", "config", "push ms", "pull ms", "pullin ms",
            "push MB/s", "pull MB/s", "pullin MB/s", "raw MB/s", "push/raw",
            "pull/raw", "pullin/raw")
    rows = []
    for floats in sorted(raw):
        for layout in ("tensor", "chunk"):
            for (s, w), res in results.items():
                ops = [res["cells"].get((floats, layout, op)) for op in OPS]
                if not all(ops):
                    continue
                ms = [statistics.mean(float(f["median_ms"]) for f in x)
                      for x in ops]
                mb = [sum(float(f["mbps"]) for f in x) for x in ops]
                r = raw[floats]
                rows.append((LABELS.get(floats, str(floats)), layout,
                             f"{s}+{w}", *(f"{v:.3f}" for v in ms),
                             *(f"{v:.0f}" for v in mb), f"{r:.0f}",
                             *(f"{v / r:.2f}" for v in mb)))
    print_table(head, rows)
    print("(ms: median of a Push+Wait / Pull+Wait, mean over workers; MB/s: "
          "1e6 payload bytes/s, summed over workers; pull: ZPull into an "
          "empty SArray, zero-copy when one server answers; pullin: ZPull "
          "into a presized SArray, filled in place; raw: one DEALER->ROUTER "
          "stream)")


def aggregate(res, floats, layout, op):
    cell = res["cells"].get((floats, layout, op), [])
    return sum(float(f["mbps"]) for f in cell) if cell else None


def shared_memory(raw, res):
    """Prints the 1+1 run's ps::SharedArray rows against ordinary SArrays."""
    print("\n== Shared memory between co-located processes (ps::SharedArray)")
    rows = (res or {}).get("shm", [])
    skipped = [f for _, f in rows if "skipped" in f]
    if skipped:
        print(f"skipped: {skipped[0]['skipped']}")
        return
    cells = {(int(f["floats"]), f["op"], f["memory"]): f
             for _, f in rows if f["kind"] == "shm"}
    totals = [(rank, f) for rank, f in rows if f["kind"] == "shm_total"]
    head = ("size", "op", "ordinary ms", "shared ms", "ordinary MB/s",
            "shared MB/s", "raw MB/s", "ordinary/raw", "shared/raw",
            "shared/ordinary", "frames/round")
    table_rows = []
    for floats in SHM_SIZES:
        for op, label in SHM_OPS.items():
            if not all((floats, op, m) in cells
                       for m in ("ordinary", "shared")):
                continue
            o = cells[(floats, op, "ordinary")]
            h = cells[(floats, op, "shared")]
            om, hm = float(o["mbps"]), float(h["mbps"])
            r = raw.get(floats)
            # A push's values go by reference, a pull's answer comes back so.
            way = "sent" if op.startswith("push") else "received"
            frames = int(h[f"frames_{way}"])
            rounds = int(h["rounds"])
            ratios = [f"{v / r:.2f}" if r else "-" for v in (om, hm)]
            table_rows.append((
                LABELS.get(floats, str(floats)), label,
                f"{float(o['median_ms']):.3f}", f"{float(h['median_ms']):.3f}",
                f"{om:.0f}", f"{hm:.0f}", f"{r:.0f}" if r else "-", *ratios,
                f"{hm / om:.2f}", f"{frames / rounds:.2f}"))
    if not table_rows:
        print("no data (the 1+1 kv_bench run failed; its output is above)")
        return
    print_table(head, table_rows)
    print("(1+1, chunk layout; values pushed from and pulled into "
          "ps::SharedArray<float> vs ordinary SArrays, in alternating "
          "blocks of 5 rounds; ms: median of a Push+Wait / Pull+Wait; push: "
          "the server does not read the values, so a shared push moves no "
          "payload and "
          "its MB/s is bytes over a reference's round trip; push+add: the "
          "server adds them into its shard; pullin: ZPull into a presized "
          "array, which a shared answer fills with one memcpy on the "
          "server; frames/round: data frames the worker sent (push) or "
          "received (pull) by reference per shared round, none in the "
          "ordinary rounds; kv_bench aborts otherwise)")
    for rank, f in totals:
        print(f"worker {rank} Node::num_shared_frames_sent() "
              f"{f['frames_sent']}, num_shared_frames_received() "
              f"{f['frames_received']} (whole run, warm-up included)")


def bars(raw, pairs, results):
    def verdict(ok):
        return "HOLDS" if ok else "MISSED"

    one, two = results.get((1, 1)), results.get((2, 2))
    print("\n== Bars")
    for layout in ("tensor", "chunk"):
        for op in ("push", "pull"):
            mb = one and aggregate(one, MODEL, layout, op)
            if mb is None or MODEL not in raw:
                print(f"1.2M {layout} {op} 1+1: no data")
                continue
            ratio = mb / raw[MODEL]
            if op == "pull":
                op += " (zero-copy)"
            print(f"1.2M {layout:6} {op} 1+1 >= {PUSH_PULL_BAR:.2f} raw: "
                  f"{ratio:.2f} ({mb:.0f} vs {raw[MODEL]:.0f} MB/s) "
                  f"{verdict(ratio >= PUSH_PULL_BAR)}")
    if pairs:
        ratio = statistics.median(o / r for r, o in pairs)
        print(f"one-float Push+Wait <= {RTT_BAR} x raw REQ/REP: {ratio:.2f} "
              f"(median of {len(pairs)} back-to-back pairs) "
              f"{verdict(ratio <= RTT_BAR)}")
    if not two:
        return
    for layout in ("tensor", "chunk"):
        split = [int(fields(rest)["bytes"]) for kind, rest in two["placement"]
                 if kind == "split" and f"floats={MODEL} " in rest + " "
                 and f"layout={layout}" in rest]
        if split:
            worst = max(split) / (sum(split) / len(split))
            print(f"1.2M {layout:6} 2 servers even (max/mean <= {EVEN_BAR}): "
                  f"{worst:.2f} (bytes {split}) {verdict(worst <= EVEN_BAR)}")
        if split and layout == "tensor":
            print("  (a key is never split across servers, so one key per "
                  "tensor cannot be even: fc1's weight is 98% of the model)")
    for layout in ("tensor", "chunk"):
        for op in ("push", "pull"):
            a = one and aggregate(one, MODEL, layout, op)
            b = aggregate(two, MODEL, layout, op)
            if a and b:
                print(f"1.2M {layout:6} {op} 2+2 aggregate >= 1+1: "
                      f"{b:.0f} vs {a:.0f} MB/s ({b / a:.2f}x) "
                      f"{verdict(b >= a)}")


def sealed_runs(build, servers, workers, pairs, seconds, extra):
    """{secure: [one {cell key: ms} per run]} of S+W kv_bench jobs with
    --insecure and with the launcher's default job key, alternated in
    back-to-back pairs (the first of each pair swaps every pair); ms is the
    median over the workers. Returns (runs, whether a run failed)."""
    runs = {False: [], True: []}
    failed = False
    for i in range(pairs):
        for secure in ((False, True) if i % 2 == 0 else (True, False)):
            rc, cells, rtts, _, shm, security = run_kv(
                build, servers, workers, seconds, extra, secure)
            failed |= rc != 0
            sealed = {f.get("sealed") for f in security}
            if sealed != {"1" if secure else "0"}:
                print(f"run.py: a {'keyed' if secure else '--insecure'} job "
                      f"reported sealed={sorted(sealed)}; its run is left out")
                failed = True
                continue
            ms = {k: statistics.median(float(f["median_ms"]) for f in v)
                  for k, v in cells.items()}
            for _, f in shm:
                if f["kind"] == "shm" and "skipped" not in f:
                    ms[(int(f["floats"]), "shm", f["op"], f["memory"])] = \
                        float(f["median_ms"])
            if rtts:
                ms["rtt"] = float(rtts[0][1]["median_us"])
            runs[secure].append(ms)
    return runs, failed


def encryption(build, pairs, seconds):
    """Runs 1+1 kv_bench jobs with --insecure and with the launcher's default
    job key (every frame sealed), alternated in back-to-back pairs, and
    prints each op's medians both ways with the ratio of times, ordinary
    SArrays and ps::SharedArray, and the one-float round trip; then the
    same for 2+2 jobs at 10M floats. Returns whether a run failed."""
    print("\n== The crypto's own rate: one frame sealed, opened and copied by "
          "memcpy in one process (seal_bench, best of 20)", flush=True)
    seal_bench = build / "bench/kv/seal_bench"
    if seal_bench.is_file():
        proc = run([seal_bench], 120)
        rows = [fields(line[len("seal "):]) for line in proc.stdout.splitlines()
                if line.startswith("seal ")]
        print_table(("floats", "seal GB/s", "open GB/s", "memcpy GB/s"),
                    [(r["floats"], r["seal_GBps"], r["open_GBps"],
                      r["memcpy_GBps"]) for r in rows])
    else:
        print(f"{seal_bench} is not built; skipped")
    print(f"\n== Cost of encryption (sealed frames): 1+1, {pairs} pairs of "
          "runs, --insecure vs the launcher's default job key", flush=True)
    extra = [f"--sizes={','.join(map(str, ENC_SIZES))}",
             f"--shm_sizes={','.join(map(str, ENC_SHM_SIZES))}"]
    runs, failed = sealed_runs(build, 1, 1, pairs, seconds, extra)
    failed |= sealed_tables(runs, ENC_SIZES, True)
    print(f"\n== Cost of encryption: 2+2, 10M floats, {pairs} pairs of runs",
          flush=True)
    runs, failed22 = sealed_runs(build, 2, 2, pairs, seconds,
                                 ["--sizes=10000000"])
    sealed_tables(runs, (10000000,), False)
    return failed or failed22


def sealed_tables(runs, sizes, one_one):
    """Prints the tables of sealed_runs' runs; returns whether none came."""
    n = min(len(runs[False]), len(runs[True]))
    if n == 0:
        print("no data (every run of a kind failed; the output is above)")
        return True

    def row(key, floats, label):
        plain = [r[key] for r in runs[False][:n] if key in r]
        keyed = [r[key] for r in runs[True][:n] if key in r]
        if len(plain) != n or len(keyed) != n:
            return None
        p, k = statistics.median(plain), statistics.median(keyed)
        ratios = [b / a for a, b in zip(plain, keyed)]
        mb = [f"{floats * 4 / (v * 1e-3) / 1e6:.0f}" if floats else "-"
              for v in (p, k)]
        return (*label, f"{p:.3f}", f"{k:.3f}", *mb,
                f"{statistics.median(ratios):.2f}",
                " ".join(f"{v:.2f}" for v in ratios))

    head = ("size", "layout", "op", "plain ms", "sealed ms", "plain MB/s",
            "sealed MB/s", "sealed/plain", "per pair")
    rows = []
    for floats in sizes:
        for layout in ("tensor", "chunk"):
            for op in OPS:
                r = row((floats, layout, op), floats,
                        (LABELS.get(floats, str(floats)), layout,
                         {"pull_into": "pullin"}.get(op, op)))
                if r:
                    rows.append(r)
    print_table(head, rows)
    print(f"({n} runs each way; ms: median over runs of each run's median "
          "(over its workers) Push+Wait / Pull+Wait; MB/s: payload over that; "
          "sealed/plain: median over back-to-back pairs of keyed ms / "
          "--insecure ms, > 1 is slower; per pair: each pair's ratio; ops "
          "as in the first table)")
    if not one_one:
        return False
    head = ("size", "op", "memory", "plain ms", "sealed ms", "plain MB/s",
            "sealed MB/s", "sealed/plain", "per pair")
    rows = []
    for floats in ENC_SHM_SIZES:
        for op, label in SHM_OPS.items():
            for memory in ("ordinary", "shared"):
                r = row((floats, "shm", op, memory), floats,
                        (LABELS.get(floats, str(floats)), label, memory))
                if r:
                    rows.append(r)
    print()
    if rows:
        print_table(head, rows)
        print("(the same runs' --shm_sizes rows, chunk layout: values in "
              "ps::SharedArray (only a reference travels in the header) or "
              "in ordinary SArrays, alternating blocks as in the shared-memory "
              "section)")
    else:
        print("no shared-memory rows (PS_SHM=0, or the runs failed)")
    r = row("rtt", 0, ("one-float Push+Wait round trip",))
    if r:
        print(f"\n{r[0]}: plain {float(r[1]):.1f} us, sealed "
              f"{float(r[2]):.1f} us, sealed/plain "
              f"{r[5]} (per pair {r[6]})")
    return False


def resend(build, pairs, seconds):
    """The cost of resending at 0% drops: 1+1 and 2+2 kv_bench jobs with
    resending off (PS_RESEND_TIMEOUT_MS=0) and on (the default), alternated
    in back-to-back pairs, --insecure. Prints each op's medians both ways
    and the median ratio of times. Returns whether a run failed."""
    print(f"\n== Cost of resending at 0% drops: {pairs} pairs of runs, "
          "PS_RESEND_TIMEOUT_MS=0 (off) vs the default (on)", flush=True)
    failed = False
    for servers, workers in CONFIGS:
        runs = {False: [], True: []}  # resend on -> one dict per run
        for i in range(pairs):
            for on in ((False, True) if i % 2 == 0 else (True, False)):
                env = () if on else ("PS_RESEND_TIMEOUT_MS=0",)
                rc, cells, rtts, _, _, _ = run_kv(
                    build, servers, workers, seconds,
                    [f"--sizes={','.join(map(str, ENC_SIZES))}"], env=env)
                failed |= rc != 0
                if rc != 0:
                    continue
                # Per op, the mean over workers of their medians.
                ms = {k: statistics.mean(float(f["median_ms"]) for f in v)
                      for k, v in cells.items()}
                if rtts:
                    ms["rtt"] = statistics.mean(float(f["median_us"])
                                                for _, f in rtts)
                runs[on].append(ms)
        n = min(len(runs[False]), len(runs[True]))
        print(f"\n{servers}+{workers}: {n} runs each way")
        if n == 0:
            continue
        head = ("size", "layout", "op", "off ms", "on ms", "on/off",
                "per pair")
        rows = []
        keys = [k for k in runs[False][0] if k != "rtt"] + ["rtt"]
        for key in keys:
            off = [r[key] for r in runs[False][:n] if key in r]
            on = [r[key] for r in runs[True][:n] if key in r]
            if len(off) != n or len(on) != n:
                continue
            ratios = [b / a for a, b in zip(off, on)]
            label = (("1-float rtt (us)", "-", "push") if key == "rtt" else
                     (LABELS.get(key[0], str(key[0])), key[1],
                      {"pull_into": "pullin"}.get(key[2], key[2])))
            rows.append((*label, f"{statistics.median(off):.3f}",
                         f"{statistics.median(on):.3f}",
                         f"{statistics.median(ratios):.3f}",
                         " ".join(f"{v:.2f}" for v in ratios)))
        print_table(head, rows)
    print("(ms: median over runs of each run's median Push+Wait / Pull+Wait, "
          "averaged over workers; on/off: median over back-to-back pairs of "
          "on ms / off ms, > 1 is slower)")
    return failed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir", type=Path,
                        help="a build folder with bench/kv/raw_zmq_bench and "
                        "bench/kv/kv_bench already built")
    parser.add_argument("--seconds", type=float, default=0.5,
                        help="measured time per cell and op (default 0.5)")
    parser.add_argument("--rtt_pairs", type=int, default=5,
                        help="raw/ours round-trip runs alternated for the "
                        "round-trip bar (default 5)")
    parser.add_argument("--enc_pairs", type=int, default=3,
                        help="--insecure/keyed 1+1 runs alternated for the "
                        "cost of encryption (default 3; 0: skip it)")
    parser.add_argument("--resend_pairs", type=int, default=3,
                        help="resend off/on runs alternated for the cost of "
                        "resending (default 3; 0: skip it)")
    parser.add_argument("--only", choices=("encryption", "resend"),
                        help="run only this section")
    args = parser.parse_args()
    build = args.build_dir.resolve()
    for name in ("raw_zmq_bench", "kv_bench"):
        if not (build / "bench/kv" / name).is_file():
            sys.exit(f"run.py: {build}/bench/kv/{name} is missing; build it "
                     f"first (cmake --build {args.build_dir} --target {name})")

    if args.only == "encryption":
        return 1 if encryption(build, args.enc_pairs, args.seconds) else 0
    if args.only == "resend":
        return 1 if resend(build, args.resend_pairs, args.seconds) else 0

    raw, raw_rtt = run_raw(build, args.seconds)
    pairs = rtt_pairs(build, args.rtt_pairs)
    results, failed = {}, False
    for servers, workers in CONFIGS:
        extra = []
        if (servers, workers) == (1, 1):
            extra.append(f"--shm_sizes={','.join(map(str, SHM_SIZES))}")
        rc, cells, rtts, placement, shm, _ = run_kv(build, servers, workers,
                                                    args.seconds, extra)
        failed |= rc != 0
        results[(servers, workers)] = {"cells": cells, "rtts": rtts,
                                       "placement": placement, "shm": shm}

    print("\n== Push+Wait / Pull+Wait against raw zero-copy ZeroMQ")
    table(raw, results)
    print("\n== One-key one-float Push+Wait round trip vs raw REQ/REP (us)")
    if raw_rtt:
        print(f"raw REQ/REP       median {raw_rtt['median_us']:>7}  "
              f"p99 {raw_rtt['p99_us']:>7}")
    for (s, w), res in results.items():
        for rank, f in res["rtts"]:
            ratio = (float(f["median_us"]) / float(raw_rtt["median_us"])
                     if raw_rtt else float("nan"))
            print(f"ours {s}+{w} worker {rank}  median {f['median_us']:>7}  "
                  f"p99 {f['p99_us']:>7}  ratio {ratio:.2f}")
    print("\n== Placement with 2 servers (Placement::ByBytes)")
    for kind, rest in results.get((2, 2), {}).get("placement", []):
        if f"floats={MODEL} " in rest + " ":
            print(f"{kind} {rest}")
    print("\n== One-float round trip, raw and ours 1+1 alternated (us)")
    for i, (r, o) in enumerate(pairs):
        print(f"pair {i}: raw {r:7.1f}  ours {o:7.1f}  ratio {o / r:.2f}")
    shared_memory(raw, results.get((1, 1)))
    bars(raw, pairs, results)
    if args.enc_pairs > 0:
        failed |= encryption(build, args.enc_pairs, args.seconds)
    if args.resend_pairs > 0:
        failed |= resend(build, args.resend_pairs, args.seconds)
    if failed:
        print("\nrun.py: a kv_bench run failed (its output is above); its "
              "rows are missing")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
