#!/usr/bin/env python3
"""One training step of the bundled examples (traces/models/make_*_train.py) by the
graph reference vs the same step in float64 by torch autograd (docs/training.md,
"Tolerance").

For each case: write the forward graph, build the step with tpusim-train-graph, run
it with the graph reference on seeded inputs, evaluate the forward graph's ops in
torch float64 (an interpreter of the IR text independent of compiler/), take the
loss and its gradients by autograd, apply the same SGD / momentum update, and
compare:
  weights: max|w_new - w_new64| <= lr * 2u * S * max|g64| + 2^-22 * max|w|
  loss:    |loss - loss64| <= 2u * F * max(1, |loss64|)
with u = 2^-8 (bf16 unit roundoff), F the forward graph's MXU ops (matmul, conv2d)
and S = 2F + 1 the MXU ops on the longest forward + backward path.
Usage: check_train_torch.py --train-graph TOOL --graph-ref TOOL --work DIR [--tpusim TPUSIM]
Exit 0 when every case holds, 1 otherwise; prints one line per tensor."""
import argparse
import os
import re
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "..", "..", "traces", "models")
U = 2.0 ** -8


def parse_ir(text):
    """The forward graph's inputs, constants (float32 arrays) and nodes."""
    consts, nodes, inputs, outputs = {}, [], [], []
    for line in text.splitlines():
        line = line.strip()
        m = re.match(r"const %(\S+) : f32\[([\d,]*)\] = \[(.*)\]$", line)
        if m:
            shape = [int(d) for d in m.group(2).split(",") if d]
            vals = np.array([int(h, 16) for h in m.group(3).split(", ")], dtype=np.uint32).view(np.float32)
            consts[m.group(1)] = vals.reshape(shape)
            continue
        m = re.match(r"input %(\S+) : f32\[([\d,]*)\]", line)
        if m:
            inputs.append((m.group(1), [int(d) for d in m.group(2).split(",")]))
            continue
        m = re.match(r"output %(\S+)", line)
        if m:
            outputs.append(m.group(1))
            continue
        m = re.match(r"%(\S+) = (\w+)\(([^)]*)\)\s*(\{[^}]*\})?\s*:", line)
        if m:
            attrs = {}
            if m.group(4):
                for k, v in re.findall(r"(\w+)=(\[[^\]]*\]|[^,}]+)", m.group(4)):
                    v = v.strip()
                    attrs[k] = [int(x) for x in v[1:-1].split(",") if x] if v.startswith("[") else float(v)
            args = [a.strip()[1:] for a in m.group(3).split(",") if a.strip()]
            nodes.append((m.group(1), m.group(2), args, attrs))
    return inputs, consts, nodes, outputs


def forward64(nodes, env, sim):
    """The forward pass in float64 with the discrete choices (ReLU's sign, maxpool's
    argmax) pinned to the simulated ones in `sim` (docs/training.md, "Tolerance")."""
    flips = 0
    for out, op, args, at in nodes:
        a = [env[x] for x in args]
        if op == "matmul":
            x, w = a[0], a[1]
            if at.get("trans_a"):
                x = x.T
            if at.get("trans_b"):
                w = w.T
            y = x @ w
            if len(a) > 2:
                y = y + a[2]
        elif op == "conv2d":
            t, l, b, r = at["pads"]
            y = F.conv2d(F.pad(a[0], (l, r, t, b)), a[1], a[2] if len(a) > 2 else None,
                         stride=tuple(at["strides"]), dilation=tuple(at["dilations"]), groups=int(at.get("groups", 1)))
        elif op == "relu":
            mask = torch.tensor(sim[args[0]] > 0)
            flips += int((mask != (a[0] > 0)).sum())
            y = a[0] * mask
        elif op == "add":
            y = a[0] + a[1]
        elif op == "sub":
            y = a[0] - a[1]
        elif op == "maxpool":
            assert not any(at["pads"])
            (kh, kw), (sh, sw) = at["kernel"], at["strides"]
            xs, ys = sim[args[0]], sim[out]
            n, c, h, w = xs.shape
            oh, ow = ys.shape[2], ys.shape[3]
            flat = np.zeros((n, c, oh, ow), dtype=np.int64)
            plane = (np.arange(n)[:, None] * c + np.arange(c)[None, :])[:, :, None, None] * h * w
            found = np.zeros((n, c, oh, ow), dtype=bool)
            for i in range(kh):  # the first tap equal to the max, row-major
                for j in range(kw):
                    tap = xs[:, :, i:i + sh * oh:sh, j:j + sw * ow:sw]
                    hit = (tap == ys) & ~found
                    rows = (np.arange(oh) * sh + i)[:, None] * w + (np.arange(ow) * sw + j)[None, :]
                    flat = np.where(hit, plane + rows[None, None], flat)
                    found |= hit
            assert found.all()
            y = a[0].reshape(-1)[torch.tensor(flat.reshape(-1))].reshape(n, c, oh, ow)
            flips += int((F.max_pool2d(a[0], (kh, kw), (sh, sw)) != y).sum())
        elif op == "global_avgpool":
            y = a[0].mean(dim=(2, 3), keepdim=True)
        elif op == "flatten":
            y = a[0].reshape(a[0].shape[0], -1)
        elif op == "tanh":
            y = torch.tanh(a[0])
        elif op == "sigmoid":
            y = torch.sigmoid(a[0])
        elif op == "mul":
            y = a[0] * a[1]
        elif op == "div":
            y = a[0] / a[1]
        elif op == "neg":
            y = -a[0]
        elif op == "softmax":
            y = torch.softmax(a[0], dim=int(at["axis"]))
        else:
            raise SystemExit(f"check_train_torch: op {op} not in this checker")
        env[out] = y
    return env, flips


