#!/usr/bin/env python3
"""Writes the bundled training example's forward graph, an MLP on MNIST-shaped
batches, in graph IR text: x[B,784] -> matmul+bias -> relu -> matmul+bias -> logits[B,10].
`tpusim-train-graph` (or `tpusim compile --train`) turns it into one SGD step.
Weights are seeded (He-style) random numbers written as exact fp32 bits, so the
file is the same on every machine. Usage: make_mlp_train.py OUT.ir [--batch N] [--hidden H]"""
import argparse

import numpy as np


def const(name, arr):
    bits = arr.astype(np.float32).view(np.uint32).ravel()
    shape = ",".join(str(d) for d in arr.shape)
    return f"  const %{name} : f32[{shape}] = [" + ", ".join(f"0x{b:08x}" for b in bits) + "]\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    d_in, d_h, d_out, b = 784, args.hidden, 10, args.batch
    w1 = (rng.standard_normal((d_in, d_h)) * np.sqrt(2.0 / d_in)).astype(np.float32)
    b1 = (rng.standard_normal((d_h,)) * 0.01).astype(np.float32)
    w2 = (rng.standard_normal((d_h, d_out)) * np.sqrt(1.0 / d_h)).astype(np.float32)
    b2 = (rng.standard_normal((d_out,)) * 0.01).astype(np.float32)
    text = f"graph mlp {{\n  input %x : f32[{b},{d_in}]\n"
    text += const("w1", w1) + const("b1", b1) + const("w2", w2) + const("b2", b2)
    text += (f"  %h = matmul(%x, %w1, %b1) : f32[{b},{d_h}] #0\n"
             f"  %r = relu(%h) : f32[{b},{d_h}] #1\n"
             f"  %logits = matmul(%r, %w2, %b2) : f32[{b},{d_out}] #2\n"
             "  output %logits\n}\n")
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
