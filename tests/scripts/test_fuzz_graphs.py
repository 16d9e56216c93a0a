#!/usr/bin/python3
"""scripts/fuzz_graphs.py as a user runs it: 40 rounds of seed 1 on the real tpusim
end with no finding and some bundles compiled, run and compared (so the
differential half ran); and against a stand-in tpusim whose compile errors take two
stderr lines, the script reports the findings, keeps each graph and exits 1."""
import argparse
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

# Its compile fails with two stderr lines; the graph reference succeeds.
STUB = """#!/bin/sh
[ "$1" = compile ] || exit 0
echo "one" >&2
echo "two" >&2
exit 2
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", required=True)
    ap.add_argument("--tpusim", required=True)
    a = ap.parse_args()
    fails = 0

    def report(ok, what):
        nonlocal fails
        print("%s %s" % ("ok  " if ok else "FAIL", what))
        fails += not ok

    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.run([sys.executable, a.script, a.tpusim, "--rounds", "40", "--seed", "1", "--work", f"{tmp}/real"],
                           capture_output=True, text=True)
        last = p.stdout.strip().split("\n")[-1]
        m = re.fullmatch(r"40 rounds: (\d+) bad, (\d+) compiled", last)
        report(p.returncode == 0 and m and m.group(1) == "0", f"real tpusim: exit {p.returncode}, '{last}'")
        report(m and int(m.group(2)) > 0, "some mutants compiled, ran and were compared")
        stub = f"{tmp}/tpusim"
        with open(stub, "w") as f:
            f.write(STUB)
        os.chmod(stub, os.stat(stub).st_mode | stat.S_IEXEC)
        p = subprocess.run([sys.executable, a.script, stub, "--rounds", "3", "--seed", "1", "--work", f"{tmp}/stub"],
                           capture_output=True, text=True)
        kept = sorted(d for d in os.listdir(f"{tmp}/stub") if d.startswith("bad_"))
        report(p.returncode == 1, f"stand-in tpusim: exit {p.returncode}")
        report("2 stderr lines" in p.stdout, "a two-line error is a finding")
        report(len(kept) == 3 and all(os.path.exists(f"{tmp}/stub/{d}/m.ir") for d in kept),
               f"each round's graph kept: {kept}")
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
