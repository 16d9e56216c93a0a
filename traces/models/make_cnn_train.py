#!/usr/bin/env python3
"""Writes the bundled CNN training example's forward graph in graph IR text: a
ResNet-9 / DavidNet-shaped net at reduced width on CIFAR-shaped batches,
x[B,3,32,32] ->
  prep   conv3x3(3->c) relu
  layer1 conv3x3(c->2c) relu maxpool2, residual: x + relu(conv(relu(conv(x))))
  layer2 conv3x3(2c->4c) relu maxpool2
  layer3 conv3x3(4c->8c) relu maxpool2, residual as layer1
  head   global_avgpool flatten matmul(8c->10)+bias -> logits[B,10]
with c = 16 by default (DavidNet: c = 64). Batchnorm is omitted (DavidNet's BN
layers are left out rather than folded: a training step would need batch
statistics), convolutions have no bias, and the final pool is an average (DavidNet:
max). Weights are seeded He-initialised random numbers written as exact fp32 bits.
Usage: make_cnn_train.py OUT.ir [--batch N] [--width C]"""
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
    ap.add_argument("--width", type=int, default=16)
    args = ap.parse_args()
    rng = np.random.default_rng(9)
    b, c = args.batch, args.width
    consts, nodes = [], []
    nid = [0]

    def conv_w(name, cin, cout):
        w = rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))
        consts.append(const(name, w))
        return name

    def emit(out, text, shape):
        nodes.append(f"  %{out} = {text} : f32[{','.join(str(d) for d in shape)}] #{nid[0]}\n")
        nid[0] += 1
        return out

    conv_attrs = "{dilations=[1,1], groups=1, pads=[1,1,1,1], strides=[1,1]}"
    pool_attrs = "{kernel=[2,2], pads=[0,0,0,0], strides=[2,2]}"

    def conv_relu(name, x, cin, cout, hw):
        w = conv_w(name + "_w", cin, cout)
        y = emit(name, f"conv2d(%{x}, %{w}) {conv_attrs}", [b, cout, hw, hw])
        return emit(name + "_relu", f"relu(%{y})", [b, cout, hw, hw])

    def pool(name, x, ch, hw):
        return emit(name, f"maxpool(%{x}) {pool_attrs}", [b, ch, hw // 2, hw // 2])

    def residual(name, x, ch, hw):
        r = conv_relu(name + "a", x, ch, ch, hw)
        r = conv_relu(name + "b", r, ch, ch, hw)
        return emit(name, f"add(%{x}, %{r})", [b, ch, hw, hw])

    h = conv_relu("prep", "x", 3, c, 32)
    h = conv_relu("l1", h, c, 2 * c, 32)
    h = pool("l1_pool", h, 2 * c, 32)
    h = residual("res1", h, 2 * c, 16)
    h = conv_relu("l2", h, 2 * c, 4 * c, 16)
    h = pool("l2_pool", h, 4 * c, 16)
    h = conv_relu("l3", h, 4 * c, 8 * c, 8)
    h = pool("l3_pool", h, 8 * c, 8)
    h = residual("res3", h, 8 * c, 4)
    h = emit("gap", f"global_avgpool(%{h})", [b, 8 * c, 1, 1])
    h = emit("flat", f"flatten(%{h}) {{axis=1}}", [b, 8 * c])
    fc = rng.standard_normal((8 * c, 10)) * np.sqrt(1.0 / (8 * c))
    consts.append(const("fc_w", fc))
    consts.append(const("fc_b", np.zeros(10)))
    emit("logits", f"matmul(%{h}, %fc_w, %fc_b)", [b, 10])
    text = f"graph cnn {{\n  input %x : f32[{b},3,32,32]\n" + "".join(consts) + "".join(nodes)
    text += "  output %logits\n}\n"
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
