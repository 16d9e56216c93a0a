#!/usr/bin/python3
"""Differential fuzzing of the compiler, the chip model and the graph reference.

Each round takes one of a few seed graphs (every op family of the IR), mutates one
or two tokens of its text (mostly numbers: shapes, pads, strides, axes; sometimes an
op, a dtype, a tensor name, or a line deleted or doubled), then repairs the declared
result types from the verifier's own "declared type X but operands give Y" messages,
so that most mutants are valid graphs of unusual shapes rather than parse errors.
Then, with one of a few option sets (2 cores, bf16, a training step, 2 replicas):

  tpusim compile  -> 0 or exit 2 with one stderr line and no bundle left
  tpusim run      -> 0, or exit 1 for a trap the program raises on purpose
  tpusim ref      -> the graph reference: 0 or exit 2 with one stderr line
  and, where the bundle ran: run == `tpusim ref BUNDLE` bit for bit, and, without
  --train/--replicas, run == the graph reference bit for bit.

Anything else (a crash, a signal, a timeout, a second error line, a leftover
output, a difference) is kept under WORK/bad_SEED_ROUND_STEP with the graph.
Usage: fuzz_graphs.py TPUSIM [--rounds N] [--seed S] [--work DIR] [--timeout SEC]
(docs/compiler.md "Tests": what it found in session 80).
"""
import argparse
import os
import random
import re
import shutil
import subprocess

SEEDS = [
    """graph a {
  input %x : f32[4,3,8,8]
  input %w : f32[8,3,3,3]
  input %b : f32[8]
  %c = conv2d(%x, %w, %b) {dilations=[1,1], groups=1, pads=[1,1,1,1], strides=[1,1]} : f32[4,8,8,8] #0
  %r = relu(%c) : f32[4,8,8,8] #1
  %p = maxpool(%r) {kernel=[2,2], pads=[0,0,0,0], strides=[2,2]} : f32[4,8,4,4] #2
  %q = avgpool(%p) {kernel=[2,2], pads=[0,0,0,0], strides=[2,2], count_include_pad=1} : f32[4,8,2,2] #3
  %g = global_avgpool(%q) : f32[4,8,1,1] #4
  %f = flatten(%g) {axis=1} : f32[4,8] #5
  %s = softmax(%f) {axis=1} : f32[4,8] #6
  output %s
}
""",
    """graph b {
  input %x : f32[2,16,32]
  input %w : f32[32,48]
  input %gamma : f32[48]
  input %beta : f32[48]
  %h = matmul(%x, %w) : f32[2,16,48] #0
  %l = layernorm(%h, %gamma, %beta) {axis=2, epsilon=1e-05} : f32[2,16,48] #1
  %t = transpose(%l) {perm=[0,2,1]} : f32[2,48,16] #2
  %e = gelu(%t) : f32[2,48,16] #3
  %m = reduce_mean(%e) {axes=[2], keepdims=1} : f32[2,48,1] #4
  %d = sub(%e, %m) : f32[2,48,16] #5
  %r = reshape(%d) {shape=[96,16]} : f32[96,16] #6
  %s = slice(%r) {starts=[0,2], ends=[96,14], steps=[1,2]} : f32[96,6] #7
  %p = pad(%s) {pads=[1,0,1,2], value=0.5} : f32[98,8] #8
  %k = cast(%p) {to="bf16"} : bf16[98,8] #9
  output %k
}
""",
    """graph c {
  input %x : f32[6,10]
  input %i : i64[4]
  %g = gather(%x, %i) {axis=0} : f32[4,10] #0
  %y = concat(%g, %g) {axis=1} : f32[4,20] #1
  %z = clip(%y) {min=-1, max=2} : f32[4,20] #2
  %e = exp(%z) : f32[4,20] #3
  %l = log(%e) : f32[4,20] #4
  %q = pow(%l) {exponent=2} : f32[4,20] #5
  %s = sqrt(%q) : f32[4,20] #6
  %m = reduce_max(%s) {axes=[1], keepdims=0} : f32[4] #7
  %n = div(%s, %s) : f32[4,20] #8
  output %m
  output %n
}
""",
    """graph mlp {
  input %x : f32[16,300]
  input %w : f32[300,200]
  %h = matmul(%x, %w) {} : f32[16,200] #0
  %r = relu(%h) {} : f32[16,200] #1
  output %r
}
""",
]
INTS = "1 1 2 3 5 9 16 31 33 64 127 128 129 200 255 257 513 1000 65536 0 -1 -0 00 1e3 2147483647 2147483648 " \
       "-2147483648 4294967296 9223372036854775807 9223372036854775808 99999999999999999999".split()
FLOATS = "nan inf -inf 1e308 -1e-45 0 0.0 1e-40 3.4e38 -0.0".split()
OPS = ("matmul conv2d add sub mul div pow relu gelu tanh sigmoid exp log sqrt rsqrt erf neg identity clip softmax "
       "layernorm batchnorm reduce_sum reduce_mean reduce_max maxpool avgpool global_avgpool flatten transpose "
       "reshape concat slice pad gather cast relu_grad maxpool_grad reverse im2col").split()
TYPES = "f32 bf16 i64 i32 f16 u8".split()
OPTIONS = [[], ["--cores", "2"], ["--precision", "bf16"], ["--train", "sgd:lr=0.1", "--loss", "mse"],
           ["--replicas", "2"], ["--train", "sgd:lr=0.1,momentum=0.9", "--loss", "xent", "--replicas", "2"]]