def write_smooth(path, batch):
    """tanh, a learned scale, softmax mid-graph, sigmoid, neg, div by a rank-0
    constant: the elementwise and row ops with gradient recipes."""
    rng = np.random.default_rng(12)

    def const(name, arr):
        bits = np.asarray(arr, dtype=np.float32).view(np.uint32).ravel()
        return (f"  const %{name} : f32[{','.join(str(d) for d in np.shape(arr))}] = ["
                + ", ".join(f"0x{b:08x}" for b in bits) + "]\n")
    text = f"graph smooth {{\n  input %x : f32[{batch},784]\n"
    text += const("w1", rng.standard_normal((784, 32)) * 0.05) + const("b1", rng.standard_normal(32) * 0.1)
    text += const("s", 0.5 + rng.random(32)) + const("w2", rng.standard_normal((32, 16)) * 0.3)
    text += const("w3", rng.standard_normal((16, 10)) * 2.0) + "  const %two : f32[] = [0x40000000]\n"
    b = batch
    text += (f"  %h = matmul(%x, %w1, %b1) : f32[{b},32] #0\n  %t = tanh(%h) : f32[{b},32] #1\n"
             f"  %u = mul(%t, %s) : f32[{b},32] #2\n  %v = matmul(%u, %w2) : f32[{b},16] #3\n"
             f"  %p = softmax(%v) {{axis=1}} : f32[{b},16] #4\n  %q = matmul(%p, %w3) : f32[{b},10] #5\n"
             f"  %g = sigmoid(%q) : f32[{b},10] #6\n  %n = neg(%g) : f32[{b},10] #7\n"
             f"  %z = div(%n, %two) : f32[{b},10] #8\n  output %z\n}}\n")
    open(path, "w").write(text)


