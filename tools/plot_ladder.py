#!/usr/bin/env python3
"""Plots of snug's VRAM ladder from the ladder.json the ladder program writes.

    python3 tools/plot_ladder.py ladder.json --out DIR

writes three PNGs into DIR (created if needed):

    loss_vs_flops.png      training loss of each rung against cumulative model
                           FLOPs (log x); validation losses as markers; a
                           dotted line at the FLOPs every rung is compared at
                           (flops_for_comparison, when the JSON has it)
    loss_vs_wallclock.png  the same against wall-clock seconds
    peak_memory.png        per rung, the peak bytes by category stacked
                           (parameters, master weights, gradients, optimizer
                           state, activations, workspace, temporaries); a black
                           bar for the measured total peak, a diamond for the
                           predicted total, a dashed line at the budget. A rung
                           that did not fit is hatched and drawn from its
                           predicted bytes when it has no measured ones.

Needs matplotlib (Debian: apt-get install python3-matplotlib). Exit status:
0 written, 2 bad input (missing file, bad JSON, a missing field: the message
names it), 3 matplotlib missing.
"""
import argparse
import json
import math
import os
import sys

CATEGORIES = ["parameters", "master_weights", "gradients", "optimizer_state", "activations", "workspace",
              "temporaries"]
CATEGORY_COLORS = {  # one colour per category, the same in every plot
    "parameters": "#4c72b0", "master_weights": "#8172b3", "gradients": "#dd8452", "optimizer_state": "#c44e52",
    "activations": "#55a868", "workspace": "#937860", "temporaries": "#8c8c8c",
}


class InputError(Exception):
    pass


def need(obj, key, where, kinds=None, nullable=False):
    """obj[key], or InputError naming the field, where it is, and what was expected."""
    if not isinstance(obj, dict):
        raise InputError("%s: expected an object, got %s" % (where, type(obj).__name__))
    if key not in obj:
        raise InputError("%s: missing field '%s'" % (where, key))
    v = obj[key]
    if v is None:
        if nullable:
            return None
        raise InputError("%s: field '%s' is null" % (where, key))
    if kinds is not None and (not isinstance(v, kinds) or isinstance(v, bool) and bool not in _tuple(kinds)):
        names = "/".join(k.__name__ for k in _tuple(kinds))
        raise InputError("%s: field '%s' should be %s, got %s" % (where, key, names, json.dumps(v)[:60]))
    return v


def _tuple(kinds):
    return kinds if isinstance(kinds, tuple) else (kinds,)


NUMBER = (int, float)


