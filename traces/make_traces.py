#!/usr/bin/python3
"""Inputs and expected outputs of the hand-written traces, computed independently
of tpusim with numpy float32 arithmetic in the order the numerics contract
(shared/spec/numerics.md) and docs/isa.md prescribe:
  * bf16 rounding written out on the bit patterns (RNE, NaN -> 0x7FC0);
  * MXU: bf16 products (exact in float32), chunk sums of R = 128 products added one
    k at a time from +0.0, chunk sums combined in increasing order;
  * lane reductions: the halving tree v[i] = v[i] (op) v[i + w], w = 64, 32, ..., 1;
  * transcendentals (exp, rsqrt, tanh, erf, log) evaluated in float64 and rounded
    once to float32, which is the contract's definition; the comparison allows a
    small ulp tolerance (file `tolerance`) for libm differences in the last double
    bit, every other op is compared bit for bit.
Run: /usr/bin/python3 traces/make_traces.py   (rewrites traces/*/in_*.npy and expected/)
"""
import math
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
f32 = np.float32


def bf16_bits(x):
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    exp = (u >> 23) & 0xFF
    frac = u & 0x7FFFFF
    nan = (exp == 0xFF) & (frac != 0)
    sub = exp == 0
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    r = np.where(sub, (u >> 16) & 0x8000, r)
    r = np.where(nan, 0x7FC0, r)
    return r.astype(np.uint16)


def bf16_to_f32(h):
    return (np.asarray(h, dtype=np.uint32) << 16).view(np.float32)


def tree_reduce(v, op):
    v = list(np.asarray(v, dtype=np.float32))
    w = len(v) // 2
    while w >= 1:
        for i in range(w):
            v[i] = op(v[i], v[i + w])
        w //= 2
    return v[0]


def fadd(a, b):
    return f32(f32(a) + f32(b))


def fmax(a, b):
    return f32(max(a, b))


def t64(fn, x):
    return np.array([f32(fn(float(v))) for v in np.asarray(x, np.float32).ravel()], dtype=np.float32).reshape(
        np.shape(x))


def save(trace, name, arr, expected=False):
    d = os.path.join(HERE, trace, "expected") if expected else os.path.join(HERE, trace)
    os.makedirs(d, exist_ok=True)
    np.save(os.path.join(d, (name if expected else "in_" + name) + ".npy"), np.ascontiguousarray(arr))


def tolerance(trace, ulp):
    with open(os.path.join(HERE, trace, "tolerance"), "w") as f:
        f.write("%d\n" % ulp)


def matmul(rng):
    M, K, N, R = 16, 512, 128, 128
    a = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    w = bf16_bits(rng.uniform(-1, 1, (K, N)).astype(np.float32))
    save("matmul", "a", a)
    save("matmul", "w", w)
    ab = bf16_to_f32(bf16_bits(a))
    wb = bf16_to_f32(w)
    acc = None
    for c in range(K // R):
        s = np.zeros((M, N), dtype=np.float32)
        for k in range(c * R, (c + 1) * R):
            p = (ab[:, k:k + 1] * wb[k:k + 1, :]).astype(np.float32)  # exact: 8x8-bit mantissas
            s = (s + p).astype(np.float32)
        acc = s if acc is None else (acc + s).astype(np.float32)
    save("matmul", "y", acc, expected=True)
    tolerance("matmul", 0)


def softmax(rng):
    x = rng.normal(0, 2, (1, 128)).astype(np.float32)
    save("softmax", "x", x)
    m = tree_reduce(x[0], fmax)
    d = (x[0] - m).astype(np.float32)
    e = t64(math.exp, d)
    s = tree_reduce(e, fadd)
    y = (e / s).astype(np.float32)
    save("softmax", "y", y.reshape(1, 128), expected=True)
    tolerance("softmax", 2)


def layernorm(rng):
    x = rng.normal(0.5, 1.5, (8, 128)).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, (128,)).astype(np.float32)
    beta = rng.uniform(-0.5, 0.5, (128,)).astype(np.float32)
    save("layernorm", "x", x)
    np.save(os.path.join(HERE, "layernorm", "gamma.npy"), gamma)
    np.save(os.path.join(HERE, "layernorm", "beta.npy"), beta)
    inv = f32(0.0078125)
    eps = f32(1e-5)
    y = np.zeros_like(x)
    for r in range(8):
        mean = f32(tree_reduce(x[r], fadd) * inv)
        d = (x[r] - mean).astype(np.float32)
        var = f32(tree_reduce((d * d).astype(np.float32), fadd) * inv)
        rs = f32(1.0 / math.sqrt(float(f32(var + eps))))
        y[r] = (((d * rs).astype(np.float32) * gamma).astype(np.float32) + beta).astype(np.float32)
    save("layernorm", "y", y, expected=True)
    tolerance("layernorm", 2)