def run_case(args, name, script, script_args, train, loss, seed, replicas=1):
    """replicas > 1: the step is compiled for that many replicas of a v3-8 board and
    its bundle run on the functional reference (tpusim ref), the float64 step is
    still the whole batch's."""
    work = os.path.join(args.work, name)
    os.makedirs(work, exist_ok=True)
    fwd, step = os.path.join(work, "fwd.ir"), os.path.join(work, "train.ir")
    if script == "smooth":
        write_smooth(fwd, int(script_args[1]))
    else:
        subprocess.run([sys.executable, os.path.join(MODELS, script), fwd] + script_args, check=True)
    subprocess.run([args.train_graph, fwd, "-o", step, "--train", train, "--loss", loss, "--replicas", str(replicas)],
                   check=True, stdout=subprocess.DEVNULL)
    inputs, consts, nodes, outputs = parse_ir(open(fwd).read())
    (xname, xshape), = inputs
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xshape).astype(np.float32)
    pred_node = nodes[-1]
    if pred_node[1] == "softmax" and loss.startswith("xent"):
        nodes = nodes[:-1]
    pred = nodes[-1][0]
    B = xshape[0]
    if loss == "xent":
        labels = np.eye(10, dtype=np.float32)[rng.integers(0, 10, B)]
    elif loss == "xent-index":
        labels = rng.integers(0, 10, B).astype(np.float32)
    else:
        labels = rng.standard_normal((B, 10)).astype(np.float32)
    np.save(os.path.join(work, "x.npy"), x)
    np.save(os.path.join(work, "labels.npy"), labels)
    # The reference also writes the forward tensors whose discrete choices are pinned.
    pinned = sorted({a for _, op, args_, _ in nodes if op in ("relu", "maxpool") for a in args_[:1]} |
                    {o for o, op, _, _ in nodes if op == "maxpool"})
    text = open(step).read().rstrip()
    assert text.endswith("}")
    open(step + ".pinned", "w").write(text[:-1] + "".join(f"  output %{t}\n" for t in pinned) + "}\n")
    out = os.path.join(work, "ref")
    os.makedirs(out, exist_ok=True)
    if replicas == 1:
        subprocess.run([args.graph_ref, step + ".pinned", "--out", out, f"{xname}=" + os.path.join(work, "x.npy"),
                        "labels=" + os.path.join(work, "labels.npy")], check=True, stdout=subprocess.DEVNULL)
    else:
        bundle = os.path.join(work, "step.tpb")
        subprocess.run([args.tpusim, "compile", step + ".pinned", "--preset", "v3-8", "--replicas", str(replicas),
                        "-o", bundle], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([args.tpusim, "ref", bundle, "--out", out, "--input", f"{xname}=" + os.path.join(work, "x.npy"),
                        "--input", "labels=" + os.path.join(work, "labels.npy")], check=True, stdout=subprocess.DEVNULL)
    sim = {t: np.load(os.path.join(out, t + ".npy")) for t in pinned}
    env = {xname: torch.tensor(x, dtype=torch.float64)}
    # Parameters: constants of rank >= 1 (as compiler/train picks them); scalars are op constants.
    params = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in consts.items() if v.ndim >= 1}
    env.update({k: torch.tensor(v, dtype=torch.float64) for k, v in consts.items() if v.ndim == 0})
    env.update(params)
    env, flips = forward64(nodes, env, sim)
    z = env[pred]
    assert z.shape[1] == 10, "the bundled examples have 10 outputs"
    if loss == "xent":
        t = torch.tensor(labels, dtype=torch.float64)
        L = -(t * torch.log_softmax(z, dim=1)).sum() / B
    elif loss == "xent-index":
        L = F.cross_entropy(z, torch.tensor(labels, dtype=torch.long), reduction="mean")
    else:
        L = ((z - torch.tensor(labels, dtype=torch.float64)) ** 2).sum() / (B * 10)
    L.backward()
    lr = float(re.search(r"lr=([^,]+)", train).group(1))
    mm = re.search(r"momentum=([^,]+)", train)
    fwd_mxu = sum(1 for n in nodes if n[1] in ("matmul", "conv2d"))
    S = 2 * fwd_mxu + 1
    ok = True
    print(f"{name:22s} {flips} ReLU sign / maxpool argmax decision(s) of float64 differ from the simulated ones "
          f"(pinned to the simulated)")
    loss_sim = float(np.load(os.path.join(out, "loss.npy")).ravel()[0])
    loss64 = float(L.item())
    bound = 2 * U * fwd_mxu * max(1.0, abs(loss64))
    good = abs(loss_sim - loss64) <= bound
    ok &= good
    print(f"{name:22s} loss       |{loss_sim:.6f} - {loss64:.6f}| = {abs(loss_sim - loss64):.2e} <= {bound:.2e} "
          f"{'ok' if good else 'FAIL'}")
    for k, p in params.items():
        g64 = p.grad.numpy()
        w = consts[k].astype(np.float64)
        # First momentum step from a zero velocity: v = g, the same update as SGD.
        w_new64 = w - lr * g64
        w_new = np.load(os.path.join(out, k + ".new.npy")).astype(np.float64)
        err = np.abs(w_new - w_new64).max()
        gscale = np.abs(g64).max()
        bound = lr * 2 * U * S * gscale + 2.0 ** -22 * np.abs(w).max()
        # The same error as a fraction of the update: how well the gradient is computed.
        rel = err / (lr * gscale) if gscale > 0 else 0.0
        good = err <= bound
        ok &= good
        print(f"{name:22s} {k + '.new':10s} max err {err:.2e} <= {bound:.2e} ({rel * 100:.3f}% of lr*max|g|) "
              f"{'ok' if good else 'FAIL'}")
        if mm:
            v = np.load(os.path.join(out, k + ".velocity.new.npy")).astype(np.float64)
            verr = np.abs(v - g64).max()
            vb = 2 * U * S * gscale
            good = verr <= vb
            ok &= good
            print(f"{name:22s} {k + '.vel':10s} max err {verr:.2e} <= {vb:.2e} {'ok' if good else 'FAIL'}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--train-graph", required=True)
    ap.add_argument("--graph-ref", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--tpusim", help="tpusim, for the 8-replica v3-8 case")
    ap.add_argument("--cnn-batch", type=int, default=4)
    args = ap.parse_args()
    torch.manual_seed(0)
    ok = True
    ok &= run_case(args, "mlp_b16_sgd", "make_mlp_train.py", ["--batch", "16", "--hidden", "64"], "sgd:lr=0.1", "xent", 1)
    ok &= run_case(args, "mlp_b64_momentum_index", "make_mlp_train.py", ["--batch", "64"], "sgd:lr=0.05,momentum=0.9",
                   "xent-index", 2)
    ok &= run_case(args, "mlp_b8_mse", "make_mlp_train.py", ["--batch", "8", "--hidden", "32"], "sgd:lr=0.01", "mse", 3)
    ok &= run_case(args, f"cnn_w4_b{args.cnn_batch}_momentum", "make_cnn_train.py",
                   ["--batch", str(args.cnn_batch), "--width", "4"], "sgd:lr=0.05,momentum=0.9", "xent", 4)
    ok &= run_case(args, "smooth_b16_momentum", "smooth", ["--batch", "16"], "sgd:lr=0.5,momentum=0.9", "xent", 6)
    if args.tpusim:
        ok &= run_case(args, "mlp_b64_v3-8_8_replicas", "make_mlp_train.py", ["--batch", "64"],
                       "sgd:lr=0.05,momentum=0.9", "xent", 5, replicas=8)
    print("all within tolerance" if ok else "OUT OF TOLERANCE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
