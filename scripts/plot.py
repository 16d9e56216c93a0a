#!/usr/bin/python3
"""Plots a tpusim stats.json: a roofline and a per-unit utilization chart.

usage: scripts/plot.py STATS.json [--roofline OUT.png] [--utilization OUT.png]
                       [--title TEXT] [--dpi N] [--summary]

Run it with /usr/bin/python3 (Debian's numpy and matplotlib); it draws headless
(Agg backend), so it needs no display. With neither --roofline nor --utilization
it writes roofline.png and utilization.png next to STATS.json.

What it reads (the stats.json contract: ../shared/spec/cli.md, sim/run/stats.cpp):
  clock_hz, cycles, seconds, flops, peak_flops_per_s,
  hbm.bytes_read, hbm.bytes_written, hbm.peak_bytes_per_s, units.

Roofline. The roof is min(peak_flops_per_s, I x hbm.peak_bytes_per_s) over the
arithmetic intensity I in FLOP per HBM byte; the ridge sits at
I = peak_flops_per_s / hbm.peak_bytes_per_s. The whole run is one point:
  I = flops / (hbm.bytes_read + hbm.bytes_written),  attained = flops / seconds.
When the stats carry per-op entries, every op is a point instead (the run point
is still drawn, hollow). The optional per-op schema, a top-level list:
  "ops": [{"id": 0, "name": "matmul", "flops": 2097152,
           "hbm_bytes": 163840, "cycles": 2123}, ...]
  id         integer or string, unique; labels the point
  name       string, the op's kind or graph name; points of one name share a colour
  flops      non-negative integer: FLOPs the op performed (2 per MAC)
  hbm_bytes  non-negative integer: HBM bytes it read plus wrote
  cycles     positive integer: chip cycles the op took (clock_hz converts)
  per op:    I = flops / hbm_bytes,  attained = flops / (cycles / clock_hz)
A point whose I or attained rate is 0 or infinite (no FLOPs, no HBM traffic) cannot
sit on log axes: it is drawn clipped to the axis edge as a triangle.

Utilization. For each unit in "units" that has busy_cycles or stall counters:
busy_cycles / cycles (the unit's own "cycles" counter if it has one, else the
run's), and beneath it the stall cycles over the same denominator, stacked by
reason. Stall counters are recognised in the four spellings units write:
  "stall_cycles": {"REASON": n}   "stall_cycles.REASON": n
  "stall_REASON_cycles": n        "REASON_stall_cycles": n
Busy and stalled may overlap (a busy MXU can hold a stalled op at its head), so
the two bars are drawn apart, not added.

--summary prints the numbers the figures show, one JSON object per line (an
infinite intensity is written Infinity, as Python's json reads it):
  {"point": ID or "run", "name": .., "intensity": I, "attained_flops_per_s": ..,
   "bound": "memory" | "compute"}
  {"unit": NAME, "busy": fraction or null, "stall": {"REASON": fraction}}

Exit status: 0 done; 2 a missing, unreadable or malformed stats file or bad
options, with one line on stderr naming the file and the problem.
"""

import argparse
import json
import math
import os
import re
import sys

PROG = "plot.py"


class StatsError(Exception):
    """A problem with the input file; the message names the key."""


def fail(msg):
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    sys.exit(2)