TOKEN = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?|[A-Za-z_][A-Za-z_0-9]*|%[A-Za-z_0-9.]+|\S")
NUMBER = re.compile(r"-?\d+(\.\d+)?(e-?\d+)?")
MISTYPED = re.compile(r"node #\d+ \(\w+ -> (%[\w.]+)\): declared type (\S+) but operands give (\S+)")


def mutate(rng, text):
    for _ in range(rng.randint(1, 2)):
        toks = [(m.start(), m.end(), m.group()) for m in TOKEN.finditer(text)]
        if rng.random() < 0.75:
            toks = [t for t in toks if NUMBER.fullmatch(t[2])] or toks
        a, b, t = rng.choice(toks)
        k = rng.random()
        if re.fullmatch(r"-?\d+", t) and k < 0.6:
            r = rng.choice(INTS)
        elif NUMBER.fullmatch(t) and k < 0.7:
            r = rng.choice(FLOATS + INTS)
        elif t in OPS and k < 0.7:
            r = rng.choice(OPS)
        elif t in TYPES and k < 0.7:
            r = rng.choice(TYPES)
        elif t.startswith("%") and k < 0.7:
            r = rng.choice([x for _, _, x in toks if x.startswith("%")])
        elif k < 0.8:
            r = ""
        elif k < 0.9:
            r = t + " " + t
        else:
            lines = text.split("\n")
            lines.insert(rng.randrange(len(lines)), lines[rng.randrange(len(lines))])
            text = "\n".join(lines)
            continue
        text = text[:a] + r + text[b:]
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tpusim")
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", default="fuzz-work")
    ap.add_argument("--timeout", type=float, default=120, help="seconds a command may take (a busy machine needs more)")
    a = ap.parse_args()
    rng = random.Random(a.seed)

    def run(args):
        try:
            p = subprocess.run([a.tpusim] + args, capture_output=True, text=True, timeout=a.timeout,
                               stdin=subprocess.DEVNULL)
            return p.returncode, p.stderr
        except subprocess.TimeoutExpired:
            return "timeout", ""

    def repair(text, d):
        for _ in range(30):
            with open(f"{d}/m.ir", "w") as f:
                f.write(text)
            _, err = run(["ref", f"{d}/m.ir", "--out", f"{d}/probe", "--random-inputs", "1"])
            m = MISTYPED.search(err)
            if not m:
                return text
            name, declared, inferred = m.groups()
            lines = text.split("\n")
            for j, line in enumerate(lines):
                if line.strip().startswith(name + " ="):
                    lines[j] = line.replace(": " + declared, ": " + inferred)
                    break
            text = "\n".join(lines)
        return text

    bad = compiled = 0
    for i in range(a.rounds):
        d = f"{a.work}/w"
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        text = repair(mutate(rng, rng.choice(SEEDS)), d)
        with open(f"{d}/m.ir", "w") as f:
            f.write(text)
        opts = rng.choice(OPTIONS)
        steps = []  # (name, exit code, stderr, a file that must not exist after an error)
        rc, err = run(["compile", f"{d}/m.ir", "--preset", "v3", "-o", f"{d}/m.tpb"] + opts)
        steps.append(("compile", rc, err, f"{d}/m.tpb"))
        ran = False
        if rc == 0:
            compiled += 1
            rc, err = run(["run", f"{d}/m.tpb", "--preset", "v3", "--random-inputs", "1", "--out", f"{d}/run"])
            steps.append(("run", rc, err, f"{d}/run/stats.json"))
            ran = rc == 0
        prec = ["--precision", "bf16"] if "bf16" in opts else []
        rc_ref, err = run(["ref", f"{d}/m.ir", "--random-inputs", "1", "--out", f"{d}/ref"] + prec)
        steps.append(("ref", rc_ref, err, None))
        if ran:
            rc, err = run(["ref", f"{d}/m.tpb", "--random-inputs", "1", "--out", f"{d}/bref"])
            same = rc == 0 and run(["diff", f"{d}/bref", f"{d}/run"])[0] == 0
            steps.append(("bundle-ref", 0 if same else "differs", err, None))
            if rc_ref == 0 and "--train" not in opts and "--replicas" not in opts:
                steps.append(("graph-ref", 0 if run(["diff", f"{d}/ref", f"{d}/run"])[0] == 0 else "differs", "", None))
        for name, rc, err, leftover in steps:
            lines = [x for x in err.strip().split("\n") if x]
            problem = None
            if rc not in (0, 1, 2):
                problem = f"exit {rc}"
            elif rc == 1 and not (name == "run" and "trap" in err):
                problem = "exit 1"
            elif rc == 2 and len(lines) != 1:
                problem = f"{len(lines)} stderr lines"
            elif rc == 2 and leftover and os.path.exists(leftover):
                problem = "output left after an error"
            if problem:
                bad += 1
                keep = f"{a.work}/bad_{a.seed}_{i}_{name}"
                os.makedirs(keep, exist_ok=True)
                shutil.copy(f"{d}/m.ir", keep)
                with open(f"{keep}/info", "w") as f:
                    f.write(f"{problem}\n{' '.join(opts)}\n{err[-3000:]}")
                print(f"BAD round {i} {name}: {problem} ({' '.join(opts)}) {err.strip()[-300:]}", flush=True)
        if i % 100 == 0:
            print(f"round {i}: {bad} bad, {compiled} compiled", flush=True)
    print(f"{a.rounds} rounds: {bad} bad, {compiled} compiled")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
