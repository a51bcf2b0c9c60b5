#!/usr/bin/env python3
"""Plots mnist_dist metrics (JSON lines) as an SVG: training loss and test
accuracy against wall time, one line per input file. Standard library only.

usage: plot_metrics.py METRICS.jsonl [MORE.jsonl ...] -o plot.svg
"""

import argparse
import json
import os
import sys

WIDTH, HEIGHT = 900, 360
PANEL_W, PANEL_H = 360, 250
MARGIN_L, MARGIN_T = 60, 50
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]


def load(path):
    """(loss points, accuracy points) as lists of (time, value)."""
    loss, acc = [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                sys.exit(f"plot_metrics: {path}:{number}: not JSON: {err}")
            if "loss" in rec:
                loss.append((rec["time"], rec["loss"]))
            if "accuracy" in rec:
                acc.append((rec["time"], 100.0 * rec["accuracy"]))
    return loss, acc


def ticks(lo, hi, n=5):
    if hi <= lo:
        hi = lo + 1.0
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


def panel(x0, title, ylabel, series, fixed_range=None):
    """SVG of one panel at x offset x0; series: [(label, color, points)]."""
    points = [p for _, _, pts in series for p in pts]
    out = [f'<g transform="translate({x0},{MARGIN_T})">',
           f'<text x="{PANEL_W / 2}" y="-20" text-anchor="middle" '
           f'font-size="15">{title}</text>',
           f'<rect width="{PANEL_W}" height="{PANEL_H}" fill="none" '
           f'stroke="#444"/>']
    if not points:
        out.append(f'<text x="{PANEL_W / 2}" y="{PANEL_H / 2}" '
                   f'text-anchor="middle">no data</text></g>')
        return out
    tmax = max(t for t, _ in points) or 1.0
    ylo, yhi = fixed_range or (min(v for _, v in points),
                               max(v for _, v in points))
    if yhi <= ylo:
        ylo, yhi = ylo - 1.0, yhi + 1.0

    def sx(t):
        return PANEL_W * t / tmax

    def sy(v):
        return PANEL_H * (1.0 - (v - ylo) / (yhi - ylo))

    for t in ticks(0.0, tmax):
        out.append(f'<text x="{sx(t):.1f}" y="{PANEL_H + 16}" '
                   f'text-anchor="middle" font-size="11">{t:.0f}</text>')
    for v in ticks(ylo, yhi):
        out.append(f'<text x="-6" y="{sy(v) + 4:.1f}" text-anchor="end" '
                   f'font-size="11">{v:.3g}</text>')
        out.append(f'<line x1="0" x2="{PANEL_W}" y1="{sy(v):.1f}" '
                   f'y2="{sy(v):.1f}" stroke="#ddd"/>')
    out.append(f'<text x="{PANEL_W / 2}" y="{PANEL_H + 34}" '
               f'text-anchor="middle" font-size="12">time (s)</text>')
    out.append(f'<text transform="translate(-45,{PANEL_H / 2}) rotate(-90)" '
               f'text-anchor="middle" font-size="12">{ylabel}</text>')
    for label, color, pts in series:
        if not pts:
            continue
        coords = " ".join(f"{sx(t):.1f},{sy(v):.1f}" for t, v in pts)
        out.append(f'<polyline points="{coords}" fill="none" '
                   f'stroke="{color}" stroke-width="1.5"/>')
        for t, v in pts if len(pts) < 30 else pts[-1:]:
            out.append(f'<circle cx="{sx(t):.1f}" cy="{sy(v):.1f}" r="2.5" '
                       f'fill="{color}"/>')
    out.append("</g>")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", nargs="+", help="JSON-lines metrics files")
    parser.add_argument("-o", "--output", required=True, help="SVG to write")
    args = parser.parse_args()
    loss_series, acc_series = [], []
    for i, path in enumerate(args.metrics):
        if not os.path.isfile(path):
            sys.exit(f"plot_metrics: no such file: {path}")
        loss, acc = load(path)
        label = os.path.basename(path)
        color = COLORS[i % len(COLORS)]
        loss_series.append((label, color, loss))
        acc_series.append((label, color, acc))
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
           f'height="{HEIGHT}" font-family="sans-serif">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>']
    svg += panel(MARGIN_L, "training loss", "mean NLL", loss_series)
    svg += panel(MARGIN_L + PANEL_W + 90, "test accuracy", "accuracy (%)",
                 acc_series)
    for i, (label, color, _) in enumerate(loss_series):
        y = HEIGHT - 12 - 14 * (len(loss_series) - 1 - i)
        svg.append(f'<text x="{MARGIN_L}" y="{y}" font-size="11" '
                   f'fill="{color}">{label}</text>')
    svg.append("</svg>")
    with open(args.output, "w") as f:
        f.write("\n".join(svg) + "\n")
    print(f"plot_metrics: wrote {args.output}")


if __name__ == "__main__":
    main()
