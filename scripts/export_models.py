#!/usr/bin/python3
"""ONNX models for the compiler's tests and demos (run with /usr/bin/python3: it
needs Debian's python3-torch, python3-torchvision, python3-onnx, python3-numpy).

  export_models.py models DIR [--only NAME,...]
      resnet18, resnet50, mobilenet_v2 and a BERT-base encoder layer (hidden 768,
      12 heads, seq 128), randomly initialised (no downloaded weights), exported at
      torch's default opset. Beside each NAME.onnx: NAME.input.npy and NAME.torch.npy
      (torch's fp32 output on that input).
  export_models.py ops DIR
      one-op models for every supported op, several shapes incl. ragged ones:
      CASE.onnx, CASE.in<k>.npy and CASE.expect.npy (numpy float64, from the same
      float32 inputs), plus cases.json.
  export_models.py check DIR --tool PATH [--policy default|bf16]
      runs PATH (tpusim-graph-ref) on every one-op case and compares it with the
      float64 result within the tolerance documented in docs/compiler.md
      ("Tolerances"); exit 1 listing the cases that miss.
  export_models.py bundles DIR --tpusim PATH [--policy default|bf16] [--preset v4]
                   [--run] [--cases CASE,...] [--cores N]
      the compiled path for every one-op case (docs/codegen.md, "Tests"): `tpusim
      compile [--cores N]`, the bundle on `tpusim ref --check-races` must equal `tpusim ref CASE.onnx` (the
      graph reference) bit for bit (`tpusim diff`) and the float64 result within
      the same tolerance; with --run also `tpusim run` (SystemC model, fast mode)
      bit for bit. Index inputs are given as int32 (the bundle's dtype for them).
  export_models.py model-bundles DIR --tpusim PATH [--only NAME,...] [--policy P]
                   [--preset v4] [--run]
      the same for the whole models exported by `models` (their NAME.input.npy):
      compile, bundle on `tpusim ref` ==
      `tpusim ref NAME.onnx` bit for bit, within 2% of max |torch| of torch's fp32
      output (default policy), and with --run `tpusim run` bit for bit; prints the
      wall time of every step.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np


# ----------------------------------------------------------------- whole models

def bert_layer():
    import torch
    from torch import nn

    class EncoderLayer(nn.Module):
        """BERT-base encoder layer written out so the export has static shapes (no
        Shape ops): every view uses Python ints."""

        def __init__(self, hidden=768, heads=12, ffn=3072, seq=128):
            super().__init__()
            self.h, self.nh, self.d, self.s = hidden, heads, hidden // heads, seq
            self.q, self.k, self.v = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
            self.o = nn.Linear(hidden, hidden)
            self.ln1, self.ln2 = nn.LayerNorm(hidden, eps=1e-12), nn.LayerNorm(hidden, eps=1e-12)
            self.up, self.down = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
            self.act = nn.GELU()

        def split(self, t):
            return t.view(1, self.s, self.nh, self.d).transpose(1, 2)

        def forward(self, x):
            q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d)
            ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
            ctx = ctx.transpose(1, 2).reshape(1, self.s, self.h)
            x = self.ln1(x + self.o(ctx))
            return self.ln2(x + self.down(self.act(self.up(x))))

    return EncoderLayer(), (1, 128, 768)


def build_model(name):
    import torchvision
    if name == "resnet18":
        return torchvision.models.resnet18(weights=None), (1, 3, 224, 224)
    if name == "resnet50":
        return torchvision.models.resnet50(weights=None), (1, 3, 224, 224)
    if name == "mobilenet_v2":
        return torchvision.models.mobilenet_v2(weights=None), (1, 3, 224, 224)
    if name == "bert_layer":
        return bert_layer()
    raise SystemExit(f"unknown model {name}")


def export_models(out, names):
    import torch
    torch.manual_seed(0)
    os.makedirs(out, exist_ok=True)
    for name in names:
        model, shape = build_model(name)
        model.eval()
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        path = os.path.join(out, name + ".onnx")
        with torch.no_grad():
            y = model(x)
            torch.onnx.export(model, x, path + ".tmp", input_names=["input"], output_names=["output"])
        os.replace(path + ".tmp", path)
        np.save(os.path.join(out, name + ".input.npy"), x.numpy().astype(np.float32))
        np.save(os.path.join(out, name + ".torch.npy"), y.numpy().astype(np.float32))
        print(f"exported {path}")


# ----------------------------------------------------------------- one-op models

def bf16_round(x):
    """fp32 -> bf16 -> fp32 per the contract (RNE on the upper half, FTZ)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)
    return np.where(np.abs(x) < np.float32(2.0 ** -126), np.float32(0) * np.sign(x), r).astype(np.float32)


