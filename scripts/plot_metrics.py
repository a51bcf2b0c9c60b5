#!/usr/bin/python3
"""Plots mnist_dist metrics (JSON lines, --metrics_dir or --metrics_file)
with matplotlib: training loss, test accuracy and samples/s against wall
time (top row) and against the step (bottom row), one line per file (one
file per worker). The output's extension picks the format (.png, .svg,
.pdf). A NaN or infinite value (a diverged run) leaves a gap in its line.

usage: plot_metrics.py METRICS.jsonl [MORE.jsonl ...] -o plot.png

Needs matplotlib (Debian: python3-matplotlib, for /usr/bin/python3).
"""

import argparse
import json
import math
import os
import re
import sys

# A C printf of a non-finite double ("nan", "-nan", "inf") is not JSON.
NON_FINITE = re.compile(r"(?<![\w.])-?(nan|inf)(?![\w.])", re.IGNORECASE)

# (record field, panel title, y label, scale)
PANELS = [("loss", "training loss", "mean NLL", 1.0),
          ("accuracy", "test accuracy", "accuracy (%)", 100.0),
          ("samples_per_s", "throughput", "samples/s", 1.0)]


def load(path):
    """{field: [(time, step, value)]} of the file's records."""
    series = {field: [] for field, _, _, _ in PANELS}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(NON_FINITE.sub("NaN", line))
            except json.JSONDecodeError as err:
                sys.exit(f"plot_metrics: {path}:{number}: not JSON: {err}")
            for field, _, _, scale in PANELS:
                value = rec.get(field)
                if isinstance(value, (int, float)):
                    value = float(value) * scale
                    if not math.isfinite(value):
                        value = float("nan")
                    series[field].append((rec.get("time", float("nan")),
                                          rec.get("step", float("nan")),
                                          value))
    return series


def label_of(path):
    """"worker 1" for out/worker1.jsonl; else the file's name."""
    name = os.path.basename(path)
    match = re.fullmatch(r"worker(\d+)\.jsonl", name)
    return f"worker {match.group(1)}" if match else name


def plot(inputs, output):
    import matplotlib
    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(PANELS), figsize=(15, 8), squeeze=False)
    for row, (x_index, x_label) in enumerate([(0, "time (s)"), (1, "step")]):
        for col, (field, title, y_label, _) in enumerate(PANELS):
            ax = axes[row][col]
            drawn = False
            for label, series in inputs:
                points = series[field]
                if not points:
                    continue
                xs = [p[x_index] for p in points]
                ys = [p[2] for p in points]
                ax.plot(xs, ys, marker="o" if len(points) < 30 else None,
                        markersize=3, linewidth=1.5, label=label)
                drawn = True
            ax.set_title(f"{title} against {x_label.split()[0]}")
            ax.set_xlabel(x_label)
            ax.set_ylabel(y_label)
            ax.grid(True, color="#ddd")
            if drawn:
                ax.legend(fontsize="small")
            else:
                ax.text(0.5, 0.5, "no data", ha="center", va="center",
                        transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(output)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", nargs="+", help="JSON-lines metrics files")
    parser.add_argument("-o", "--output", required=True,
                        help="the plot to write (.png, .svg or .pdf)")
    args = parser.parse_args()
    inputs = []
    for path in args.metrics:
        if not os.path.isfile(path):
            sys.exit(f"plot_metrics: no such file: {path}")
        inputs.append((label_of(path), load(path)))
    try:
        plot(inputs, args.output)
    except ImportError as err:
        sys.exit(f"plot_metrics: {err}: install python3-matplotlib "
                 "(scripts/install_deps.sh) and run with /usr/bin/python3")
    print(f"plot_metrics: wrote {args.output}")


if __name__ == "__main__":
    main()
