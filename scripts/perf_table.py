#!/usr/bin/python3
"""The compiled-workload quality table of docs/performance.md ("Compiled workloads").

  perf_table.py [--build DIR] [--out DIR] [--presets v3,v5e] [--work gemm1024,...]
                [--timeout S] [--markdown FILE]

For each preset and workload: export (models) or write (GEMMs) the graph, compile it
with `tpusim compile --precision bf16 --cores <all cores of the chip>`, simulate it
with `tpusim run` (fast mode), and print cycles, MXU utilisation, HBM bandwidth
utilisation and the fraction of the workload's own bound achieved. The bound is
computed here from the graph and the preset, per core (closed forms in
docs/performance.md):

  mmuls  = sum over matmuls of batches*ceil(M/8)*ceil(K/R)*ceil(N/C)
           + sum over conv2d of groups*ceil(N*OH*OW/8)*ceil(KH*KW*Cin_g/R)*ceil(Cout_g/C)
           (not depthwise ones with KH*KW <= R: the VPU's, below)
  MXU    = mmuls * L / (mxus * cores)          (one 8-row mmul per L cycles per MXU)
  pop    = mmuls * 8 / (mxus * cores)          (8 result rows per mpop, 1 row/cycle per MXU)
  HBM    = (graph inputs + constants + outputs, bytes at the policy's dtype) / (peak B/cycle)
  VPU    = max(ALU / alu_per_cycle, transcendentals * interval, VMEM,
               (ALU + VMEM) / dispatch_per_cycle) / cores, where per node of
           ceil(elements/1024) tiles ALU counts each tile's ALU ops (a
           transcendental takes an ALU slot too; a depthwise conv a multiply and an
           add a tap) and VMEM its loads and stores that are counted (a depthwise
           conv a load a tap, its weights held in registers, and one store; per
           matmul/conv the LHS, weight and
           output vregs loaded/stored once): VMEM moves one dense tile a cycle
  bound  = max(MXU, pop, HBM, VPU)
  issue  = max(2 * mmuls / matrix slots, (2 * mmuls + ALU + VMEM) / issue width) / cores
           (every mmul and mpop is an instruction; the sequencer issues bundles of up to
           core.sequencer.issue_per_cycle, core.sequencer.slots.matrix of them matrix ops):
           reported beside the bound.

Workload names: gemmN (square bf16 GEMM, inputs a and b), resnet18, resnet50,
mobilenet_v2, bert_layer, each with @B for batch B (default 1), e.g. resnet18@8.
Models are exported with Debian's torch (random weights, no download); batch 1
reuses scripts/export_models.py's models. A run that exceeds --timeout is reported
with the simulation speed measured on the smaller runs instead of silently dropped.

`--fusion-traffic MODEL@B` compiles MODEL with and without fusion (tpusim-lower
--no-fuse) and reports the HBM bytes each moves on the preset.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))


# ----------------------------------------------------------------- presets

def load_preset(name):
    path = os.path.join(ROOT, "configs", "chips", name + ".yaml")
    with open(path) as f:
        y = yaml.safe_load(f)
    mxu, vpu = y["core"]["mxu"], y["core"]["vpu"]
    return {
        "name": name,
        "clock_hz": float(y["clock_hz"]),
        "cores": int(y["cores_per_chip"]),
        "mxus": int(mxu["count"]),
        "R": int(mxu["rows"]),
        "C": int(mxu["cols"]),
        "L": int(mxu["lhs_cycles_per_vreg"]),
        "fifo_rows": 8 * int(mxu["result_fifo_vregs"]),
        "vmem": int(y["core"]["vmem"]["bytes"]),
        "smem": int(y["core"]["smem"]["bytes"]),
        "trans_interval": int(vpu.get("transcendental_issue_interval_cycles", 1)),
        "alu_per_cycle": int(vpu.get("alu_per_cycle", 1)),
        "vpu_dispatch": int(vpu.get("dispatch_per_cycle", 1)),
        "issue_width": int(y["core"]["sequencer"].get("issue_per_cycle", 1)),
        "matrix_slots": int(y["core"]["sequencer"].get("slots", {}).get("matrix", 1)),
    }


# ----------------------------------------------------------------- graph IR

NODE = re.compile(r'^\s*(%\S+) = (\w+)\((.*?)\)\s*(\{.*\})?\s*:\s*(\w+)\[([\d,]*)\] #(\d+)')
TENSOR = re.compile(r'^\s*(input|const) (%\S+) : (\w+)\[([\d,]*)\]')


def shape_of(s):
    return [int(x) for x in s.split(",")] if s else []


def attrs_of(s):
    out = {}
    if not s:
        return out
    for k, v in re.findall(r'(\w+)=(\[[^\]]*\]|[^,}]+)', s.strip("{}")):
        v = v.strip()
        if v.startswith("["):
            out[k] = [float(x) for x in v.strip("[]").split(",") if x.strip()]
        else:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = v
    return out


def parse_ir(text):
    g = {"inputs": {}, "consts": {}, "nodes": [], "outputs": []}
    for line in text.splitlines():
        m = TENSOR.match(line)
        if m:
            kind, name, dt, sh = m.groups()
            (g["inputs"] if kind == "input" else g["consts"])[name] = (dt, shape_of(sh))
            continue
        m = NODE.match(line)
        if m:
            out, op, args, attrs, dt, sh, nid = m.groups()
            ins = [a.strip() for a in args.split(",")] if args.strip() else []
            g["nodes"].append({"out": out, "op": op, "in": ins, "attrs": attrs_of(attrs), "dt": dt,
                               "shape": shape_of(sh), "id": int(nid)})
            continue
        m = re.match(r'^\s*output (%\S+)', line)
        if m:
            g["outputs"].append(m.group(1))
    return g


def prod(s):
    p = 1
    for x in s:
        p *= x
    return p


# Vector ALU ops and, of them, transcendentals per 8x128 output tile of each op's
# recipe (arithmetic only).
def vpu_per_tile(op):
    simple = {"add": 1, "sub": 1, "mul": 1, "div": 1, "relu": 1, "neg": 1, "clip": 2, "cast": 0, "identity": 0,
              "pow": 1}
    if op in simple:
        return simple[op], 0
    if op in ("tanh", "exp", "log", "sqrt", "rsqrt", "erf"):
        return 1, 1
    if op == "sigmoid":
        return 4, 1
    if op == "gelu":
        return 5, 1
    return None


def depthwise_on_vpu(x, w, n, R):
    """A conv2d the compiler runs on the VPU (compiler/lower/vector.cpp,
    lower_depthwise): one channel per group, one output channel each, KH*KW <= R."""
    G = int(n["attrs"].get("groups", 1))
    CO, CI, KH, KW = w
    return G == x[1] and CI == 1 and CO == G and KH * KW <= R


def bound(g, p, elem_bytes=2):
    types = {}
    for name, (dt, sh) in list(g["inputs"].items()) + list(g["consts"].items()):
        types[name] = sh
    for n in g["nodes"]:
        types[n["out"]] = n["shape"]
    R, C, L, mxus, cores = p["R"], p["C"], p["L"], p["mxus"], p["cores"]
    t = p["trans_interval"]
    mmuls = alu = trans = vmem = 0
    for n in g["nodes"]:
        op, sh = n["op"], n["shape"]
        tiles = math.ceil(prod(sh) / 1024)
        if op == "matmul":
            a, b = types[n["in"][0]], types[n["in"][1]]
            M, N = sh[-2], sh[-1]
            K = a[-2] if n["attrs"].get("trans_a") else a[-1]
            batches = prod(sh) // max(M * N, 1)
            ch = math.ceil(K / R)
            mmuls += batches * math.ceil(M / 8) * ch * math.ceil(N / C)
            vmem += batches * (math.ceil(M / 8) * ch + math.ceil(M / 8) * math.ceil(N / 128))
            vmem += ch * math.ceil(N / C) * (R // 8)
        elif op == "conv2d" and depthwise_on_vpu(types[n["in"][0]], types[n["in"][1]], n, R):
            # The VPU's: per output tile and tap one multiply and one add and the
            # tap's vreg loaded once (the weights held in registers), the result
            # stored once.
            KK = types[n["in"][1]][2] * types[n["in"][1]][3]
            alu += tiles * 2 * KK
            vmem += tiles * (KK + 1)
        elif op == "conv2d":
            x, w = types[n["in"][0]], types[n["in"][1]]
            G = int(n["attrs"].get("groups", 1))
            CO, CI, KH, KW = w
            M = x[0] * sh[2] * sh[3]
            ch = math.ceil(KH * KW * CI / R)
            mmuls += G * math.ceil(M / 8) * ch * math.ceil(CO // G / C)
            vmem += G * (math.ceil(M / 8) * ch + math.ceil(M / 8) * math.ceil(CO // G / 128) +
                        ch * math.ceil(CO // G / C) * (R // 8))
        elif op == "softmax":  # 4 ALU ops and an exp
            alu += tiles * 5
            trans += tiles
        elif op == "layernorm":
            alu += tiles * 7
        elif op in ("reduce_sum", "reduce_mean", "reduce_max", "global_avgpool"):
            alu += math.ceil(prod(types[n["in"][0]]) / 1024)
        elif op in ("maxpool", "avgpool"):
            k = n["attrs"]["kernel"]
            alu += math.ceil(prod(sh) * k[0] * k[1] / 1024)
        else:
            c = vpu_per_tile(op)
            if c is not None:
                alu += tiles * c[0]
                trans += tiles * c[1]
    io_bytes = sum(prod(s) for _, s in g["inputs"].values()) + sum(prod(s) for _, s in g["consts"].values())
    io_bytes += sum(prod(types[o]) for o in g["outputs"])
    io_bytes *= elem_bytes
    return {
        "mmuls": mmuls,
        "mxu": mmuls * L / (mxus * cores),
        "pop": mmuls * 8 / (mxus * cores),
        "hbm_bytes": io_bytes,
        "vpu": max(alu / p["alu_per_cycle"], trans * t, vmem, (alu + vmem) / p["vpu_dispatch"]) / cores,
        "issue": max(2 * mmuls / p["matrix_slots"], (2 * mmuls + alu + vmem) / p["issue_width"]) / cores,
    }


# ----------------------------------------------------------------- workloads

def gemm_ir(n):
    return (f"graph gemm{n} {{\n  input %a : f32[{n},{n}]\n  input %b : f32[{n},{n}]\n"
            f"  %y = matmul(%a, %b) : f32[{n},{n}] #0\n  output %y\n}}\n")


def bert_layer(batch, hidden=768, heads=12, ffn=3072, seq=128):
    import torch
    from torch import nn

    class EncoderLayer(nn.Module):
        """export_models.py's BERT-base encoder layer with a batch dimension B."""

        def __init__(self):
            super().__init__()
            self.h, self.nh, self.d, self.s = hidden, heads, hidden // heads, seq
            self.q, self.k, self.v = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
            self.o = nn.Linear(hidden, hidden)
            self.ln1, self.ln2 = nn.LayerNorm(hidden, eps=1e-12), nn.LayerNorm(hidden, eps=1e-12)
            self.up, self.down = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
            self.act = nn.GELU()

        def split(self, t):
            return t.view(batch, self.s, self.nh, self.d).transpose(1, 2)

        def forward(self, x):
            q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d)
            ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
            ctx = ctx.transpose(1, 2).reshape(batch, self.s, self.h)
            x = self.ln1(x + self.o(ctx))
            return self.ln2(x + self.down(self.act(self.up(x))))

    return EncoderLayer(), (batch, seq, hidden)


