#!/usr/bin/env python3
"""Checks a VRAM ladder's ladder.json (ctest runs the host ladder, then this).

Asserts what issue 'the ladder and the memory planner' promises of the table:
every rung that ran has all five measurements (peak memory total and by
category, tokens/s, loss per unit of compute, wall-clock, validation loss)
and a fit flag; the planner's predicted peak matches the measured one within
2% on the host; peak memory falls from rung 1 to 2 and from 3 (or 2, when no
accumulation was needed) to 4, as predicted; rung 6 (lean optimizer state:
8-bit moments) keeps between a quarter and 30% of the optimizer state of the
rung it continues from, keeps no master copy of bf16 weights and lowers the
peak; rung 7 (optimizer offload) keeps no optimizer state or master weights on
the device, reports host memory, and has its base rung's losses exactly; a
rung over the budget is marked as not fitting. Exit 0 when all hold, 1 with the reasons otherwise.
usage: check_ladder.py LADDER_JSON
"""
import json
import sys

CATEGORIES = ["parameters", "master_weights", "gradients", "optimizer_state", "activations", "workspace", "temporaries"]


def main(path):
    with open(path) as f:
        ladder = json.load(f)
    problems = []
    rungs = {r["name"].split()[0]: r for r in ladder["rungs"]}
    budget = ladder["budget_bytes"]
    for key in ["1", "2", "3", "4", "5"]:
        if key not in rungs:
            problems.append(f"rung {key} is missing")
    for name, r in rungs.items():
        if not r["ran"]:
            if name == "3" and r["note"].startswith("not needed"):
                continue
            problems.append(f"rung {r['name']} did not run: {r['note']}")
            continue
        peak, predicted = r["peak_bytes"], r["predicted_peak_bytes"]
        for c in CATEGORIES + ["total"]:
            if c not in peak:
                problems.append(f"rung {r['name']}: no measured peak for {c}")
        for field in ["tokens_per_second", "loss_at_equal_flops", "loss_flops_auc", "wall_clock_seconds", "val_loss"]:
            v = r.get(field)
            if not isinstance(v, (int, float)) or v != v or v <= 0:
                problems.append(f"rung {r['name']}: {field} is {v!r}")
        if abs(predicted["total"] - peak["total"]) > 0.02 * peak["total"]:
            problems.append(f"rung {r['name']}: predicted peak {predicted['total']} vs measured {peak['total']} (more than 2% apart)")
        if budget is not None and r["fits"] != (peak["total"] <= budget):
            problems.append(f"rung {r['name']}: fits = {r['fits']} but peak {peak['total']} vs budget {budget}")
        if not r["curve"]:
            problems.append(f"rung {r['name']}: no loss curve")

    def peak(key):
        r = rungs.get(key)
        return r["peak_bytes"]["total"] if r and r["ran"] else None

    def predicted(key):
        r = rungs.get(key)
        return r["predicted_peak_bytes"]["total"] if r else None

    if peak("1") is not None and peak("2") is not None and not peak("2") < peak("1"):
        problems.append(f"peak memory does not fall from rung 1 ({peak('1')}) to rung 2 ({peak('2')})")
    before_4 = "3" if rungs.get("3", {}).get("ran") else "2"
    if peak(before_4) is not None and peak("4") is not None:
        if not peak("4") < peak(before_4):
            problems.append(f"peak memory does not fall from rung {before_4} ({peak(before_4)}) to rung 4 ({peak('4')})")
        if not predicted("4") < predicted(before_4):
            problems.append("the planner does not predict the fall from rung %s to rung 4" % before_4)
    # Rung 6 keeps the configuration it continues from with lean optimizer
    # state: 8-bit codes are a quarter of fp32 moments' bytes, plus an fp32
    # absmax per 256 values and the fp32 moments of biases and norms (a few
    # percent here); and no master copy for bf16.
    r6 = rungs.get("6")
    if r6 is None:
        problems.append("rung 6 (lean optimizer state) is missing")
    else:
        base = rungs.get(r6["note"].split()[2]) if r6["note"].startswith("continues from ") else None
        if base is None:
            problems.append(f"rung 6 does not name the rung it continues from: {r6['note']!r}")
        elif r6["ran"] and base["ran"]:
            state = lambda r: r["category_peak_bytes"]["optimizer_state"]
            master = lambda r: r["category_peak_bytes"]["master_weights"]
            if not (4 * state(r6) > state(base) and state(r6) < 0.3 * state(base)):
                problems.append(f"rung 6's optimizer state {state(r6)} is not between a quarter and 30% of "
                                f"rung {base['name']}'s {state(base)}")
            if r6["precision"] == "bf16" and not (r6["master"] == "none" and master(r6) == 0):
                problems.append(f"rung 6 keeps {master(r6)} bytes of master weights for bf16 weights")
            if not peak("6") < peak(base["name"].split()[0]):
                problems.append(f"peak memory does not fall from rung {base['name']} to rung 6")
    # Rung 7 offloads the optimizer of the configuration it continues from:
    # no optimizer state or master weights on the device, the state in host
    # memory instead, and the same arithmetic: the same losses exactly.
    r7 = rungs.get("7")
    if r7 is None:
        problems.append("rung 7 (optimizer offload) is missing")
    else:
        base = rungs.get(r7["note"].split()[2]) if r7["note"].startswith("continues from ") else None
        if base is None:
            problems.append(f"rung 7 does not name the rung it continues from: {r7['note']!r}")
        elif r7["ran"] and base["ran"]:
            on_device = r7["category_peak_bytes"]["optimizer_state"] + r7["category_peak_bytes"]["master_weights"]
            if on_device != 0:
                problems.append(f"rung 7 keeps {on_device} bytes of optimizer state and master weights on the device")
            if not r7["host_peak_bytes"] or r7["host_peak_bytes"] <= 0:
                problems.append("rung 7 reports no host memory for its offloaded optimizer")
            if r7["loss_at_equal_flops"] != base["loss_at_equal_flops"] or r7["val_loss"] != base["val_loss"]:
                problems.append(f"rung 7's losses ({r7['loss_at_equal_flops']}, {r7['val_loss']}) differ from rung "
                                f"{base['name']}'s ({base['loss_at_equal_flops']}, {base['val_loss']}): offload must "
                                "not change the arithmetic")
            if not peak("7") < peak(base["name"].split()[0]):
                problems.append(f"peak memory does not fall from rung {base['name']} to rung 7")
    # The ladder draws its plots itself when matplotlib is there.
    try:
        import matplotlib  # noqa: F401
        have_matplotlib = True
    except ImportError:
        have_matplotlib = False
    if have_matplotlib:
        import os
        for png in ["loss_vs_flops.png", "loss_vs_wallclock.png", "peak_memory.png"]:
            if not os.path.isfile(os.path.join(os.path.dirname(path), png)):
                problems.append(f"matplotlib is installed but the ladder did not draw {png}")
    for p in problems:
        print("FAIL:", p)
    if not problems:
        print(f"ok: {len(rungs)} rungs; peak {peak('1')} -> {peak('2')} (rungs 1 -> 2), "
              f"{peak(before_4)} -> {peak('4')} (rungs {before_4} -> 4); predictions within 2%")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
