#!/bin/sh
# Exit codes and one-line errors of tpusim asm/disasm/ref/diff (shared/spec/cli.md:
# 0 ok, 1 the simulated program faulted, 2 bad usage or input).
# Usage: cli_test.sh TPUSIM TRACES_DIR WORK_DIR
set -u
tpusim=$1
traces=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
fails=0
expect() {  # expect CODE PATTERN-IN-STDERR-OR-STDOUT command...
  code=$1
  pattern=$2
  shift 2
  "$@" >"$work/out" 2>&1
  got=$?
  if [ "$got" -ne "$code" ] || { [ -n "$pattern" ] && ! grep -q -- "$pattern" "$work/out"; }; then
    echo "FAIL: $* -> exit $got (want $code), output:"
    cat "$work/out"
    fails=$((fails + 1))
  fi
}
expect 0 "" "$tpusim" asm "$traces/softmax/prog.s" -o "$work/s.tpb"
expect 0 "vreduce.lanes.max v1, v0" "$tpusim" disasm "$work/s.tpb"
expect 2 "missing input 'x'" "$tpusim" ref "$work/s.tpb" --out "$work/o"
expect 0 "" "$tpusim" ref "$work/s.tpb" --random-inputs 7 --out "$work/o"
expect 0 "" "$tpusim" ref "$work/s.tpb" --random-inputs 7 --out "$work/o2"
expect 0 "identical: 1 file" "$tpusim" diff "$work/o" "$work/o2"
expect 1 "y.npy: .* elements differ; first at \[0, " "$tpusim" diff "$work/o" "$traces/softmax/expected"
expect 2 "has no input 'nope'" "$tpusim" ref "$work/s.tpb" --input nope=x.npy
expect 2 "expects shape \[1, 128\]" "$tpusim" ref "$work/s.tpb" --input "x=$traces/matmul/in_a.npy"
printf '  li s1, 0\n  div s2, s1, s1\n' >"$work/f.s"
expect 0 "" "$tpusim" asm "$work/f.s" -o "$work/f.tpb"
expect 1 "f.s:2, div): division by zero" "$tpusim" ref "$work/f.tpb"
printf 'l:\n  jmp l\n' >"$work/loop.s"
"$tpusim" asm "$work/loop.s" -o "$work/loop.tpb"
expect 1 "likely an infinite loop" "$tpusim" ref "$work/loop.tpb" --max-instructions 1000
printf '  vadd v1, v2\n' >"$work/bad.s"
expect 2 "bad.s:1:3: error: 'vadd' takes 3 operand(s), got 2" "$tpusim" asm "$work/bad.s" -o "$work/bad.tpb"
[ -e "$work/bad.tpb" ] && { echo "FAIL: asm left a bundle behind"; fails=$((fails + 1)); }
head -c 100 "$work/s.tpb" >"$work/cut.tpb"
expect 2 "cut.tpb: bad bundle: truncated" "$tpusim" disasm "$work/cut.tpb"
expect 2 "cut.tpb: bad bundle: truncated" "$tpusim" ref "$work/cut.tpb" --random-inputs 1
ls "$work/o" | grep -q tmp && { echo "FAIL: temporary output left"; fails=$((fails + 1)); }
[ "$fails" -eq 0 ] && echo "all CLI checks passed"
exit "$fails"