def model_file(name, batch, out):
    path = os.path.join(out, f"{name}_b{batch}.onnx")
    if os.path.exists(path):
        return path
    import torch
    import export_models
    torch.manual_seed(0)
    if name == "bert_layer":
        model, shape = bert_layer(batch)
    else:
        model, shape = export_models.build_model(name)
        shape = (batch,) + tuple(shape[1:])
    model.eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.onnx.export(model, x, path + ".tmp", input_names=["input"], output_names=["output"])
    os.replace(path + ".tmp", path)
    return path


def workload_file(work, out):
    name, _, b = work.partition("@")
    batch = int(b or 1)
    if name.startswith("gemm"):
        path = os.path.join(out, name + ".ir")
        with open(path, "w") as f:
            f.write(gemm_ir(int(name[4:])))
        return path
    return model_file(name, batch, out)


# ----------------------------------------------------------------- running

def run(cmd, timeout=None):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def graph_ir(build, model):
    r = run([os.path.join(build, "compiler", "tpusim-graph-ref"), model, "--print-ir"])
    if r.returncode != 0:
        raise SystemExit(f"tpusim-graph-ref {model}: {r.stderr.strip()}")
    return r.stdout


def gemm_hbm_min(n, p, e=2, eo=2):
    """Least HBM bytes of an n^3 GEMM for an output-stationary schedule whose fp32 partial
    sums fill a core's VMEM: tiles of T x T, T = sqrt(vmem / 4), the LHS read once per
    column tile and the weights once per row tile (docs/performance.md, "HBM bytes")."""
    t = math.sqrt(p["vmem"] / 4)
    return max(2 * e * n ** 3 / t + eo * n * n, e * 2 * n * n + eo * n * n)


