#!/usr/bin/env python3
"""Writes the bundled default model, a two-layer MLP classifier in graph IR text:
x[8,256] -> matmul+bias -> relu -> matmul -> softmax -> y[8,10].
Weights are seeded random numbers, written as exact fp32 bits, so the file is the
same on every machine. Usage: make_mlp.py OUT.graph [--batch N]"""
import argparse

import numpy as np


def const(name, arr):
    bits = arr.astype(np.float32).view(np.uint32).ravel()
    shape = ",".join(str(d) for d in arr.shape)
    return f"  const %{name} : f32[{shape}] = [" + ", ".join(f"0x{b:08x}" for b in bits) + "]\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    rng = np.random.default_rng(2026)
    d_in, d_hidden, d_out, b = 256, 512, 10, args.batch
    w1 = (rng.standard_normal((d_in, d_hidden)) / np.sqrt(d_in)).astype(np.float32)
    b1 = (rng.standard_normal((d_hidden,)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((d_hidden, d_out)) / np.sqrt(d_hidden)).astype(np.float32)
    text = f"graph mlp {{\n  input %x : f32[{b},{d_in}]\n"
    text += const("w1", w1) + const("b1", b1) + const("w2", w2)
    text += (f"  %h = matmul(%x, %w1, %b1) : f32[{b},{d_hidden}] #0\n"
             f"  %r = relu(%h) : f32[{b},{d_hidden}] #1\n"
             f"  %logits = matmul(%r, %w2) : f32[{b},{d_out}] #2\n"
             f"  %y = softmax(%logits) {{axis=1}} : f32[{b},{d_out}] #3\n"
             "  output %y\n}\n")
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
