#!/usr/bin/env python3
"""Accuracy under compression (ps/compress.h): mnist_dist -s 2 -w 2, BSP,
one epoch of full MNIST per codec, values through the sockets (PS_SHM=0:
on one host the values would otherwise go by reference, uncompressed).
Prints one line per codec and a table with the difference from the
uncompressed run. Measures and prints; never asserts.

  python3 bench/compress/accuracy.py [--build build] [--codecs LIST]
      [-- extra mnist_dist flags]

LIST is separated by spaces ("none bf16,pull=bf16 topk:0.01,pull=bf16").
"""

import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def run(args, codec, extra):
    cmd = [sys.executable, os.path.join(ROOT, "tracker", "launch.py"),
           "-s", "2", "-w", "2", "--env", "PS_SHM=0", "--timeout",
           str(args.timeout), "--",
           os.path.join(args.build, "examples", "mnist", "mnist_dist"),
           "--data_dir", args.mnist_dir, "--epochs", str(args.epochs),
           "--compress", codec, "--log_every_s", "1000"] + extra
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=args.timeout + 60)
    wall = time.monotonic() - t0
    m = re.search(r"final: test accuracy ([0-9.]+)%", p.stdout)
    if p.returncode != 0 or not m:
        sys.exit(f"accuracy: {codec}: the job failed (exit "
                 f"{p.returncode}):\n" + p.stdout[-3000:])
    return float(m.group(1)), wall


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--mnist-dir", default=os.path.join(ROOT, "data", "mnist"))
    p.add_argument("--codecs", default="none bf16,pull=bf16 "
                   "topk:0.01,pull=bf16 onebit,pull=bf16")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--timeout", type=float, default=1800, help="per job")
    p.add_argument("extra", nargs="*", help="more mnist_dist flags")
    args = p.parse_args()
    results = []
    for codec in args.codecs.split():
        acc, wall = run(args, codec, args.extra)
        print(f"compress={codec} accuracy={acc:.2f}% wall_s={wall:.0f}",
              flush=True)
        results.append((codec, acc, wall))
    base = dict((c, a) for c, a, _ in results).get("none")
    print("\n| codec | test accuracy | vs none (points) | wall s |")
    print("| --- | --- | --- | --- |")
    for codec, acc, wall in results:
        vs = f"{acc - base:+.2f}" if base is not None else "?"
        print(f"| {codec} | {acc:.2f}% | {vs} | {wall:.0f} |")


if __name__ == "__main__":
    main()
