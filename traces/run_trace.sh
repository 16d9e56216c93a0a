#!/bin/sh
# Assembles traces/NAME/prog.s, runs it on the functional reference with the
# trace's in_*.npy inputs (with the race checker on), and compares the outputs with expected/ (bit for bit,
# or within the ulp count in NAME/tolerance for traces with transcendentals).
# Usage: run_trace.sh TPUSIM TRACE_DIR WORK_DIR
set -eu
tpusim=$1
dir=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
"$tpusim" asm "$dir/prog.s" -o "$work/prog.tpb"
set --
for f in "$dir"/in_*.npy; do
  name=$(basename "$f" .npy)
  set -- "$@" --input "${name#in_}=$f"
done
"$tpusim" ref "$work/prog.tpb" "$@" --out "$work/out" --check-races
ulp=0
[ -f "$dir/tolerance" ] && ulp=$(cat "$dir/tolerance")
"$tpusim" diff "$work/out" "$dir/expected" --max-ulp "$ulp"
# The tolerance is a ceiling; say whether the run was in fact bit exact.
if "$tpusim" diff "$work/out" "$dir/expected" >/dev/null; then echo "bit exact"; else echo "within $ulp ulp, not bit exact"; fi
