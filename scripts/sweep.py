#!/usr/bin/python3
"""Runs one workload over a grid of preset overrides and tabulates what each point measured.

usage: scripts/sweep.py WORKLOAD --preset NAME[,NAME...] [--axis KEY[+KEY...]=V1,V2,...]...
                        [--set KEY=VALUE]... [--out DIR] [--jobs N] [--random-inputs SEED]
                        [--input NAME=FILE.npy]... [--mode fast|detailed] [--max-cycles N]
                        [--compile-arg ARG]... [--plot FILE.png [--x AXIS] [--y METRIC]]
                        [--dry-run] [--tpusim PATH]

What an architect sweeping array sizes, memory bandwidth or link speeds does by hand
with `tpusim run --set`, for every point of the grid (the product of the axes, the
first axis varying slowest):

  WORKLOAD  a bundle (.tpb/.tpu, run as it is), assembly (.s, assembled once), or a
            model (.onnx or graph IR text), compiled for each point with the point's
            overrides (`tpusim compile --set`), because the bundle is built for the
            preset's MXU shape, memories and board. Points whose overrides differ only
            in keys the compiler never reads share one bundle.
  --axis    KEY=V1,V2,...: one value per point of this axis, each a `--set` value
            (a list is written in brackets: [20,20],[38,38]). KEY+KEY2=... sets
            both keys to each value (core.mxu.rows+core.mxu.cols=32,64,128).
  --preset  NAME, or NAME1,NAME2,...: the presets are then the first axis,
            "preset" (chips or boards: v3,v4,v5e), each point compiled for its own.
  --set     an override every point gets, before the axes'.
  --compile-arg ARG
            passed to every `tpusim compile` of a model, written with its value
            in one word: --compile-arg=--cores=2 --compile-arg=--precision=bf16.

Every point is checked first with `tpusim presets NAME --set ...` (the keys exist,
the values have their types, the MXU shape is one the ISA takes), so a typo stops
the sweep before anything is simulated. Each point then runs in DIR/points/NNN
(bundle, outputs, stats.json) and DIR/sweep.csv gets one row a point, in grid order:

  point, one column per axis, status (ok | compile error | bad input | fault),
  cycles, seconds, flops, mxu_utilization, hbm_bytes, hbm_utilization,
  compute, hbm_wait, infeed, sync, idle (each core's time by cause, the mean share
  over cores as the report's "mean" row), peak_flops_per_s, hbm_peak_bytes_per_s,
  error (the failing command's one-line error)

The CSV holds no host wall time, so the same sweep writes the same bytes. --plot
draws METRIC (default cycles; any numeric column) against AXIS (default the first),
one line per combination of the other axes. --jobs runs that many points at once
(each `tpusim run` is one thread; the default 1 keeps timings of the host quiet).

Exit status: 0 every point ran; 1 some point failed to compile or run (its row
says why; the CSV and the other points are still written); 2 bad options, an
unreadable workload or an override a point cannot take, with one line on stderr.
Run it with /usr/bin/python3 (Debian's matplotlib, for --plot).
"""

import argparse
import concurrent.futures
import csv
import io
import itertools
import json
import os
import shutil
import subprocess
import sys
import time

PROG = "sweep.py"

# Preset keys `tpusim compile` reads (the bundle's target in sim/cmd_compile.cpp,
# the board in hw/ici/topology.cpp, the MXU check in hw/mxu/mxu_params.cpp), by
# prefix: a point that changes none of them runs the bundle of an earlier point.
# tests/scripts/test_sweep.py checks these prefixes against those sources.
COMPILE_KEY_PREFIXES = ("core.mxu.", "core.vmem.", "core.smem.", "hbm.bytes", "cores_per_chip", "system.", "ici.links")

MODEL_SUFFIXES = (".onnx", ".ir", ".graph", ".txt")
BUNDLE_SUFFIXES = (".tpb", ".tpu")

METRICS = ["cycles", "seconds", "flops", "mxu_utilization", "hbm_bytes", "hbm_utilization", "compute", "hbm_wait",
           "infeed", "sync", "idle", "peak_flops_per_s", "hbm_peak_bytes_per_s"]


class UsageError(Exception):
    pass


def split_values(text):
    """V1,V2,... split at the commas outside brackets: [20,20],[38,38] is two values."""
    values, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            values.append(cur.strip())
            cur = ""
        else:
            cur += ch
    values.append(cur.strip())
    if depth != 0 or any(v == "" for v in values):
        raise UsageError(f"--axis values '{text}': expected V1,V2,... (a list value in brackets)")
    return values


def parse_axis(spec):
    if "=" not in spec:
        raise UsageError(f"--axis '{spec}': expected KEY[+KEY...]=V1,V2,...")
    keys, values = spec.split("=", 1)
    keys = [k.strip() for k in keys.split("+")]
    if any(not k for k in keys):
        raise UsageError(f"--axis '{spec}': an empty key")
    return {"name": "+".join(keys), "keys": keys, "values": split_values(values)}