def load_ladder(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise InputError("%s: cannot read: %s" % (path, e.strerror or e))
    except json.JSONDecodeError as e:
        raise InputError("%s: not valid JSON: %s" % (path, e))
    need(doc, "model", path, dict)
    rungs = need(doc, "rungs", path, list)
    if not rungs:
        raise InputError("%s: 'rungs' is empty: nothing to plot" % path)
    need(doc, "budget_bytes", path, NUMBER, nullable=True)
    for i, r in enumerate(rungs):
        where = "%s: rungs[%d]" % (path, i)
        name = need(r, "name", where, str)
        where = "%s (\"%s\")" % (where, name)
        need(r, "fits", where, bool)
        predicted = need(r, "predicted_peak_bytes", where, dict)
        need(predicted, "total", where + ".predicted_peak_bytes", NUMBER)
        peak = need(r, "peak_bytes", where, dict, nullable=True)
        if peak is not None:
            need(peak, "total", where + ".peak_bytes", NUMBER)
        for key, block in (("predicted_peak_bytes", predicted), ("peak_bytes", peak)):
            for c, v in (block or {}).items():
                if not isinstance(v, NUMBER) or isinstance(v, bool):
                    raise InputError("%s.%s: field '%s' should be a number of bytes, got %s"
                                     % (where, key, c, json.dumps(v)[:60]))
        curve = need(r, "curve", where, list)
        for j, point in enumerate(curve):
            pw = "%s.curve[%d]" % (where, j)
            need(point, "flops", pw, NUMBER)
            need(point, "wall_clock", pw, NUMBER)
            need(point, "train_loss", pw, NUMBER)
            if "val_loss" in point:
                need(point, "val_loss", pw, NUMBER, nullable=True)
    return doc


def byte_unit(max_bytes):
    """(divisor, name) so that the largest value reads comfortably: GiB from 1 GiB, MiB from 1 MiB, else KiB."""
    if max_bytes >= 1 << 30:
        return float(1 << 30), "GiB"
    if max_bytes >= 1 << 20:
        return float(1 << 20), "MiB"
    return 1024.0, "KiB"


def format_bytes(n):
    d, unit = byte_unit(n)
    v = n / d
    return ("%.1f %s" if v < 100 else "%.0f %s") % (v, unit)


def model_title(doc):
    m = doc["model"]
    parts = []
    for key, label in (("layers", "L"), ("heads", "H"), ("channels", "C"), ("vocab", "V")):
        if key in m:
            parts.append("%s %s" % (label, m[key]))
    text = "GPT " + " ".join(parts)
    if isinstance(m.get("parameters"), NUMBER):
        p = m["parameters"]
        text += " (%s parameters)" % ("%.1fM" % (p / 1e6) if p >= 1e6 else "{:,}".format(int(p)))
    if "seq" in doc:
        text += ", T %s" % doc["seq"]
    if doc.get("device"):
        text += "\n" + str(doc["device"])
    return text


def rung_colors(plt, rungs):
    cmap = plt.get_cmap("tab10" if len(rungs) <= 10 else "tab20")
    return {r["name"]: cmap(i % cmap.N) for i, r in enumerate(rungs)}


def smooth(values, window):
    """Trailing mean over `window` points (the raw curve is drawn too, faintly)."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_loss(plt, doc, colors, x_key, path, xlabel, log_x):
    fig, ax = plt.subplots(figsize=(10, 6), dpi=120)
    plotted, skipped = 0, []
    lo, hi = math.inf, -math.inf
    for r in doc["rungs"]:
        pts = [p for p in r["curve"] if p[x_key] > 0 or not log_x]
        if not pts:
            skipped.append(r["name"])
            continue
        xs = [p[x_key] for p in pts]
        ys = [p["train_loss"] for p in pts]
        c = colors[r["name"]]
        window = max(1, len(ys) // 50)
        if window > 1:  # noisy: the raw curve faint, a running mean on top
            ax.plot(xs, ys, color=c, alpha=0.25, linewidth=0.8)
            ax.plot(xs, smooth(ys, window), color=c, linewidth=1.8, label=r["name"])
        else:
            ax.plot(xs, ys, color=c, linewidth=1.6, label=r["name"], marker="." if len(ys) < 30 else None)
        val = [(p[x_key], p["val_loss"]) for p in pts if p.get("val_loss") is not None]
        if val:
            ax.plot([v[0] for v in val], [v[1] for v in val], linestyle="none", marker="o", markersize=6,
                    markerfacecolor="white", markeredgecolor=c, markeredgewidth=1.5)
        lo, hi = min(lo, min(ys)), max(hi, max(ys))
        plotted += 1
    if x_key == "flops" and isinstance(doc.get("flops_for_comparison"), NUMBER) and doc["flops_for_comparison"] > 0:
        ax.axvline(doc["flops_for_comparison"], color="0.4", linestyle=":", linewidth=1.2,
                   label="equal-FLOPs point (%.3g)" % doc["flops_for_comparison"])
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("training loss (nats / token)")
    ax.set_title(("Training loss vs model FLOPs" if x_key == "flops" else "Training loss vs wall-clock time") +
                 " — " + model_title(doc), fontsize=10)
    ax.grid(True, which="major", alpha=0.35)
    if log_x:
        ax.grid(True, which="minor", alpha=0.12)
    if plotted:
        ax.set_ylim(bottom=lo - 0.05 * (hi - lo))
        handles, labels = ax.get_legend_handles_labels()
        if any(p.get("val_loss") is not None for r in doc["rungs"] for p in r["curve"]):
            from matplotlib.lines import Line2D
            handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="white",
                                  markeredgecolor="0.3", markeredgewidth=1.5))
            labels.append("validation loss")
        ax.legend(handles, labels, fontsize=8.5, loc="upper right", framealpha=0.9)
    note = []
    if skipped:
        note.append("no curve (not run): " + ", ".join(skipped))
    if not plotted:
        ax.text(0.5, 0.5, "no rung has a loss curve", ha="center", va="center", transform=ax.transAxes)
    if note:
        fig.text(0.01, 0.01, "; ".join(note), fontsize=8, color="0.35")
    fig.tight_layout(rect=(0, 0.03 if note else 0, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def plot_memory(plt, doc, path):
    rungs = doc["rungs"]
    budget = doc.get("budget_bytes")
    # the categories present, in the tracker's order; unknown keys after them
    keys = []
    for r in rungs:
        for block in (r["predicted_peak_bytes"], r["peak_bytes"] or {}):
            for k in block:
                if k != "total" and k not in keys:
                    keys.append(k)
    keys = [k for k in CATEGORIES if k in keys] + [k for k in keys if k not in CATEGORIES]

    largest = max([r["predicted_peak_bytes"]["total"] for r in rungs] +
                  [sum(v for k, v in r["predicted_peak_bytes"].items() if k != "total") for r in rungs] +
                  [r["peak_bytes"]["total"] for r in rungs if r["peak_bytes"]] +
                  [sum(v for k, v in r["peak_bytes"].items() if k != "total") for r in rungs if r["peak_bytes"]] +
                  [budget or 0, 1])
    div, unit = byte_unit(largest)

    width = max(8.0, 1.25 * len(rungs) + 3.0)
    fig, ax = plt.subplots(figsize=(width, 6.5), dpi=120)
    xs = list(range(len(rungs)))
    bar_w = 0.62
    sums_exceed_total = False
    for x, r in zip(xs, rungs):
        measured = r["peak_bytes"] is not None
        block = r["peak_bytes"] if measured else r["predicted_peak_bytes"]
        hatch = None if r["fits"] else "///"
        alpha = 1.0 if measured else 0.45
        bottom = 0.0
        for k in keys:
            v = block.get(k, 0) / div
            if v <= 0:
                continue
            ax.bar(x, v, bar_w, bottom=bottom, color=CATEGORY_COLORS.get(k, "#cccccc"), alpha=alpha, hatch=hatch,
                   edgecolor="white" if hatch is None else "0.2", linewidth=0.6)
            bottom += v
        if measured:
            total = r["peak_bytes"]["total"] / div
            ax.plot([x - bar_w / 2 - 0.04, x + bar_w / 2 + 0.04], [total, total], color="black", linewidth=2.2,
                    solid_capstyle="butt")
            if bottom > total * 1.001:
                sums_exceed_total = True
        else:
            total = r["predicted_peak_bytes"]["total"] / div
        pred = r["predicted_peak_bytes"]["total"] / div
        ax.plot(x, pred, marker="D", markersize=7, color="black", markerfacecolor="#ffd54f", zorder=5)
        top = max(bottom, total, pred)
        label = ("%s%s" % ("" if measured else "predicted ", format_bytes(total * div)))
        if not r["fits"]:
            label = "did not fit\n" + label
        ax.annotate(label, (x, top), xytext=(0, 5), textcoords="offset points", ha="center", va="bottom",
                    fontsize=8, color="#b00020" if not r["fits"] else "0.15",
                    fontweight="bold" if not r["fits"] else "normal")

    if isinstance(budget, NUMBER) and budget > 0:
        ax.axhline(budget / div, color="#b00020", linestyle="--", linewidth=1.4, zorder=4)
        ax.annotate("budget %s" % format_bytes(budget), (0.0, budget / div), xycoords=("axes fraction", "data"),
                    xytext=(4, 3), textcoords="offset points", ha="left", va="bottom", color="#b00020",
                    fontsize=9, bbox=dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none", alpha=0.8),
                    zorder=6)
    ax.set_xticks(xs)
    ax.set_xticklabels([_wrap(r["name"], 16) for r in rungs], fontsize=8.5, rotation=0 if len(rungs) <= 8 else 30,
                       ha="center" if len(rungs) <= 8 else "right")
    ax.set_ylabel("peak memory (%s)" % unit)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.12)  # room for the labels above the bars
    ax.set_xlim(-0.6, len(rungs) - 0.4)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title("Peak memory per rung — " + model_title(doc), fontsize=10)

    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    handles = [Patch(facecolor=CATEGORY_COLORS.get(k, "#cccccc"), label=k.replace("_", " ")) for k in reversed(keys)]
    handles.append(Line2D([], [], color="black", linewidth=2.2, label="measured total peak"))
    handles.append(Line2D([], [], linestyle="none", marker="D", color="black", markerfacecolor="#ffd54f",
                          label="predicted total"))
    if isinstance(budget, NUMBER) and budget > 0:
        handles.append(Line2D([], [], color="#b00020", linestyle="--", linewidth=1.4,
                              label="budget %s" % format_bytes(budget)))
    if any(not r["fits"] for r in rungs):
        handles.append(Patch(facecolor="white", edgecolor="0.2", hatch="///", label="did not fit"))
    if any(r["peak_bytes"] is None for r in rungs):
        handles.append(Patch(facecolor="0.6", alpha=0.45, label="not run: predicted bytes"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    if sums_exceed_total:
        fig.text(0.01, 0.01, "Stacked: each category's own peak. Categories peak at different times, so a stack can "
                 "stand above the measured total peak (black bar).", fontsize=8, color="0.35")
    fig.tight_layout(rect=(0, 0.03 if sums_exceed_total else 0, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def _wrap(text, width):
    """Breaks a rung name at spaces so that tick labels stay narrow."""
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = (line + " " + word).strip()
    lines.append(line)
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description="Plots of snug's VRAM ladder (ladder.json) as PNG files.")
    p.add_argument("ladder_json", help="the ladder.json the ladder program wrote")
    p.add_argument("--out", required=True, help="folder for loss_vs_flops.png, loss_vs_wallclock.png, peak_memory.png")
    args = p.parse_args(argv)

    try:
        doc = load_ladder(args.ladder_json)
    except InputError as e:
        print("plot_ladder.py: %s" % e, file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_ladder.py: matplotlib is not installed for %s.\n"
              "  Debian/Ubuntu: apt-get install python3-matplotlib (then run with /usr/bin/python3)\n"
              "  or in a virtual environment: python3 -m venv venv && venv/bin/pip install matplotlib"
              % sys.executable, file=sys.stderr)
        return 3

    os.makedirs(args.out, exist_ok=True)
    colors = rung_colors(plt, doc["rungs"])
    written = []
    for name, draw in (
            ("loss_vs_flops.png",
             lambda path: plot_loss(plt, doc, colors, "flops", path, "model FLOPs (cumulative, log scale)", True)),
            ("loss_vs_wallclock.png",
             lambda path: plot_loss(plt, doc, colors, "wall_clock", path, "wall-clock time (s)", False)),
            ("peak_memory.png", lambda path: plot_memory(plt, doc, path))):
        path = os.path.join(args.out, name)
        tmp = path + ".tmp.png"  # written whole, then renamed: no half-written PNG
        draw(tmp)
        os.replace(tmp, path)
        written.append(path)
    print("plot_ladder.py: wrote " + ", ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
