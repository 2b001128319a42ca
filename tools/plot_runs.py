#!/usr/bin/env python3
"""Validation loss against model FLOPs for several train_gpt runs, one plot.

    python3 tools/plot_runs.py --out loss.png --title TITLE LABEL=DIR [LABEL=DIR ...]

Each DIR is a train_gpt --out directory (its metrics.jsonl: one JSON line per
update with "model_flops", "train_loss" and, at evaluations, "val_loss"). The
plot shows each run's validation losses against cumulative model FLOPs, and
prints a table of the last validation loss of each run and its difference
from the first run's, in percent. Needs matplotlib (Debian:
python3-matplotlib). Exit status: 0 written, 2 bad input (the message names
the file or field), 3 matplotlib missing.
"""
import argparse
import json
import os
import sys


def read_run(path):
    """Cumulative FLOPs and validation loss at each evaluation of one run."""
    metrics = os.path.join(path, "metrics.jsonl")
    flops, points = 0.0, []
    try:
        with open(metrics) as f:
            for n, line in enumerate(f, 1):
                record = json.loads(line)
                try:
                    flops += float(record["model_flops"])
                    if record.get("val_loss") is not None:
                        points.append((flops, float(record["val_loss"])))
                except (KeyError, TypeError, ValueError) as e:
                    raise SystemExit(f"plot_runs: {metrics}:{n}: bad record ({e})") from None
    except OSError as e:
        print(f"plot_runs: cannot read {metrics}: {e}", file=sys.stderr)
        sys.exit(2)
    except json.JSONDecodeError as e:
        print(f"plot_runs: {metrics}: not JSON lines ({e})", file=sys.stderr)
        sys.exit(2)
    if not points:
        print(f"plot_runs: {metrics} has no validation loss", file=sys.stderr)
        sys.exit(2)
    return points


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--title", default="validation loss against model FLOPs")
    parser.add_argument("runs", nargs="+", metavar="LABEL=DIR")
    args = parser.parse_args()
    runs = []
    for spec in args.runs:
        if "=" not in spec:
            print(f"plot_runs: '{spec}' is not LABEL=DIR", file=sys.stderr)
            sys.exit(2)
        label, path = spec.split("=", 1)
        runs.append((label, read_run(path)))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_runs: matplotlib is not installed (apt-get install python3-matplotlib)", file=sys.stderr)
        sys.exit(3)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in runs:
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=label)
    ax.set_xlabel("model FLOPs")
    ax.set_ylabel("validation loss (nats)")
    ax.set_title(args.title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    first = runs[0][1][-1][1]
    print("| run | final val loss | vs " + runs[0][0] + " |")
    print("| --- | --- | --- |")
    for label, points in runs:
        last = points[-1][1]
        print(f"| {label} | {last:.4f} | {100.0 * (last - first) / first:+.2f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