def gather(rng):
    x = rng.uniform(-10, 10, (32, 256)).astype(np.float32)
    z = rng.uniform(-10, 10, (128, 128)).astype(np.float32)
    save("gather", "x", x)
    save("gather", "z", z)
    save("gather", "g", x[0:32:2, 64:192], expected=True)
    save("gather", "h", np.stack([x[8 * i:8 * i + 4, 0:32] for i in range(2)]), expected=True)
    save("gather", "zt", z.T.copy(), expected=True)
    tolerance("gather", 0)


def exchange(rng):
    x0 = rng.uniform(-3, 3, (8, 128)).astype(np.float32)
    x1 = rng.uniform(-3, 3, (8, 128)).astype(np.float32)
    save("exchange", "x0", x0)
    save("exchange", "x1", x1)
    s = ((x0 * x0).astype(np.float32) + (x1 * x1).astype(np.float32)).astype(np.float32)
    save("exchange", "y0", (x0 + s).astype(np.float32), expected=True)
    save("exchange", "y1", (x1 + s).astype(np.float32), expected=True)
    tolerance("exchange", 0)


def infeed(rng):
    x = rng.normal(0, 1.5, (8, 128)).astype(np.float32)
    save("infeed", "x", x)
    t = t64(math.tanh, x)
    e = t64(math.erf, x)
    save("infeed", "y", np.where(x > 0, t, e).astype(np.float32), expected=True)
    ax = np.abs(x)
    save("infeed", "r", np.sqrt(ax).astype(np.float32), expected=True)  # IEEE sqrt: correctly rounded
    save("infeed", "l", t64(math.log, (ax + f32(1)).astype(np.float32)), expected=True)
    save("infeed", "q", (f32(1) / x).astype(np.float32), expected=True)
    x100 = (x * f32(100)).astype(np.float32)
    n = np.rint(x100.astype(np.float64)).astype(np.int32)  # round half to even
    save("infeed", "n", n, expected=True)
    save("infeed", "k", (n.astype(np.float32) / f32(100)).astype(np.float32), expected=True)
    c = (bf16_to_f32(bf16_bits(x)) * f32(3)).astype(np.float32)
    save("infeed", "c", bf16_to_f32(bf16_bits(c)), expected=True)  # bf16 output widened to float32
    save("infeed", "cmax", np.tile(np.stack([tree_reduce(x[:, l], fmax) for l in range(128)]), (8, 1)), expected=True)
    fmin = lambda a, b: f32(min(a, b))
    save("infeed", "cmin", np.tile(np.stack([tree_reduce(x[:, l], fmin) for l in range(128)]), (8, 1)), expected=True)
    save("infeed", "neg", (-x).astype(np.float32), expected=True)
    tolerance("infeed", 2)


def streams(rng):
    x0 = rng.uniform(-3, 3, (8, 128)).astype(np.float32)
    x1 = rng.uniform(-3, 3, (8, 128)).astype(np.float32)
    save("streams", "x0", x0)
    save("streams", "x1", x1)
    save("streams", "y0", (x0 * x0).astype(np.float32), expected=True)
    save("streams", "y1", ((x1 * x1).astype(np.float32) + x0).astype(np.float32), expected=True)
    tolerance("streams", 0)


def main():
    rng = np.random.RandomState(20261123)
    for fn in (matmul, softmax, layernorm, gather, exchange, infeed, streams):
        fn(rng)


if __name__ == "__main__":
    main()