def workload_kind(path):
    low = path.lower()
    if low.endswith(BUNDLE_SUFFIXES):
        return "bundle"
    if low.endswith(".s"):
        return "assembly"
    return "model"


def one_line(text):
    lines = [l for l in (text or "").splitlines() if l.strip()]
    return lines[0].strip() if lines else ""


def run(cmd, timeout=None):
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)


def compiles_differently(key):
    return key.startswith(COMPILE_KEY_PREFIXES)


def point_metrics(stats):
    cycles = stats["cycles"]
    seconds = stats["seconds"]
    hbm = stats["hbm"]
    moved = hbm["bytes_read"] + hbm["bytes_written"]
    peak = hbm["peak_bytes_per_s"]
    m = {
        "cycles": cycles,
        "seconds": seconds,
        "flops": stats["flops"],
        "mxu_utilization": stats["mxu_utilization"],
        "hbm_bytes": moved,
        "hbm_utilization": moved / (peak * seconds) if peak > 0 and seconds > 0 else 0.0,
        "peak_flops_per_s": stats["peak_flops_per_s"],
        "hbm_peak_bytes_per_s": peak,
    }
    # The report's "mean" row: every core's cycles by cause over cores x cycles.
    cores = stats.get("time_by_cause", {})
    total = cycles * len(cores)
    for col, cause in (("compute", "compute"), ("hbm_wait", "hbm"), ("infeed", "infeed"), ("sync", "sync"),
                       ("idle", "idle")):
        m[col] = sum(t[cause] for t in cores.values()) / total if total > 0 else 0.0
    return m