def is_number(v):
    # bool is an int in Python; JSON true is not a count.
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_count(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def require(obj, path, key, check, what):
    if not isinstance(obj, dict) or key not in obj:
        raise StatsError(f"missing key {path}{key}")
    if not check(obj[key]):
        raise StatsError(f"key {path}{key} is not {what}")
    return obj[key]


def validate(stats):
    """The checks of sim/run/stats.cpp check_stats that plotting relies on, plus the ops schema."""
    if not isinstance(stats, dict):
        raise StatsError("stats is not a JSON object")
    require(stats, "", "clock_hz", is_number, "a number")
    require(stats, "", "cycles", is_count, "an unsigned integer")
    require(stats, "", "seconds", is_number, "a number")
    require(stats, "", "flops", is_count, "an unsigned integer")
    require(stats, "", "peak_flops_per_s", is_number, "a number")
    hbm = require(stats, "", "hbm", lambda v: isinstance(v, dict), "an object")
    require(hbm, "hbm.", "bytes_read", is_count, "an unsigned integer")
    require(hbm, "hbm.", "bytes_written", is_count, "an unsigned integer")
    require(hbm, "hbm.", "peak_bytes_per_s", is_number, "a number")
    units = require(stats, "", "units", lambda v: isinstance(v, dict), "an object")
    for name, counters in units.items():
        if not isinstance(counters, dict):
            raise StatsError(f"units.{name} is not an object")
    if stats["clock_hz"] <= 0:
        raise StatsError("clock_hz is not positive")
    if stats["peak_flops_per_s"] <= 0:
        raise StatsError("peak_flops_per_s is not positive")
    if hbm["peak_bytes_per_s"] <= 0:
        raise StatsError("hbm.peak_bytes_per_s is not positive")
    if "ops" in stats:
        ops = stats["ops"]
        if not isinstance(ops, list):
            raise StatsError("key ops is not a list")
        seen = set()
        for i, op in enumerate(ops):
            where = f"ops[{i}]."
            if not isinstance(op, dict):
                raise StatsError(f"ops[{i}] is not an object")
            op_id = require(op, where, "id", lambda v: isinstance(v, str) or is_count(v), "an integer or string")
            require(op, where, "name", lambda v: isinstance(v, str), "a string")
            require(op, where, "flops", is_count, "an unsigned integer")
            require(op, where, "hbm_bytes", is_count, "an unsigned integer")
            require(op, where, "cycles", lambda v: is_count(v) and v > 0, "a positive integer")
            if op_id in seen:
                raise StatsError(f"ops[{i}].id {op_id!r} is not unique")
            seen.add(op_id)


def load(path):
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        fail(f"{path}: cannot read: {e.strerror}")
    try:
        stats = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        fail(f"{path}: not valid JSON: {e}")
    try:
        validate(stats)
    except StatsError as e:
        fail(f"{path}: not a tpusim stats file: {e}")
    return stats


# ---------------------------------------------------------------- roofline

def roofline_points(stats):
    """(label, name, intensity, attained FLOP/s, is_run) for every point to draw."""
    clock = float(stats["clock_hz"])
    hbm = stats["hbm"]
    run_bytes = hbm["bytes_read"] + hbm["bytes_written"]
    run_flops = stats["flops"]
    seconds = float(stats["seconds"]) if stats["seconds"] > 0 else stats["cycles"] / clock
    points = []
    for op in stats.get("ops", []):
        intensity = op["flops"] / op["hbm_bytes"] if op["hbm_bytes"] else math.inf
        attained = op["flops"] / (op["cycles"] / clock)
        points.append((str(op["id"]), op["name"], intensity, attained, False))
    intensity = run_flops / run_bytes if run_bytes else math.inf
    attained = run_flops / seconds if seconds > 0 else 0.0
    points.append(("run", "whole run", intensity, attained, True))
    return points


def bound_of(intensity, stats):
    ridge = stats["peak_flops_per_s"] / stats["hbm"]["peak_bytes_per_s"]
    return "compute" if intensity >= ridge else "memory"


def draw_roofline(stats, out, title, dpi):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    peak = float(stats["peak_flops_per_s"])
    bw = float(stats["hbm"]["peak_bytes_per_s"])
    ridge = peak / bw
    points = roofline_points(stats)
    has_ops = len(points) > 1

    finite_i = [p[2] for p in points if 0 < p[2] < math.inf]
    finite_y = [p[3] for p in points if 0 < p[3] < math.inf]
    x_lo = 10 ** math.floor(math.log10(min(finite_i + [ridge / 100])))
    x_hi = 10 ** math.ceil(math.log10(max(finite_i + [ridge * 100])))
    y_hi = 10 ** math.ceil(math.log10(max(finite_y + [peak * 2])))  # an op above the roof is a bug to see
    y_lo = 10 ** math.floor(math.log10(min(finite_y + [x_lo * bw, peak / 1e4])))

    fig, ax = plt.subplots(figsize=(8, 5.5))
    xs = np.logspace(math.log10(x_lo), math.log10(x_hi), 400)
    ax.plot(xs, np.minimum(peak, xs * bw), color="black", linewidth=2, zorder=2)
    ax.axvline(ridge, color="grey", linestyle=":", linewidth=1, zorder=1)
    ax.annotate(f"peak {peak / 1e12:.1f} TFLOP/s", (x_hi, peak), xytext=(-4, 4), textcoords="offset points",
                ha="right", va="bottom", fontsize=9)
    ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, y_lo), xytext=(4, 4), textcoords="offset points",
                fontsize=8, color="grey")

    def place(i, y):
        """Position on the axes; off-scale values clipped to the edge, with a marker saying so."""
        clipped = None
        if i <= 0:
            i, clipped = x_lo, "<"
        elif i == math.inf:
            i, clipped = x_hi, ">"
        if y <= 0:
            y, clipped = y_lo, "v"
        return i, y, clipped

    names = sorted({p[1] for p in points if not p[4]})
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    colour = {n: cmap(k % cmap.N) for k, n in enumerate(names)}
    labelled = set()
    annotate_ids = sum(1 for p in points if not p[4]) <= 40
    for label, name, i, y, is_run in points:
        px, py, clipped = place(i, y)
        marker = clipped if clipped else ("*" if is_run else "o")
        if is_run:
            kw = dict(s=220, facecolors="none" if has_ops else "tab:red", edgecolors="tab:red", linewidths=1.5)
            legend = "whole run"
        else:
            kw = dict(s=50, color=colour[name], edgecolors="black", linewidths=0.5)
            legend = name
        ax.scatter([px], [py], marker=marker, zorder=4, label=None if legend in labelled else legend, **kw)
        labelled.add(legend)
        if not is_run and annotate_ids:
            ax.annotate(label, (px, py), xytext=(4, 3), textcoords="offset points", fontsize=7)

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)
    # The bandwidth label lies along the slanted roof: its angle on screen
    # depends on the axes' decades, so measure it through the data transform.
    x0 = max(x_lo * 2, ridge / 1e3)
    (ax0, ay0), (ax1, ay1) = ax.transData.transform([(x0, x0 * bw), (x0 * 10, x0 * 10 * bw)])
    ax.annotate(f"HBM {bw / 1e9:.0f} GB/s", (x0, x0 * bw), xytext=(0, 5), textcoords="offset points",
                rotation=math.degrees(math.atan2(ay1 - ay0, ax1 - ax0)), rotation_mode="anchor", fontsize=9)
    ax.set_xlabel("arithmetic intensity (FLOP per HBM byte)")
    ax.set_ylabel("attained FLOP/s")
    ax.grid(True, which="major", linestyle="-", alpha=0.3)
    ax.grid(True, which="minor", linestyle=":", alpha=0.15)
    run = points[-1]
    sub = (f"{stats.get('preset', '?')}, {stats.get('mode', '?')} mode: {stats['cycles']} cycles, "
           f"{run[3] / 1e12:.3g} TFLOP/s = {run[3] / peak:.2%} of peak")
    ax.set_title((title + "\n" if title else "") + sub, fontsize=10)
    ax.legend(fontsize=8, loc="best", ncol=2 if len(labelled) > 8 else 1)
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    plt.close(fig)