def conv_ref(x, w, b, strides, pads, dil, groups):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.zeros((n, c, h + pads[0] + pads[2], wd + pads[1] + pads[3]))
    xp[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] = x
    oh = (h + pads[0] + pads[2] - dil[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + pads[1] + pads[3] - dil[1] * (kw - 1) - 1) // strides[1] + 1
    y = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg,
                           i * dil[0]: i * dil[0] + strides[0] * (oh - 1) + 1: strides[0],
                           j * dil[1]: j * dil[1] + strides[1] * (ow - 1) + 1: strides[1]]
                y[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, i, j])
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


def pool_ref(x, k, s, p, kind, include_pad=0):
    n, c, h, w = x.shape
    oh = (h + p[0] + p[2] - k[0]) // s[0] + 1
    ow = (w + p[1] + p[3] - k[1]) // s[1] + 1
    y = np.zeros((n, c, oh, ow))
    for a in range(oh):
        for b in range(ow):
            h0, w0 = a * s[0] - p[0], b * s[1] - p[1]
            hs, ws = slice(max(h0, 0), min(h0 + k[0], h)), slice(max(w0, 0), min(w0 + k[1], w))
            win = x[:, :, hs, ws]
            if kind == "max":
                y[:, :, a, b] = win.max(axis=(2, 3))
            else:
                cnt = k[0] * k[1] if include_pad else win.shape[2] * win.shape[3]
                y[:, :, a, b] = win.sum(axis=(2, 3)) / cnt
    return y


def erf(x):
    return np.vectorize(math.erf)(x)


class Case:
    def __init__(self, name, op, inputs, ref, attrs=None, weights=None, opset=14, tol="vpu", extra_nodes=None):
        self.name, self.op, self.inputs, self.ref = name, op, inputs, ref
        self.attrs, self.weights, self.opset, self.tol = attrs or {}, weights or {}, opset, tol
        self.extra_nodes = extra_nodes