def fmt_value(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload")
    ap.add_argument("--preset", required=True)
    ap.add_argument("--axis", action="append", default=[])
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--out", default="sweep-out")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--random-inputs", type=int, default=None)
    ap.add_argument("--input", action="append", default=[], dest="inputs")
    ap.add_argument("--mode", choices=["fast", "detailed"], default="fast")
    ap.add_argument("--max-cycles", type=int, default=0)
    ap.add_argument("--compile-arg", action="append", default=[], dest="compile_args")
    ap.add_argument("--plot")
    ap.add_argument("--x")
    ap.add_argument("--y", default="cycles")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--tpusim", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "sim",
                                                     "tpusim"))
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 2

    axes = [parse_axis(s) for s in a.axis]
    presets = split_values(a.preset)
    if len(presets) > 1:
        axes.insert(0, {"name": "preset", "keys": [], "values": presets})
    names = [ax["name"] for ax in axes]
    if not axes:
        raise UsageError("nothing to sweep: give an --axis, or several presets (--preset v3,v4)")
    if len(set(names)) != len(names):
        raise UsageError("two --axis options sweep the same keys")
    if a.jobs < 1:
        raise UsageError(f"--jobs {a.jobs}: must be at least 1")
    if a.plot:
        if a.x is not None and a.x not in names:
            raise UsageError(f"--x '{a.x}' is not an axis (axes: {', '.join(names)})")
        if a.y not in METRICS:
            raise UsageError(f"--y '{a.y}' is not a metric (one of {', '.join(METRICS)})")
    if not os.path.isfile(a.workload):
        raise UsageError(f"{a.workload}: no such file")
    tpusim = a.tpusim
    if not os.access(tpusim, os.X_OK):
        raise UsageError(f"--tpusim {tpusim}: not an executable (build first: scripts/build.sh)")

    points = []
    for combo in itertools.product(*[ax["values"] for ax in axes]):
        sets = list(a.sets)
        for ax, v in zip(axes, combo):
            sets += [f"{k}={v}" for k in ax["keys"]]
        preset = combo[0] if len(presets) > 1 else presets[0]
        points.append({"index": len(points), "values": list(combo), "sets": sets, "preset": preset})

    # Every point's overrides, checked before anything runs.
    for p in points:
        r = run([tpusim, "presets", p["preset"]] + [x for s in p["sets"] for x in ("--set", s)])
        if r.returncode != 0:
            what = ", ".join([p["preset"]] + p["sets"])
            raise UsageError(f"point {p['index']} ({what}): {one_line(r.stderr) or one_line(r.stdout)}")

    if a.dry_run:
        for p in points:
            print(f"point {p['index']:03d}: --preset {p['preset']} " + " ".join("--set " + s for s in p["sets"]))
        return 0

    os.makedirs(a.out, exist_ok=True)
    pdir = os.path.join(a.out, "points")
    shutil.rmtree(pdir, ignore_errors=True)
    os.makedirs(pdir)

    kind = workload_kind(a.workload)
    shared = None
    if kind == "assembly":
        shared = os.path.join(a.out, "workload.tpb")
        r = run([tpusim, "asm", a.workload, "-o", shared])
        if r.returncode != 0:
            raise UsageError(one_line(r.stderr) or f"{a.workload}: tpusim asm failed")
    elif kind == "bundle":
        shared = a.workload

    # Models: one compile per distinct set of overrides the compiler reads.
    bundles = {}
    if kind == "model":
        for p in points:
            sets = tuple(s for s in p["sets"] if compiles_differently(s.split("=", 1)[0]))
            key = (p["preset"], sets)
            if key not in bundles:
                bundles[key] = {"path": os.path.join(pdir, f"{p['index']:03d}", "bundle.tpb"), "sets": list(sets),
                                "preset": p["preset"]}
            p["bundle"] = bundles[key]
    inputs = [x for i in a.inputs for x in ("--input", i)]
    if a.random_inputs is not None:
        inputs += ["--random-inputs", str(a.random_inputs)]

    def compile_bundle(b):
        os.makedirs(os.path.dirname(b["path"]), exist_ok=True)
        r = run([tpusim, "compile", a.workload, "--preset", b["preset"], "-o", b["path"]] +
                [x for s in b["sets"] for x in ("--set", s)] + a.compile_args)
        b["error"] = None if r.returncode == 0 else (one_line(r.stderr) or f"tpusim compile exit {r.returncode}")

    def run_point(p):
        here = os.path.join(pdir, f"{p['index']:03d}")
        os.makedirs(here, exist_ok=True)
        bundle = shared
        if kind == "model":
            if p["bundle"]["error"]:
                return {"status": "compile error", "error": p["bundle"]["error"]}
            bundle = p["bundle"]["path"]
        cmd = [tpusim, "run", bundle, "--preset", p["preset"], "--mode", a.mode, "--out", os.path.join(here, "run"), "-q",
               "--max-cycles", str(a.max_cycles)] + [x for s in p["sets"] for x in ("--set", s)] + inputs
        r = run(cmd)
        if r.returncode != 0:
            status = "fault" if r.returncode == 1 else "bad input"
            return {"status": status, "error": one_line(r.stderr) or f"tpusim run exit {r.returncode}"}
        with open(os.path.join(here, "run", "stats.json")) as f:
            stats = json.load(f)
        return {"status": "ok", "error": "", **point_metrics(stats)}

    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        list(pool.map(compile_bundle, bundles.values()))
        results = list(pool.map(run_point, points))
    wall = time.time() - t0

    header = ["point"] + names + ["status"] + METRICS + ["error"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for p, res in zip(points, results):
        w.writerow([p["index"]] + p["values"] + [res["status"]] + [fmt_value(res[m]) if m in res else "" for m in METRICS]
                   + [res["error"]])
    csv_path = os.path.join(a.out, "sweep.csv")
    write_atomic(csv_path, buf.getvalue())

    # The table on stdout: axes, status and the headline figures.
    shown = ["cycles", "mxu_utilization", "hbm_utilization"]
    rows = [[str(p["index"])] + p["values"] + [res["status"]] +
            [fmt_value(res[m]) if m in res else "-" for m in shown] for p, res in zip(points, results)]
    cols = ["point"] + names + ["status"] + shown
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(widths[i]) for i, c in enumerate(cols)))
    for r in rows:
        print("  ".join(v.ljust(widths[i]) for i, v in enumerate(r)))
    failed = [(p, res) for p, res in zip(points, results) if res["status"] != "ok"]
    for p, res in failed:
        print(f"{PROG}: point {p['index']}: {res['status']}: {res['error']}", file=sys.stderr)
    print(f"{len(points)} point(s), {len(bundles) if kind == 'model' else 0} compile(s), {wall:.1f} s wall -> {csv_path}")

    if a.plot:
        plot(a, axes, points, results)
    return 1 if failed else 0


def plot(a, axes, points, results):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xi = [ax["name"] for ax in axes].index(a.x) if a.x else 0
    xs_all = axes[xi]["values"]

    def number(v):
        try:
            return float(v)
        except ValueError:
            return None

    numeric = all(number(v) is not None for v in xs_all)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lines = {}
    for p, res in zip(points, results):
        if res["status"] != "ok":
            continue
        rest = tuple(v for i, v in enumerate(p["values"]) if i != xi)
        x = number(p["values"][xi]) if numeric else xs_all.index(p["values"][xi])
        lines.setdefault(rest, []).append((x, res[a.y]))
    others = [ax_["name"] for i, ax_ in enumerate(axes) if i != xi]
    for rest, pts in lines.items():
        pts.sort()
        label = ", ".join(f"{n}={v}" for n, v in zip(others, rest)) or None
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    if not numeric:
        ax.set_xticks(range(len(xs_all)))
        ax.set_xticklabels(xs_all)
    ax.set_xlabel(axes[xi]["name"])
    ax.set_ylabel(a.y)
    ax.set_title(f"{os.path.basename(a.workload)} on {a.preset}")
    if others:
        ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    tmp = a.plot + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, a.plot)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