def measure(build, preset, work, out, timeout):
    tpusim = os.path.join(build, "sim", "tpusim")
    model = workload_file(work, out)
    tag = f"{preset['name']}_{work.replace('@', '_b')}"
    bundle = os.path.join(out, tag + ".tpb")
    t0 = time.time()
    r = run([tpusim, "compile", model, "--preset", preset["name"], "--precision", "bf16", "--cores",
             str(preset["cores"]), "-o", bundle])
    if r.returncode != 0:
        return {"work": work, "error": "compile: " + (r.stderr.strip() or r.stdout.strip())}
    compile_s = time.time() - t0
    instructions = int(re.search(r"(\d+) instructions", r.stdout).group(1))
    b = bound(parse_ir(graph_ir(build, model)), preset)
    res = {"work": work, "preset": preset["name"], "instructions": instructions, "compile_s": compile_s, **b}
    t0 = time.time()
    try:
        r = run([tpusim, "run", bundle, "--preset", preset["name"], "--random-inputs", "1", "--out",
                 os.path.join(out, tag)], timeout=timeout)
    except subprocess.TimeoutExpired:
        res["timeout"] = timeout
        return res
    if r.returncode != 0:
        res["error"] = "run: " + ((r.stderr.strip() or r.stdout.strip()).splitlines() or [f"exit {r.returncode}"])[0]
        return res
    res["wall_s"] = time.time() - t0
    with open(os.path.join(out, tag, "stats.json")) as f:
        st = json.load(f)
    cyc = st["cycles"]
    peak_bpc = st["hbm"]["peak_bytes_per_s"] / st["clock_hz"]
    hbm = st["hbm"]["bytes_read"] + st["hbm"]["bytes_written"]
    res.update(cycles=cyc, mxu_util=st["mxu_utilization"], hbm_util=hbm / (cyc * peak_bpc), hbm_moved=hbm,
               hbm_time=b["hbm_bytes"] / peak_bpc)
    res["bound"] = max(b["mxu"], b["pop"], b["vpu"], res["hbm_time"])
    terms = [("MXU", b["mxu"]), ("HBM", res["hbm_time"]), ("VPU", b["vpu"]), ("pop", b["pop"])]
    res["bound_by"] = next(k for k, v in terms if v == res["bound"])
    res["fraction"] = res["bound"] / cyc
    res["fraction_issue"] = max(res["bound"], b["issue"]) / cyc
    res["sim_speed"] = cyc / res["wall_s"]
    if work.startswith("gemm"):
        res["hbm_min"] = gemm_hbm_min(int(work[4:]), preset)
    return res


