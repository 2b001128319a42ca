#!/usr/bin/env python3
"""Compares two train_gpt runs: their metrics.jsonl (train loss, gradient norm,
validation loss of each update they share) and, optionally, the llm.c model
files they wrote (fp32, version 3).

  compare_runs.py A/metrics.jsonl B/metrics.jsonl --rel TOL [--from STEP]
                  [--models A.bin B.bin --mean-abs TOL]

--rel 0 asks for the same numbers exactly. Exits 1 naming the first
difference over its tolerance; prints the largest differences it found."""
import argparse
import json
import struct
import sys


def records(path, first):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {r["step"]: r for r in rows if r["step"] >= first}


def fp32_weights(path):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        if header[0] != 20240326 or header[1] != 3:
            sys.exit(f"{path}: not an llm.c fp32 model file (magic {header[0]}, version {header[1]})")
        data = f.read()
    return struct.unpack(f"<{len(data) // 4}f", data)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--rel", type=float, required=True)
    p.add_argument("--from", dest="first", type=int, default=1)
    p.add_argument("--models", nargs=2)
    p.add_argument("--mean-abs", type=float, default=0.0)
    args = p.parse_args()

    a, b = records(args.a, args.first), records(args.b, args.first)
    if sorted(a) != sorted(b) or not a:
        sys.exit(f"FAIL: the runs logged different updates: {sorted(a)} and {sorted(b)}")
    worst = 0.0
    for step in sorted(a):
        for key in ("train_loss", "grad_norm", "val_loss"):
            x, y = a[step].get(key), b[step].get(key)
            if (x is None) != (y is None):
                sys.exit(f"FAIL: update {step}: {key} is {x} in one run and {y} in the other")
            if x is None:
                continue
            rel = abs(x - y) / max(abs(x), 1e-30)
            worst = max(worst, rel)
            if rel > args.rel or (args.rel == 0 and x != y):
                sys.exit(f"FAIL: update {step}: {key} {x} vs {y} (relative {rel:.3g} > {args.rel})")
    print(f"metrics: {len(a)} updates, largest relative difference {worst:.3g} (tolerance {args.rel})")

    if args.models:
        wa, wb = fp32_weights(args.models[0]), fp32_weights(args.models[1])
        if len(wa) != len(wb):
            sys.exit(f"FAIL: the models hold {len(wa)} and {len(wb)} parameters")
        mean = sum(abs(x - y) for x, y in zip(wa, wb)) / len(wa)
        print(f"models: {len(wa)} parameters, mean absolute difference {mean:.3g} (tolerance {args.mean_abs})")
        if mean > args.mean_abs:
            sys.exit("FAIL: the models differ more than the tolerance")


if __name__ == "__main__":
    main()