# ---------------------------------------------------------------- utilization

STALL_PATTERNS = [
    re.compile(r"^stall_cycles\.(.+)$"),
    re.compile(r"^stall_(.+)_cycles$"),
    re.compile(r"^(.+)_stall_cycles$"),
]


def stall_reasons(counters):
    """{reason: cycles} from a unit's counters, in any of the spellings units use."""
    out = {}
    nested = counters.get("stall_cycles")
    if isinstance(nested, dict):
        for reason, v in nested.items():
            if is_number(v):
                out[reason] = out.get(reason, 0) + v
    for key, v in counters.items():
        if not is_number(v):
            continue
        for pat in STALL_PATTERNS:
            m = pat.match(key)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0) + v
                break
    return out


def unit_rows(stats):
    """(unit, busy fraction or None, {reason: fraction}) for each unit with busy or stall counters."""
    rows = []
    for unit in sorted(stats["units"]):
        counters = stats["units"][unit]
        denom = counters.get("cycles") if is_number(counters.get("cycles")) else stats["cycles"]
        busy = counters.get("busy_cycles")
        stalls = stall_reasons(counters)
        if not is_number(busy) and not stalls:
            continue
        if denom <= 0:
            rows.append((unit, 0.0 if is_number(busy) else None, {r: 0.0 for r in stalls}))
            continue
        rows.append((unit, busy / denom if is_number(busy) else None, {r: v / denom for r, v in stalls.items()}))
    return rows