def fmt_row(r):
    if "error" in r:
        return f"| {r.get('preset', '')} | {r['work']} | error: {r['error'][:80]} | | | | | |"
    if "timeout" in r:
        return (f"| {r['preset']} | {r['work']} | not simulated: over {r['timeout']} s | | | "
                f"bound {r['mxu']:.0f} MXU cycles | | {r['instructions']} |")
    return (f"| {r['preset']} | {r['work']} | {r['cycles']} | {100 * r['mxu_util']:.1f}% | {100 * r['hbm_util']:.1f}% | "
            f"{r['bound']:.0f} ({r['bound_by']}) | **{100 * r['fraction']:.1f}%** ({100 * r['fraction_issue']:.1f}%) | "
            f"{r['instructions']} | {r['hbm_moved'] / 1e6:.1f} MB" +
            (f" / {r['hbm_min'] / 1e6:.1f} MB |" if "hbm_min" in r else " |"))


HEADER = ("| preset | workload | cycles | MXU util | HBM BW util | bound, cycles (term) | of bound (with issue) | "
          "instructions | HBM moved (/ minimum for the VMEM, GEMMs) |\n|---|---|---|---|---|---|---|---|---|")


def fusion_traffic(build, preset, work, out):
    model = workload_file(work, out)
    tpusim = os.path.join(build, "sim", "tpusim")
    lower = os.path.join(build, "compiler", "lower", "tpusim-lower")
    rows = []
    for fuse in (True, False):
        bundle = os.path.join(out, f"fuse{int(fuse)}_{preset['name']}_{work.replace('@', '_b')}.tpb")
        cmd = [lower, model, "-o", bundle, "--mxus", str(preset["mxus"]), "--rows", str(preset["R"]), "--cols",
               str(preset["C"]), "--fifo-rows", str(preset["fifo_rows"]), "--vmem", str(preset["vmem"]),
               "--smem", str(preset["smem"]), "--cores", str(preset["cores"]), "--precision", "bf16"]
        if not fuse:
            cmd.append("--no-fuse")
        r = run(cmd)
        if r.returncode != 0:
            raise SystemExit(r.stderr)
        d = bundle + ".out"
        r = run([tpusim, "run", bundle, "--preset", preset["name"], "--random-inputs", "1", "--out", d])
        if r.returncode != 0:
            raise SystemExit(r.stderr or r.stdout)
        with open(os.path.join(d, "stats.json")) as f:
            st = json.load(f)
        rows.append((fuse, st["hbm"]["bytes_read"], st["hbm"]["bytes_written"], st["cycles"]))
    (_, r1, w1, c1), (_, r0, w0, c0) = rows
    print(f"{preset['name']} {work}: fused {(r1 + w1) / 1e6:.1f} MB ({c1} cycles), unfused {(r0 + w0) / 1e6:.1f} MB "
          f"({c0} cycles): fusion saves {100 * (1 - (r1 + w1) / (r0 + w0)):.1f}% of HBM traffic")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default="/tmp/tpusim_perf")
    ap.add_argument("--presets", default="v3,v5e")
    ap.add_argument("--work", default="gemm1024,gemm2048,gemm4096,gemm8192,resnet18,resnet18@8,resnet50,resnet50@8,"
                                      "mobilenet_v2,mobilenet_v2@8,bert_layer,bert_layer@8")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", help="append each result as a JSON line to this file")
    ap.add_argument("--fusion-traffic", help="MODEL@B: HBM bytes with and without fusion")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    presets = [load_preset(p) for p in a.presets.split(",")]
    if a.fusion_traffic:
        for p in presets:
            fusion_traffic(a.build, p, a.fusion_traffic, a.out)
        return
    print(HEADER)
    for p in presets:
        for w in a.work.split(","):
            r = measure(a.build, p, w, a.out, a.timeout)
            print(fmt_row(r), flush=True)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