def rnd(rng, shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def op_cases():
    rng = np.random.default_rng(7)
    cases = []
    C = cases.append
    f64 = lambda a: np.asarray(a, np.float64)

    # MXU ops: tolerance scaled by the sum of |products| (bf16 operands).
    for name, sa, sb in [("matmul_small", (4, 8), (8, 16)), ("matmul_ragged", (129, 200), (200, 70)),
                         ("matmul_batched", (2, 3, 17, 40), (2, 3, 40, 9)), ("matmul_bcast", (3, 5, 130), (130, 7)),
                         ("matmul_bcast_batch", (3, 1, 5, 40), (4, 40, 7))]:
        a, b = rnd(rng, sa), rnd(rng, sb)
        C(Case(name, "MatMul", {"a": a}, lambda i, w: (f64(i["a"]) @ f64(w["b"]), np.abs(f64(i["a"])) @ np.abs(f64(w["b"]))),
               weights={"b": b}, tol="mxu"))
    a, b, c = rnd(rng, (129, 200)), rnd(rng, (70, 200)), rnd(rng, (70,))
    C(Case("gemm_transb_bias", "Gemm", {"a": a}, lambda i, w: (f64(i["a"]) @ f64(w["b"]).T + w["c"], np.abs(f64(i["a"])) @ np.abs(f64(w["b"])).T + np.abs(w["c"])),
           attrs={"transB": 1}, weights={"b": b, "c": c}, tol="mxu"))
    a, b, c = rnd(rng, (40, 33)), rnd(rng, (40, 20)), rnd(rng, (33, 20))
    C(Case("gemm_alpha_beta_transa", "Gemm", {"a": a},
           lambda i, w: (0.5 * (f64(i["a"]).T @ f64(w["b"])) + 2.0 * w["c"], 0.5 * (np.abs(f64(i["a"])).T @ np.abs(f64(w["b"]))) + 2 * np.abs(w["c"])),
           attrs={"transA": 1, "alpha": 0.5, "beta": 2.0}, weights={"b": b, "c": c}, tol="mxu"))

    def conv_case(name, xs, ws, strides=(1, 1), pads=(0, 0, 0, 0), dil=(1, 1), groups=1, bias=True):
        x, w = rnd(rng, xs), rnd(rng, ws)
        wts = {"w": w}
        if bias:
            wts["b"] = rnd(rng, (ws[0],))
        ref = lambda i, W: (conv_ref(f64(i["x"]), f64(W["w"]), W.get("b"), strides, pads, dil, groups),
                            conv_ref(np.abs(f64(i["x"])), np.abs(f64(W["w"])), np.abs(W["b"]) if "b" in W else None, strides, pads, dil, groups))
        C(Case(name, "Conv", {"x": x}, ref, attrs={"strides": list(strides), "pads": list(pads), "dilations": list(dil), "group": groups},
               weights=wts, tol="mxu"))

    conv_case("conv3x3_pad1", (1, 3, 17, 19), (8, 3, 3, 3), pads=(1, 1, 1, 1))
    conv_case("conv_stride2_dil2_asym", (2, 5, 16, 15), (6, 5, 3, 3), strides=(2, 2), pads=(1, 2, 0, 1), dil=(2, 2), bias=False)
    conv_case("conv_groups2", (1, 6, 9, 10), (4, 3, 3, 3), pads=(1, 1, 1, 1), groups=2)
    conv_case("conv_depthwise", (1, 8, 12, 12), (8, 1, 3, 3), strides=(2, 2), pads=(1, 1, 1, 1), groups=8)
    conv_case("conv1x1_ragged_k", (1, 129, 5, 7), (200, 129, 1, 1))

    for op, fn in [("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply), ("Div", np.divide)]:
        for shapes in [((129, 200), (200,)), ((2, 3, 4, 5), (3, 1, 1))]:
            a = rnd(rng, shapes[0])
            b = rnd(rng, shapes[1], 0.5, 2.0) if op == "Div" else rnd(rng, shapes[1])
            C(Case(f"{op.lower()}_{'x'.join(map(str, shapes[0]))}", op, {"a": a, "b": b},
                   lambda i, w, fn=fn: fn(f64(i["a"]), f64(i["b"]))))
    unary = [("Relu", lambda x: np.maximum(x, 0), -2, 2), ("Tanh", np.tanh, -4, 4), ("Sigmoid", lambda x: 1 / (1 + np.exp(-x)), -8, 8),
             ("Exp", np.exp, -5, 5), ("Log", np.log, 0.01, 50), ("Sqrt", np.sqrt, 0, 50), ("Erf", erf, -3, 3),
             ("Neg", np.negative, -2, 2), ("Identity", lambda x: x, -2, 2)]
    for op, fn, lo, hi in unary:
        for shape in [(129, 200), (3, 5, 7)]:
            C(Case(f"{op.lower()}_{'x'.join(map(str, shape))}", op, {"x": rnd(rng, shape, lo, hi)}, lambda i, w, fn=fn: fn(f64(i["x"]))))
    C(Case("pow2", "Pow", {"x": rnd(rng, (129, 200))}, lambda i, w: f64(i["x"]) ** 2, weights={"e": np.array(2.0, np.float32)}))
    C(Case("pow_half", "Pow", {"x": rnd(rng, (7, 9), 0, 9)}, lambda i, w: np.sqrt(f64(i["x"])), weights={"e": np.array(0.5, np.float32)}))
    C(Case("clip_relu6", "Clip", {"x": rnd(rng, (3, 50, 7), -3, 9)}, lambda i, w: np.clip(f64(i["x"]), 0, 6),
           weights={"lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}))
    C(Case("softmax_last", "Softmax", {"x": rnd(rng, (129, 200), -6, 6)}, lambda i, w: softmax(f64(i["x"]), -1), attrs={"axis": -1}))
    C(Case("softmax_axis1", "Softmax", {"x": rnd(rng, (2, 11, 7), -6, 6)}, lambda i, w: softmax(f64(i["x"]), 1), attrs={"axis": 1}))
    C(Case("softmax_opset11_coerced", "Softmax", {"x": rnd(rng, (2, 3, 5), -6, 6)},
           lambda i, w: softmax(f64(i["x"]).reshape(2, 15), 1).reshape(2, 3, 5), attrs={"axis": 1}, opset=11))
    for op, fn in [("ReduceSum", np.sum), ("ReduceMean", np.mean), ("ReduceMax", np.max)]:
        C(Case(f"{op.lower()}_last", op, {"x": rnd(rng, (129, 200))}, lambda i, w, fn=fn: fn(f64(i["x"]), axis=-1, keepdims=True),
               attrs={"axes": [-1]}, opset=11))
        C(Case(f"{op.lower()}_mid_nokeep", op, {"x": rnd(rng, (2, 3, 4, 5))}, lambda i, w, fn=fn: fn(f64(i["x"]), axis=(1, 2)),
               attrs={"axes": [1, 2], "keepdims": 0}, opset=11))
    C(Case("reducesum_axes_input_op13", "ReduceSum", {"x": rnd(rng, (6, 300))}, lambda i, w: np.sum(f64(i["x"]), axis=0, keepdims=True),
           weights={"axes": np.array([0], np.int64)}, opset=13))
    C(Case("maxpool3x3_s2_p1", "MaxPool", {"x": rnd(rng, (1, 4, 17, 19))}, lambda i, w: pool_ref(f64(i["x"]), (3, 3), (2, 2), (1, 1, 1, 1), "max"),
           attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}))
    C(Case("avgpool2x2_s2", "AveragePool", {"x": rnd(rng, (2, 3, 10, 12))}, lambda i, w: pool_ref(f64(i["x"]), (2, 2), (2, 2), (0, 0, 0, 0), "avg"),
           attrs={"kernel_shape": [2, 2], "strides": [2, 2]}))
    for inc in (0, 1):
        C(Case(f"avgpool3x3_p1_incpad{inc}", "AveragePool", {"x": rnd(rng, (1, 3, 9, 7))},
               lambda i, w, inc=inc: pool_ref(f64(i["x"]), (3, 3), (1, 1), (1, 1, 1, 1), "avg", inc),
               attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": inc}))
    C(Case("global_avgpool", "GlobalAveragePool", {"x": rnd(rng, (1, 5, 13, 11))}, lambda i, w: f64(i["x"]).mean(axis=(2, 3), keepdims=True)))
    C(Case("transpose_nhwc", "Transpose", {"x": rnd(rng, (2, 3, 4, 5))}, lambda i, w: i["x"].transpose(0, 2, 3, 1), attrs={"perm": [0, 2, 3, 1]}))
    C(Case("transpose_2d", "Transpose", {"x": rnd(rng, (129, 200))}, lambda i, w: i["x"].T))
    C(Case("reshape", "Reshape", {"x": rnd(rng, (129, 200))}, lambda i, w: i["x"].reshape(200, 129), weights={"s": np.array([200, -1], np.int64)}))
    C(Case("flatten", "Flatten", {"x": rnd(rng, (2, 3, 4, 5))}, lambda i, w: i["x"].reshape(2, 60), attrs={"axis": 1}))
    C(Case("unsqueeze_op13", "Unsqueeze", {"x": rnd(rng, (3, 5))}, lambda i, w: i["x"].reshape(3, 1, 5), weights={"axes": np.array([1], np.int64)}, opset=13))
    C(Case("squeeze_op11", "Squeeze", {"x": rnd(rng, (3, 1, 5))}, lambda i, w: i["x"].reshape(3, 5), attrs={"axes": [1]}, opset=11))
    C(Case("concat_axis1", "Concat", {"a": rnd(rng, (2, 3, 5)), "b": rnd(rng, (2, 4, 5))},
           lambda i, w: np.concatenate([i["a"], i["b"]], axis=1), attrs={"axis": 1}))
    C(Case("slice_steps_negative", "Slice", {"x": rnd(rng, (129, 200))}, lambda i, w: i["x"][1:-3:2, 5:150:3],
           weights={"starts": np.array([1, 5], np.int64), "ends": np.array([-3, 150], np.int64), "axes": np.array([0, 1], np.int64),
                    "steps": np.array([2, 3], np.int64)}))
    C(Case("pad_constant", "Pad", {"x": rnd(rng, (3, 5, 7))},
           lambda i, w: np.pad(i["x"], ((1, 0), (2, 3), (0, 1)), constant_values=0.5),
           weights={"pads": np.array([1, 2, 0, 0, 3, 1], np.int64), "value": np.array(0.5, np.float32)}))
    C(Case("gather_embedding", "Gather", {"table_ids": rng.integers(-50, 50, size=(3, 7)).astype(np.int64)},
           lambda i, w: w["table"][i["table_ids"]], weights={"table": rnd(rng, (50, 16))}))
    C(Case("cast_float", "Cast", {"x": rnd(rng, (5, 9))}, lambda i, w: i["x"], attrs={"to": 1}))
    C(Case("cast_bf16", "Cast", {"x": rnd(rng, (129, 20))}, lambda i, w: bf16_round(i["x"]), attrs={"to": 16}, tol="exact"))
    C(Case("batchnorm", "BatchNormalization", {"x": rnd(rng, (2, 6, 5, 7))},
           lambda i, w: ((f64(i["x"]) - w["mean"].reshape(1, -1, 1, 1)) / np.sqrt(f64(w["var"]).reshape(1, -1, 1, 1) + 1e-5)
                         * w["scale"].reshape(1, -1, 1, 1) + w["bias"].reshape(1, -1, 1, 1)),
           weights={"scale": rnd(rng, (6,)), "bias": rnd(rng, (6,)), "mean": rnd(rng, (6,)), "var": rnd(rng, (6,), 0.1, 2)}))
    # More shapes of the data-movement and any-axis ops, ragged against the 8x128 tiles.
    C(Case("concat_3way_axis0", "Concat", {"a": rnd(rng, (7, 130)), "b": rnd(rng, (1, 130)), "c": rnd(rng, (5, 130))},
           lambda i, w: np.concatenate([i["a"], i["b"], i["c"]], axis=0), attrs={"axis": 0}))
    C(Case("slice_4d_steps", "Slice", {"x": rnd(rng, (2, 5, 9, 130))}, lambda i, w: i["x"][:, 1::2, 2::3, 3:129:5],
           weights={"starts": np.array([0, 1, 2, 3], np.int64), "ends": np.array([2, 5, 9, 129], np.int64),
                    "axes": np.array([0, 1, 2, 3], np.int64), "steps": np.array([1, 2, 3, 5], np.int64)}))
    C(Case("pad_4d", "Pad", {"x": rnd(rng, (1, 3, 17, 19))},
           lambda i, w: np.pad(i["x"], ((0, 0), (0, 0), (1, 3), (2, 1)), constant_values=-1.5),
           weights={"pads": np.array([0, 0, 1, 2, 0, 0, 3, 1], np.int64), "value": np.array(-1.5, np.float32)}))
    C(Case("gather_axis1", "Gather", {"table_ids": rng.integers(-9, 9, size=(2, 5)).astype(np.int64)},
           lambda i, w: np.take(w["table"], i["table_ids"], axis=1), attrs={"axis": 1}, weights={"table": rnd(rng, (4, 9, 3))}))
    C(Case("softmax_axis0_ragged", "Softmax", {"x": rnd(rng, (129, 200), -6, 6)}, lambda i, w: softmax(f64(i["x"]), 0),
           attrs={"axis": 0}))
    for op, fn in [("ReduceMean", np.mean), ("ReduceMax", np.max)]:
        C(Case(f"{op.lower()}_axis0_ragged", op, {"x": rnd(rng, (129, 200))}, lambda i, w, fn=fn: fn(f64(i["x"]), axis=0),
               attrs={"axes": [0], "keepdims": 0}, opset=11))
    C(Case("batchnorm_3d", "BatchNormalization", {"x": rnd(rng, (3, 130, 9))},
           lambda i, w: ((f64(i["x"]) - w["mean"].reshape(1, -1, 1)) / np.sqrt(f64(w["var"]).reshape(1, -1, 1) + 1e-5)
                         * w["scale"].reshape(1, -1, 1) + w["bias"].reshape(1, -1, 1)),
           weights={"scale": rnd(rng, (130,)), "bias": rnd(rng, (130,)), "mean": rnd(rng, (130,)), "var": rnd(rng, (130,), 0.1, 2)}))
    C(Case("avgpool3x2_s23_asym_incpad0", "AveragePool", {"x": rnd(rng, (2, 3, 10, 11))},
           lambda i, w: pool_ref(f64(i["x"]), (3, 2), (2, 3), (2, 1, 0, 1), "avg", 0),
           attrs={"kernel_shape": [3, 2], "strides": [2, 3], "pads": [2, 1, 0, 1], "count_include_pad": 0}))
    C(Case("maxpool2x3_s12_ragged", "MaxPool", {"x": rnd(rng, (2, 3, 7, 130))},
           lambda i, w: pool_ref(f64(i["x"]), (2, 3), (1, 2), (0, 0, 0, 0), "max"), attrs={"kernel_shape": [2, 3], "strides": [1, 2]}))
    C(Case("global_avgpool_130ch", "GlobalAveragePool", {"x": rnd(rng, (2, 130, 3, 5))},
           lambda i, w: f64(i["x"]).mean(axis=(2, 3), keepdims=True)))
    C(Case("clip_129x200", "Clip", {"x": rnd(rng, (129, 200), -3, 3)}, lambda i, w: np.clip(f64(i["x"]), -1, 0.5),
           weights={"lo": np.array(-1.0, np.float32), "hi": np.array(0.5, np.float32)}))
    C(Case("flatten_axis2", "Flatten", {"x": rnd(rng, (2, 3, 4, 5))}, lambda i, w: i["x"].reshape(6, 20), attrs={"axis": 2}))
    C(Case("layernorm_op17_3d", "LayerNormalization", {"x": rnd(rng, (3, 9, 300))},
           lambda i, w: layernorm(f64(i["x"]), w["g"], w["b"], 1e-5), attrs={"axis": -1, "epsilon": 1e-5},
           weights={"g": rnd(rng, (300,)), "b": rnd(rng, (300,))}, opset=17))
    C(Case("layernorm_op17", "LayerNormalization", {"x": rnd(rng, (4, 200))},
           lambda i, w: layernorm(f64(i["x"]), w["g"], w["b"], 1e-5), attrs={"axis": -1, "epsilon": 1e-5},
           weights={"g": rnd(rng, (200,)), "b": rnd(rng, (200,))}, opset=17))
    return cases


def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def layernorm(x, g, b, eps):
    m = x.mean(axis=-1, keepdims=True)
    v = ((x - m) ** 2).mean(axis=-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * g + b


def case_model(case, out_shape):
    import onnx
    from onnx import helper, numpy_helper, TensorProto
    inputs = []
    for n, a in case.inputs.items():
        et = TensorProto.INT64 if a.dtype == np.int64 else TensorProto.FLOAT
        inputs.append(helper.make_tensor_value_info(n, et, list(a.shape)))
    inits = [numpy_helper.from_array(a, n) for n, a in case.weights.items()]
    if case.op == "Gather":
        node_inputs = ["table", "table_ids"]
    elif case.op in ("Gemm", "MatMul", "Conv", "BatchNormalization", "LayerNormalization", "Pow", "Reshape", "Unsqueeze", "ReduceSum"):
        node_inputs = list(case.inputs) + list(case.weights)
    elif case.op == "Clip":
        node_inputs = ["x", "lo", "hi"]
    elif case.op == "Slice":
        node_inputs = ["x", "starts", "ends", "axes", "steps"]
    elif case.op == "Pad":
        node_inputs = ["x", "pads", "value"]
    else:
        node_inputs = list(case.inputs) + list(case.weights)
    node = helper.make_node(case.op, node_inputs, ["y"], name=case.name, **case.attrs)
    graph = helper.make_graph([node], case.name, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    onnx.checker.check_model(model)
    return model


def export_ops(out):
    import onnx
    os.makedirs(out, exist_ok=True)
    index = []
    for case in op_cases():
        res = case.ref(case.inputs, case.weights)
        expect, scale = res if isinstance(res, tuple) else (res, None)
        model = case_model(case, np.shape(expect))
        onnx.save(model, os.path.join(out, case.name + ".onnx"))
        for n, a in case.inputs.items():
            np.save(os.path.join(out, f"{case.name}.{n}.npy"), a)
        np.save(os.path.join(out, case.name + ".expect.npy"), np.asarray(expect, np.float64))
        if scale is not None:
            np.save(os.path.join(out, case.name + ".scale.npy"), np.asarray(scale, np.float64))
        index.append({"name": case.name, "op": case.op, "inputs": list(case.inputs), "tol": case.tol})
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(index, f, indent=1)
    print(f"{len(index)} one-op cases in {out}")


# Tolerances (docs/compiler.md, "Tolerances"): u = 2^-8 is the bf16 unit roundoff.
#  mxu:   |got - exp| <= 2u * sum_k |a_ik w_kj| (+ the same for the bias), under
#         both policies (operands enter the MXU as bf16 either way) plus 2u|exp| for
#         the bf16 store.
#  vpu:   default: |got - exp| <= 1e-5 * (|exp| + max|exp|) (fp32 arithmetic, a few
#         roundings, reductions of <= 40000 terms); bf16: 3u * (|exp| + max|exp|).
#  exact: bit-exact data movement / conversion.
def check(out, tool, policy):
    with open(os.path.join(out, "cases.json")) as f:
        index = json.load(f)
    bad = []
    for c in index:
        name = c["name"]
        with tempfile.TemporaryDirectory() as td:
            cmd = [tool, os.path.join(out, name + ".onnx"), "--policy", policy, "--out", td]
            cmd += [f"{n}={os.path.join(out, f'{name}.{n}.npy')}" for n in c["inputs"]]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                bad.append(f"{name}: tool failed: {r.stderr.strip()}")
                continue
            got = np.load(os.path.join(td, "y.npy")).astype(np.float64)
        exp = np.load(os.path.join(out, name + ".expect.npy"))
        if got.shape != exp.shape:
            bad.append(f"{name}: shape {got.shape}, expected {exp.shape}")
            continue
        err, worst = tolerance_excess(out, c, got, exp, policy)
        status = "ok" if worst <= 0 else "MISS"
        print(f"{status:4} {name:32} max|err| {float(err.max()) if err.size else 0.0:.3g}")
        if worst > 0:
            bad.append(f"{name}: max error {float(err.max()):.3g} exceeds the bound by {worst:.3g}")
    if bad:
        print("\n".join(bad), file=sys.stderr)
        return 1
    print(f"all {len(index)} cases within tolerance ({policy})")
    return 0


def tolerance_excess(out, c, got, exp, policy):
    """|got - exp| and its largest excess over the case's bound (<= 0: within)."""
    u = 2.0 ** -8
    err = np.abs(got - exp)
    if c["tol"] == "mxu":
        scale = np.load(os.path.join(out, c["name"] + ".scale.npy"))
        bound = 2 * u * scale + (2 * u * np.abs(exp) if policy == "bf16" else 0) + 1e-30
    elif c["tol"] == "exact":
        bound = np.zeros_like(exp)
    elif policy == "bf16":
        bound = 3 * u * (np.abs(exp) + np.abs(exp).max())
    else:
        bound = 1e-5 * (np.abs(exp) + np.abs(exp).max())
    if policy == "bf16" and c["tol"] != "mxu" and c["op"] in ("Identity", "Transpose", "Reshape", "Flatten", "Unsqueeze",
                                                                "Squeeze", "Concat", "Slice", "Pad", "Gather", "Cast"):
        bound = u * np.abs(exp)  # data movement of bf16-rounded inputs
    worst = float((err - bound).max()) if err.size else 0.0
    return err, worst


def bundles(out, tpusim, policy, preset, run, only, cores=1):
    """Every one-op case compiled and run; see the module docstring."""
    import time
    with open(os.path.join(out, "cases.json")) as f:
        index = json.load(f)
    if only:
        index = [c for c in index if c["name"] in only.split(",")]
    bad = []
    t0 = time.time()
    for c in index:
        name = c["name"]
        with tempfile.TemporaryDirectory() as td:
            args = []
            for n in c["inputs"]:
                a = np.load(os.path.join(out, f"{name}.{n}.npy"))
                if a.dtype == np.int64:
                    path = os.path.join(td, f"{n}.i32.npy")
                    np.save(path, a.astype(np.int32))
                else:
                    path = os.path.join(out, f"{name}.{n}.npy")
                args += ["--input", f"{n}={path}"]
            tpb = os.path.join(td, name + ".tpb")
            steps = [("compile", [tpusim, "compile", os.path.join(out, name + ".onnx"), "--preset", preset, "-o", tpb,
                                  "--precision", policy, "--cores", str(cores)]),
                     ("graph ref", [tpusim, "ref", os.path.join(out, name + ".onnx"), "--precision", policy,
                                    "--out", os.path.join(td, "graph")] + args),
                     ("bundle ref", [tpusim, "ref", tpb, "--check-races", "--out", os.path.join(td, "bundle")] + args),
                     ("diff bundle ref", [tpusim, "diff", os.path.join(td, "graph"), os.path.join(td, "bundle")])]
            if run:
                steps += [("run", [tpusim, "run", tpb, "--preset", preset, "-q", "--out", os.path.join(td, "chip")] + args),
                          ("diff run", [tpusim, "diff", os.path.join(td, "graph"), os.path.join(td, "chip")])]
            failed = None
            for what, cmd in steps:
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    failed = f"{name}: {what} failed (exit {r.returncode}): {(r.stderr.strip() or r.stdout.strip())[:400]}"
                    break
            if failed:
                print(f"FAIL {name}")
                bad.append(failed)
                continue
            got = np.load(os.path.join(td, "bundle", "y.npy")).astype(np.float64)
        exp = np.load(os.path.join(out, name + ".expect.npy"))
        if got.shape != exp.shape:
            bad.append(f"{name}: shape {got.shape}, expected {exp.shape}")
            continue
        err, worst = tolerance_excess(out, c, got, exp, policy)
        print(f"{'ok' if worst <= 0 else 'MISS':4} {name:32} bit-exact{' (ref, run)' if run else ' (ref)'}, "
              f"max|err| vs float64 {float(err.max()) if err.size else 0.0:.3g}")
        if worst > 0:
            bad.append(f"{name}: max error {float(err.max()):.3g} exceeds the bound by {worst:.3g}")
    if bad:
        print("\n".join(bad), file=sys.stderr)
        return 1
    print(f"all {len(index)} cases compiled bit-exact and within tolerance ({policy}, {preset}, {cores} core(s)"
          f"{', tpusim run too' if run else ''}; {time.time() - t0:.1f} s)")
    return 0


def model_bundles(out, tpusim, names, policy, preset, run):
    import time
    bad = []
    for name in names:
        onnx_path = os.path.join(out, name + ".onnx")
        x = os.path.join(out, name + ".input.npy")
        with tempfile.TemporaryDirectory() as td:
            tpb = os.path.join(td, name + ".tpb")
            steps = [("compile", [tpusim, "compile", onnx_path, "--preset", preset, "-o", tpb, "--precision", policy]),
                     ("graph ref", [tpusim, "ref", onnx_path, "--precision", policy, "--input", "input=" + x,
                                    "--out", os.path.join(td, "graph")]),
                     ("bundle ref", [tpusim, "ref", tpb, "--input", "input=" + x, "--out", os.path.join(td, "bundle")]),
                     ("diff", [tpusim, "diff", os.path.join(td, "graph"), os.path.join(td, "bundle")])]
            if run:
                steps += [("run", [tpusim, "run", tpb, "--preset", preset, "--input", "input=" + x,
                                   "--out", os.path.join(td, "chip")]),
                          ("diff run", [tpusim, "diff", os.path.join(td, "graph"), os.path.join(td, "chip")])]
            times = []
            for what, cmd in steps:
                t0 = time.time()
                r = subprocess.run(cmd, capture_output=True, text=True)
                times.append(f"{what} {time.time() - t0:.1f} s")
                if r.returncode != 0:
                    bad.append(f"{name}: {what} failed (exit {r.returncode}): {(r.stderr.strip() or r.stdout.strip())[:400]}")
                    break
                if what == "compile":
                    print(f"{name}: {r.stdout.strip()}")
                if what == "run":
                    print("\n".join("  " + l for l in r.stdout.strip().splitlines()))
            else:
                got = np.load(os.path.join(td, "bundle", "output.npy")).astype(np.float64)
                want = np.load(os.path.join(out, name + ".torch.npy")).astype(np.float64)
                rel = float(np.abs(got - want).max() / np.abs(want).max())
                times.append(f"max |bundle - torch| / max |torch| = {rel:.3g}")
                if policy == "default" and rel > 0.02:
                    bad.append(f"{name}: {rel:.3g} of max |torch| off torch's output (> 2%)")
            print(f"{name} ({policy}, {preset}): " + ", ".join(times), flush=True)
    if bad:
        print("\n".join(bad), file=sys.stderr)
        return 1
    print(f"all of {', '.join(names)}: bundle == graph reference bit for bit{' on tpusim ref and tpusim run' if run else ''}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["models", "ops", "check", "bundles", "model-bundles"])
    ap.add_argument("dir")
    ap.add_argument("--only", default="resnet18,resnet50,mobilenet_v2,bert_layer")
    ap.add_argument("--tool")
    ap.add_argument("--policy", default="default")
    ap.add_argument("--tpusim")
    ap.add_argument("--preset", default="v4")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--cores", type=int, default=1, help="bundles: tpusim compile --cores")
    ap.add_argument("--cases", default="", help="bundles: only these cases (comma separated)")
    a = ap.parse_args()
    if a.what == "models":
        export_models(a.dir, a.only.split(","))
    elif a.what == "ops":
        export_ops(a.dir)
    elif a.what == "model-bundles":
        if not a.tpusim:
            ap.error("model-bundles needs --tpusim")
        sys.exit(model_bundles(a.dir, a.tpusim, a.only.split(","), a.policy, a.preset, a.run))
    elif a.what == "bundles":
        if not a.tpusim:
            ap.error("bundles needs --tpusim")
        sys.exit(bundles(a.dir, a.tpusim, a.policy, a.preset, a.run, a.cases, a.cores))
    else:
        if not a.tool:
            ap.error("check needs --tool")
        sys.exit(check(a.dir, a.tool, a.policy))


if __name__ == "__main__":
    main()