def draw_utilization(stats, out, title, dpi, max_units=64):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = unit_rows(stats)
    dropped = 0
    if len(rows) > max_units:
        # A pod has thousands of units; keep the busiest, in name order.
        keep = sorted(rows, key=lambda r: -((r[1] or 0) + sum(r[2].values())))[:max_units]
        dropped = len(rows) - len(keep)
        rows = sorted(keep, key=lambda r: r[0])
    reasons = sorted({r for _, _, s in rows for r, v in s.items() if v > 0})
    # tab20 without its greens, which mean busy here.
    palette = [c for k, c in enumerate(plt.get_cmap("tab20").colors) if k not in (4, 5)]
    colour = {r: palette[k % len(palette)] for k, r in enumerate(reasons)}

    height = max(2.5, 0.42 * len(rows) + 1.6, 0.22 * (len(reasons) + 1) + 1.2)
    fig, ax = plt.subplots(figsize=(10.5, height))
    labelled = set()
    for k, (unit, busy, stalls) in enumerate(rows):
        y = len(rows) - 1 - k
        if busy is not None:
            ax.barh(y + 0.19, busy, height=0.36, color="tab:green", label=None if "busy" in labelled else "busy")
            labelled.add("busy")
            ax.annotate(f"{busy:.1%}", (busy, y + 0.19), xytext=(3, 0), textcoords="offset points",
                        va="center", fontsize=7)
        left = 0.0
        for reason in reasons:
            v = stalls.get(reason, 0.0)
            if v <= 0:
                continue
            lab = f"stall: {reason}"
            ax.barh(y - 0.19, v, left=left, height=0.36, color=colour[reason],
                    label=None if lab in labelled else lab)
            labelled.add(lab)
            left += v
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in reversed(rows)], fontsize=8)
    top = max([1.0] + [(b or 0) for _, b, _ in rows] + [sum(s.values()) for _, _, s in rows])
    ax.set_xlim(0, top * 1.08)
    ax.set_ylim(-0.7, max(len(rows), 1) - 0.3)
    ax.axvline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel(f"fraction of the run's {stats['cycles']} cycles (upper bar busy, lower bar stalled by reason)")
    sub = f"{stats.get('preset', '?')}, {stats.get('mode', '?')} mode: per-unit utilization"
    if dropped:
        sub += f" ({dropped} less busy units not shown)"
    if not rows:
        sub += " (no unit reports busy or stall cycles)"
    ax.set_title((title + "\n" if title else "") + sub, fontsize=10)
    if labelled:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    plt.close(fig)


# ---------------------------------------------------------------- main

def main(argv):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                 epilog=__doc__[__doc__.index("What it reads"):],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stats", help="a stats.json written by `tpusim run`")
    ap.add_argument("--roofline", metavar="OUT.png", help="write the roofline plot here")
    ap.add_argument("--utilization", metavar="OUT.png", help="write the per-unit utilization chart here")
    ap.add_argument("--title", default="", help="a first title line for both figures")
    ap.add_argument("--dpi", type=int, default=100, help="resolution of the PNGs (default 100)")
    ap.add_argument("--summary", action="store_true", help="print the plotted numbers on stdout, one JSON object per line")

    def error(message):  # argparse's own errors: one line, exit 2 (its default status too)
        fail(message)

    ap.error = error
    args = ap.parse_args(argv)
    if args.dpi < 20 or args.dpi > 600:
        fail(f"--dpi {args.dpi}: expected 20..600")
    stats = load(args.stats)
    roof, util = args.roofline, args.utilization
    if roof is None and util is None:
        base = os.path.dirname(os.path.abspath(args.stats))
        roof, util = os.path.join(base, "roofline.png"), os.path.join(base, "utilization.png")
    for out in (roof, util):
        if out is not None:
            d = os.path.dirname(os.path.abspath(out))
            if not os.path.isdir(d):
                fail(f"{out}: directory {d} does not exist")
    if args.summary:
        for label, name, i, y, _ in roofline_points(stats):
            print(json.dumps({"point": label, "name": name, "intensity": i, "attained_flops_per_s": y,
                              "bound": bound_of(i, stats)}))
        for unit, busy, stalls in unit_rows(stats):
            print(json.dumps({"unit": unit, "busy": busy, "stall": stalls}))
    try:
        if roof is not None:
            draw_roofline(stats, roof, args.title, args.dpi)
        if util is not None:
            draw_utilization(stats, util, args.title, args.dpi)
    except OSError as e:
        fail(f"{e.filename or 'output'}: cannot write: {e.strerror}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:  # `--summary | head`: the reader has what it wanted
        sys.stderr.close()
        sys.exit(0)
