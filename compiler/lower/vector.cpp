// Vector-unit lowerings: elementwise ops, row ops (softmax, layernorm, reductions,
// global average pool) and max/average pooling.
#include "compiler/lower/emitter.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <utility>

namespace tpusim::compiler::lowering {

// The recipe's instructions of elementwise op `n` on registers: vd = op(va[, vb]).
// vd is written last, so it may equal va or vb; t0 and t1 are scratch.
void Emitter::emit_op(const Node& n, int vd, int va, int vb, int t0, int t1) {
  const std::string d = "v" + std::to_string(vd), a = "v" + std::to_string(va), b = "v" + std::to_string(vb);
  const std::string x = "v" + std::to_string(t0), y = "v" + std::to_string(t1);
  switch (n.op) {
    case OpKind::kAdd: line("vadd " + d + ", " + a + ", " + b); break;
    case OpKind::kSub: line("vsub " + d + ", " + a + ", " + b); break;
    case OpKind::kMul: line("vmul " + d + ", " + a + ", " + b); break;
    case OpKind::kDiv: line("vdiv " + d + ", " + a + ", " + b); break;
    case OpKind::kRelu: line("vbcast " + x + ", 0.0"); line("vmax " + d + ", " + a + ", " + x); break;
    // x > +0.0 ? dy : +0.0 (a = dy, b = x); vsel moves dy's stored bits unchanged. The
    // mask is m2: kernels that fuse it hold m1 (a conv's NCHW bands, the last lanes)
    // and m3.. (a shifted conv's LHS lanes) across their epilogues; m2 is set where it
    // is used and held across none.
    case OpKind::kReluGrad:
      line("vbcast " + x + ", 0.0"); line("vcmp.lt m2, " + x + ", " + b); line("vsel " + d + ", m2, " + a + ", " + x);
      break;
    case OpKind::kTanh: line("vtanh " + d + ", " + a); break;
    case OpKind::kExp: line("vexp " + d + ", " + a); break;
    case OpKind::kLog: line("vlog " + d + ", " + a); break;
    case OpKind::kSqrt: line("vsqrt " + d + ", " + a); break;
    case OpKind::kRsqrt: line("vrsqrt " + d + ", " + a); break;
    case OpKind::kErf: line("verf " + d + ", " + a); break;
    case OpKind::kNeg: line("vneg " + d + ", " + a); break;
    case OpKind::kIdentity:
    case OpKind::kCast:
      if (vd != va) line("vmov " + d + ", " + a);
      break;
    case OpKind::kSigmoid:  // div(1, add(1, exp(neg(x))))
      line("vneg " + x + ", " + a); line("vexp " + x + ", " + x); line("vbcast " + y + ", 1.0");
      line("vadd " + x + ", " + y + ", " + x); line("vdiv " + d + ", " + y + ", " + x);
      break;
    case OpKind::kGelu:  // t = x / fp32(sqrt 2); v = x * (erf(t) + 1); y = v * 0.5
      // t1 only ever holds a constant, so chains interleaved op by op can share it.
      line("vbcast " + y + ", " + fimm(1.41421354f)); line("vdiv " + x + ", " + a + ", " + y); line("verf " + x + ", " + x);
      line("vbcast " + y + ", 1.0"); line("vadd " + x + ", " + x + ", " + y); line("vmul " + x + ", " + a + ", " + x);
      line("vbcast " + y + ", 0.5"); line("vmul " + d + ", " + x + ", " + y);
      break;
    case OpKind::kClip:
      line("vbcast " + x + ", " + fimm(n.attr_float("min"))); line("vbcast " + y + ", " + fimm(n.attr_float("max")));
      line("vmax " + x + ", " + a + ", " + x); line("vmin " + d + ", " + x + ", " + y);
      break;
    case OpKind::kPow: {
      const float p = n.attr_float("exponent");
      if (p == 0.5f) line("vsqrt " + d + ", " + a);
      else if (p == 1.0f) { if (vd != va) line("vmov " + d + ", " + a); }
      else if (p == 2.0f) line("vmul " + d + ", " + a + ", " + a);
      else if (p == 3.0f) { line("vmul " + x + ", " + a + ", " + a); line("vmul " + d + ", " + x + ", " + a); }
      else fail(n, "exponent " + std::to_string(p) + " is not lowered");
      break;
    }
    default: fail(n, "op is not supported by the lowering yet");
  }
}

// Elementwise ops and their fused chains: blocks of up to 64 8x128-element tiles
// stream HBM -> VMEM -> vector unit -> HBM, one DMA per operand and block, the next
// block's operands fetched while this one computes (two buffers, a flag each), the
// chain's members applied in registers, only the chain's end stored. A ragged last
// tile moves only its bytes; the lanes past it compute on stale VMEM and are never
// stored back. Blocks go round robin over the cores.
void Emitter::lower_elementwise(const Node& n) {
  const std::vector<const Node*>& chain = chain_of(n);
  const Node& last = chain.empty() ? n : *chain.back();
  const Shape& os = n.type.shape;
  const int64_t total = num_elements(os);
  const int64_t tiles = (total + kTileElems - 1) / kTileElems;
  const int64_t T = std::min(kElementwiseBlockTiles, tiles);
  std::vector<int64_t> src;
  std::vector<DType> sdt;
  // An operand broadcast over leading axes only (the training step's learning-rate and
  // momentum rows over a weight's 2-D view, a scalar) is periodic in the output's
  // element order: element i is its element i mod P. It comes into VMEM once, repeated
  // past one tile's length, and a tile reads it at its first element's index mod P.
  // Before, the operand was laid out whole in HBM and streamed with the others (the
  // cnn step's optimizer: 20 of them, a whole copy of each weight written and read
  // again); in sessions 78-79 repeated past a block's length (64 tiles): each
  // repetition a memory request (the v3-8 MLP's w1 update: 257 of three 1 KiB rows,
  // ~6 K cycles before its first block), then 258 KiB of VMEM copies (~1.7 K cycles).
  // Now a 1 KiB row needs 5 repetitions (fetch below).
  std::vector<int64_t> period;  // P, or 0: streamed
  // Another broadcast operand of a one-block op is spread straight into its block
  // buffer: its runs from HBM, or (short runs) its bytes into VMEM once and its runs
  // copied there. Laid out in HBM first (broadcast_to), that was three DMAs in a row
  // when staged (in, gather, out) before the kernel's own load: ~1.3 K cycles each
  // for the xent's [8,1] row values over [8,10] at batch 8.
  std::vector<std::optional<BroadcastMoves>> spread;
  constexpr int64_t kSpreadSourceBytes = 1 << 20;
  auto add_operand = [&](const Node& m, const std::string& name) {
    const Shape& full = t_.at(name).type.shape;
    const Shape ps(std::find_if(full.begin(), full.end(), [](int64_t d) { return d != 1; }), full.end());
    const int64_t P = num_elements(ps), e = esz(t_.at(name).type.dtype);
    bool leading = ps.size() <= os.size() && P < total;
    for (size_t d = 0; leading && d < ps.size(); ++d) leading = ps[d] == os[os.size() - ps.size() + d];
    spread.emplace_back();
    if (leading && (P + T * kTileElems) * e <= kPeriodicBytes) {
      src.push_back(t_.at(name).addr);
      period.push_back(P);
    } else if (P < total && tiles <= T && P * e <= kSpreadSourceBytes) {
      src.push_back(t_.at(name).addr);
      period.push_back(0);
      spread.back() = broadcast_moves(t_.at(name), os);
    } else {
      src.push_back(broadcast_to(m, name, os));
      period.push_back(0);
    }
    sdt.push_back(t_.at(name).type.dtype);
  };
  const size_t nin = n.inputs.size() == 2 ? 2 : 1;
  for (size_t i = 0; i < nin; ++i) add_operand(n, n.inputs[i]);
  struct Member {
    const Node* m;
    int operand;  // index into src, -1 for unary
    bool run_first;
    const Node* feed = nullptr;  // computes the other operand from src[operand] (and the next)
  };
  std::vector<Member> members;
  std::string run = n.output;
  for (const Node* m : chain) {
    Member mb{m, -1, true};
    if (m->inputs.size() == 2) {
      mb.run_first = m->inputs[0] == run;
      mb.operand = static_cast<int>(src.size());
      auto f = feeds_.find(m->id);
      if (f != feeds_.end()) {
        mb.feed = f->second;
        for (const std::string& in : mb.feed->inputs) add_operand(*mb.feed, in);
      } else {
        add_operand(*m, m->inputs[mb.run_first ? 1 : 0]);
      }
    }
    members.push_back(mb);
    run = m->output;
  }
  const int64_t dst = t_.at(last.output).addr;
  const DType odt = last.type.dtype;
  // Results before the chain's end that other nodes read (side_stored_): stored too,
  // each from its own block buffer. The training step's new velocity, read by the
  // weight's update in the same chain and kept as an output, was stored by one op and
  // read back by the next (the bundled CNN's optimizer: 10 ops fewer, a velocity's
  // read each).
  std::vector<const Node*> sides;  // in chain order; side k stores after that node
  if (side_stored_.count(n.output)) sides.push_back(&n);
  for (const Node* m : chain)
    if (m != &last && side_stored_.count(m->output)) sides.push_back(m);
  const int64_t nside = static_cast<int64_t>(sides.size());
  const int64_t buf = T * kTileElems * 4;  // one operand's block (f32 at most)
  const int64_t nsrc = static_cast<int64_t>(src.size());
  const int64_t per_par = nsrc + 1 + nside;
  auto in_buf = [&](int64_t par, int64_t s) { return (par * per_par + s) * buf; };
  auto out_buf = [&](int64_t par) { return (par * per_par + nsrc) * buf; };
  auto side_buf = [&](int64_t par, int64_t k) { return (par * per_par + nsrc + 1 + k) * buf; };
  // After the blocks' buffers (pbuf): the periodic operands' repetitions, whole
  // periods covering a tile from any start below P, and the staged bytes of spread
  // operands with short runs.
  std::vector<int64_t> pbuf(static_cast<size_t>(nsrc), 0), reps(static_cast<size_t>(nsrc), 0);
  std::vector<int64_t> resident(static_cast<size_t>(nsrc), 0);  // bytes after the blocks' buffers
  for (size_t s = 0; s < src.size(); ++s) {
    if (spread[s] && spread[s]->short_runs) resident[s] = align_up(spread[s]->src_bytes, kAlign);
    if (!period[s]) continue;
    reps[s] = (period[s] - 1 + kTileElems + period[s] - 1) / period[s];
    resident[s] = align_up(reps[s] * period[s] * esz(sdt[s]), kAlign);
  }
  // Three sets of block buffers where they fit, else two (feeder_fits keeps two
  // within half of VMEM).
  const int64_t resident_bytes = std::accumulate(resident.begin(), resident.end(), int64_t{0});
  const int depth = 3 * per_par * buf + resident_bytes <= static_cast<int64_t>(opt_.target.vmem_bytes) ? 3 : 2;
  int64_t top = depth * per_par * buf;
  for (size_t s = 0; s < src.size(); ++s) {
    pbuf[s] = top;
    top += resident[s];
  }
  if (static_cast<uint64_t>(top) > opt_.target.vmem_bytes) fail(n, "operands too large for VMEM");
  const int in_flag = kStreamInFlag, out_flag = kStreamInFlag + depth;
  const int64_t nblocks = (tiles + T - 1) / T;
  sync_all();
  std::vector<bool> repeated(static_cast<size_t>(cores_), false);
  auto fetch = [&](int64_t blk, int64_t par) {
    const int64_t base = blk * T * kTileElems, cnt = std::min(T * kTileElems, total - base);
    const int flag = in_flag + static_cast<int>(par);
    for (int64_t s = 0; s < nsrc; ++s) {
      const size_t i = static_cast<size_t>(s);
      if (!period[i] && !spread[i]) dma_on(flag, vmem(in_buf(par, s)), hbm(src[i] + base * esz(sdt[i])), cnt * esz(sdt[i]), "");
      if (spread[i] && !spread[i]->short_runs)  // the one block: its runs straight from HBM
        for (const Gather& g : spread[i]->gathers)
          dma_on(flag, vmem(in_buf(par, s) + g.dst_off), hbm(src[i] + g.src_off), g.run, g.dims);
    }
    if (repeated[static_cast<size_t>(cur_)]) return;
    // The core's first block brings the periodic operands. Each repetition read from
    // HBM (a stride-0 DMA) is a memory request, so a row needed at most
    // kShortRowReps times comes that way with the block; a shorter one comes once (f1)
    // and is repeated by a VMEM -> VMEM copy, two trips of a DMA latency each.
    constexpr int64_t kShortRowReps = 64;
    bool any = false;
    for (size_t i = 0; i < src.size(); ++i) {
      if (spread[i] && spread[i]->short_runs) {
        dma(vmem(pbuf[i]), hbm(src[i]), spread[i]->src_bytes);
        any = true;
      }
      const int64_t row = period[i] * esz(sdt[i]);
      if (period[i] && reps[i] <= kShortRowReps) {
        dma_on(flag, vmem(pbuf[i]), hbm(src[i]), row, dim(reps[i], 0, row));
      } else if (period[i]) {
        dma(vmem(pbuf[i]), hbm(src[i]), row);
        any = true;
      }
    }
    if (any) wait_dmas();
    for (size_t i = 0; i < src.size(); ++i)
      if (period[i] && reps[i] > kShortRowReps) {
        const int64_t row = period[i] * esz(sdt[i]);
        vmem_copy_on(flag, pbuf[i] + row, pbuf[i], row, dim(reps[i] - 1, 0, row));
      }
    for (size_t i = 0; i < src.size(); ++i)
      if (spread[i] && spread[i]->short_runs) run_gathers(pbuf[i], in_buf(par, static_cast<int64_t>(i)), spread[i]->gathers, flag);
    repeated[static_cast<size_t>(cur_)] = true;
  };
  // Tile t of block blk of operand s in VMEM.
  auto operand_at = [&](int64_t par, int64_t s, int64_t blk, int64_t t) {
    const size_t i = static_cast<size_t>(s);
    const int64_t e = esz(sdt[i]);
    if (period[i]) return pbuf[i] + (blk * T * kTileElems + t * kTileElems) % period[i] * e;
    return in_buf(par, s) + t * kTileElems * e;
  };
  // Tiles go kGroup at a time, each in its own six registers (operands v6g, v6g+1,
  // the running value v6g+2, scratch v6g+3, v6g+4, a member's operand v6g+5), op by
  // op across the group, so one tile's load, op and store latencies overlap the
  // others' (one tile at a time, a div's 8 cycles and every store waited in turn: the
  // v3-8 MLP step's gradient means ran at a third of HBM's rate). Each tile's values
  // are the same instructions on the same data.
  constexpr int64_t kGroup = 4;
  auto reg = [](int64_t g, int k) { return static_cast<int>(6 * g + k); };
  auto vr = [&](int64_t g, int k) { return "v" + std::to_string(reg(g, k)); };
  // A periodic operand whose period divides a tile is the same tile for every tile:
  // loaded once a block into one of v24..v31 (the groups use v0..v23), and read
  // there (the MLP's optimizer rows of 256: three of its update's six loads a tile).
  std::vector<int> held(static_cast<size_t>(nsrc), -1);
  for (size_t s = 0, k = 0; s < src.size() && k < 8; ++s)
    if (period[s] && kTileElems % period[s] == 0) held[s] = 24 + static_cast<int>(k++);
  // The register holding operand s of tile t: `into`, loaded now, or its held one.
  auto load = [&](int64_t par, int64_t s, int64_t blk, int64_t t, int into) {
    const size_t i = static_cast<size_t>(s);
    if (held[i] >= 0) return held[i];
    line(std::string(ld(sdt[i])) + " v" + std::to_string(into) + ", " + at(operand_at(par, s, blk, t)));
    return into;
  };
  buffered(nblocks, depth, in_flag, out_flag, fetch, [&](int64_t blk, int64_t par) {
    const int64_t base = blk * T * kTileElems, cnt = std::min(T * kTileElems, total - base);
    const int64_t nt = (cnt + kTileElems - 1) / kTileElems;
    for (size_t i = 0; i < src.size(); ++i)
      if (held[i] >= 0) line(std::string(ld(sdt[i])) + " v" + std::to_string(held[i]) + ", " + at(pbuf[i]));
    for (int64_t t0 = 0; t0 < nt; t0 += kGroup) {
      const int64_t G = std::min(kGroup, nt - t0);
      int a[kGroup][2];  // per tile: the registers of the root's or a feeder's operands
      int b[kGroup];     // per tile: the register of a member's operand
      for (int64_t g = 0; g < G; ++g)
        for (size_t i = 0; i < nin; ++i) a[g][i] = load(par, static_cast<int64_t>(i), blk, t0 + g, reg(g, static_cast<int>(i)));
      for (int64_t g = 0; g < G; ++g) emit_op(n, reg(g, 2), a[g][0], a[g][nin == 2 ? 1 : 0], reg(g, 3), reg(g, 4));
      // The value of `m` as the op alone would store it.
      auto side_store = [&](const Node& m) {
        const auto k = std::find(sides.begin(), sides.end(), &m) - sides.begin();
        if (k < nside)
          for (int64_t g = 0; g < G; ++g)
            line(std::string(st(m.type.dtype)) + " " + vr(g, 2) + ", " +
                 at(side_buf(par, k) + (t0 + g) * kTileElems * esz(m.type.dtype)));
      };
      side_store(n);
      DType cur_t = n.type.dtype;
      for (const Member& mb : members) {
        // Each step across the group before the next (the operands' loads, the
        // feeder's op, the member's op), as for the root: emitted tile by tile, a
        // member's op waited for its own load or feeder just before it (the
        // optimizer's `div` feeder, 8 cycles a tile, then the `add` reading it).
        const int nf = mb.feed ? static_cast<int>(mb.feed->inputs.size()) : 0;
        for (int64_t g = 0; g < G; ++g) {
          // The feeder's operands in the root's (now free) operand registers.
          for (int i = 0; i < nf; ++i) a[g][i] = load(par, mb.operand + i, blk, t0 + g, reg(g, i));
          b[g] = !mb.feed && mb.operand >= 0 ? load(par, mb.operand, blk, t0 + g, reg(g, 5)) : reg(g, 5);
        }
        // The feeder's value where the member's operand goes, rounded as its store would be.
        for (int64_t g = 0; mb.feed && g < G; ++g) {
          emit_op(*mb.feed, reg(g, 5), a[g][0], a[g][nf == 2 ? 1 : 0], reg(g, 3), reg(g, 4));
          if (mb.feed->type.dtype == DType::kBf16) line("vcvt.bf16 " + vr(g, 5) + ", " + vr(g, 5));
        }
        for (int64_t g = 0; g < G; ++g) {
          if (cur_t == DType::kBf16) line("vcvt.bf16 " + vr(g, 2) + ", " + vr(g, 2));
          emit_op(*mb.m, reg(g, 2), mb.run_first ? reg(g, 2) : b[g], mb.run_first ? b[g] : reg(g, 2), reg(g, 3), reg(g, 4));
        }
        side_store(*mb.m);
        cur_t = mb.m->type.dtype;
      }
      for (int64_t g = 0; g < G; ++g)
        line(std::string(st(odt)) + " " + vr(g, 2) + ", " + at(out_buf(par) + (t0 + g) * kTileElems * esz(odt)));
    }
    const int flag = out_flag + static_cast<int>(par);
    for (int64_t k = 0; k < nside; ++k) {
      const int64_t e = esz(sides[static_cast<size_t>(k)]->type.dtype);
      dma_on(flag, hbm(t_.at(sides[static_cast<size_t>(k)]->output).addr + base * e), vmem(side_buf(par, k)), cnt * e, "");
    }
    dma_on(flag, hbm(dst + base * esz(odt)), vmem(out_buf(par)), cnt * esz(odt), "");
  });
}

// Ops over rows of n contiguous elements (softmax and layernorm over the last axis,
// reductions over an innermost axis block, global average pool): 8 rows per vreg
// (one per sublane), the row cut into 128-lane tiles. reduce_row's order is kept:
// lane accumulators start as tile 0 (lanes past n hold the identity), the later
// tiles are combined in increasing order, then vreduce.lanes does the fixed tree.
void Emitter::lower_rows(const Node& n) {
  const Placed& X = t_.at(n.inputs[0]);
  const Shape& xs = X.type.shape;
  int64_t len = 0;
  switch (n.op) {
    case OpKind::kSoftmax: {
      int64_t axis = n.attr_int("axis");
      if (axis < 0) axis += static_cast<int64_t>(xs.size());
      if (axis != static_cast<int64_t>(xs.size()) - 1) fail(n, "softmax over a non-last axis is not lowered yet");
      len = xs.back();
      break;
    }
    case OpKind::kLayerNorm: len = xs.back(); break;
    case OpKind::kGlobalAvgPool: len = xs[2] * xs[3]; break;
    default: {
      const auto& axes = n.attr_ints("axes");
      if (axes.empty() || axes.back() != static_cast<int64_t>(xs.size()) - 1)
        fail(n, "reductions over other than the innermost axes are not lowered yet");
      len = num_elements(Shape(xs.begin() + axes.front(), xs.end()));
    }
  }
  const int64_t rows = num_elements(xs) / std::max<int64_t>(len, 1);
  const int64_t nt = (len + 127) / 128;
  const int64_t rem = len - (nt - 1) * 128;  // lanes of the last tile
  const DType xt = X.type.dtype, ot = n.type.dtype;
  const int64_t ex = esz(xt), eo = esz(ot);
  constexpr int64_t kTile = 4096;
  // sb: scratch tiles of two banks of 6 row groups (softmax's exponentials, layernorm's
  // deviations).
  const int64_t xb = 0, sb = xb + nt * kTile, gb = sb + 12 * nt * kTile, bb = gb + nt * kTile, ob = bb + nt * kTile;
  if (static_cast<uint64_t>(ob + nt * kTile) > opt_.target.vmem_bytes) fail(n, "rows too long for VMEM");
  const int64_t y = t_.at(n.output).addr;
  const bool row_out = n.op == OpKind::kSoftmax || n.op == OpKind::kLayerNorm;
  DType gt = xt;
  sync_all();
  for (cur_ = 0; cur_ < cores_; ++cur_) {  // every core's VMEM gets the constants
  if (n.op == OpKind::kLayerNorm) {
    for (int k = 1; k <= 2; ++k) {
      const Placed& P = t_.at(n.inputs[static_cast<size_t>(k)]);
      gt = P.type.dtype;
      const int64_t e = esz(gt);
      for (int64_t t = 0; t < nt; ++t)
        dma(vmem((k == 1 ? gb : bb) + t * kTile), hbm(P.addr + t * 128 * e), std::min<int64_t>(128, len - t * 128) * e,
            dim(8, 0, 128 * e));
    }
    wait_dmas();
  }
  if (rem < 128) line("vmask m1, 8, " + std::to_string(rem));
  line("vbcast v20, " + fimm(-INFINITY));
  line("vbcast v21, 0.0");
  line("vbcast v12, " + fimm(static_cast<float>(len)));
  }
  cur_ = 0;
  // acc (v10 or v11) = reduce_row over the tiles that load_tile(t) leaves in v1.
  auto reduce = [&](const char* kind, const char* ident, const std::string& acc, auto load_tile) {
    for (int64_t t = 0; t < nt; ++t) {
      load_tile(t);
      if (t == nt - 1 && rem < 128) line(std::string("vsel v1, m1, v1, ") + ident);
      if (t == 0) line("vmov " + acc + ", v1");
      else line(std::string(kind[0] == 's' ? "vadd " : "vmax ") + acc + ", " + acc + ", v1");
    }
    line(std::string("vreduce.lanes.") + kind + " " + acc + ", " + acc);
  };
  // Blocks of row groups move as one contiguous DMA each way and sit row-major in
  // VMEM; a tile is a strided vld of 8 rows. The next block is fetched while this one
  // computes (two buffers, a flag each), and its results go out while the next one
  // computes. Blocks are 8 groups (64 rows), or more of short rows, up to kBlockBytes
  // of input while each core keeps two blocks: a block's DMAs cost a latency (~500
  // cycles) that 8 short groups' work does not hide (resnet50's global average pool,
  // 2048 rows of 49, took 16 blocks of ~740 cycles a core). Up to 256 KiB (64 KiB
  // until session 74): with one block fetched ahead, BERT's softmax at batch 8 on v3
  // (blocks of 32 groups of 128-element bf16 rows, ~320 cycles of work against a
  // ~560-cycle fetch) waited on every block, 16.7 K -> 13.6 K cycles.
  constexpr int64_t kBlockBytes = 256 << 10, kMaxGroups = 128;
  const int64_t vmem_groups =
      std::max<int64_t>(1, (opt_.target.vmem_bytes / 4) / std::max<int64_t>(1, 2 * 8 * (len + 128) * 4));
  const int64_t groups = (rows + 7) / 8;
  const int64_t GB = std::max<int64_t>(1, std::min({vmem_groups, kMaxGroups,
                                                    std::max<int64_t>(8, std::min(kBlockBytes / (8 * len * ex),
                                                                                  groups / (2 * cores_)))}));
  const int64_t blk_rows = 8 * GB;
  const int64_t ibytes = align_up((blk_rows + 8) * len * ex + 128 * ex, kAlign);
  const int64_t obytes = row_out ? align_up((blk_rows + 8) * len * eo + 128 * eo, kAlign) : GB * kTile;
  const int64_t ib0 = ob + nt * kTile, ob0 = ib0 + 2 * ibytes;
  if (static_cast<uint64_t>(ob0 + 2 * obytes) > opt_.target.vmem_bytes) fail(n, "rows too long for VMEM");
  auto ibuf = [&](int64_t par) { return ib0 + par * ibytes; };
  auto obuf = [&](int64_t par) { return ob0 + par * obytes; };
  int64_t par = 0, gi = 0;  // the current block's buffer, the group within it
  auto load_x = [&](int64_t t) {
    line(std::string(ld(xt)) + " v1, " + at(ibuf(par) + (gi * 8 * len + t * 128) * ex) + ", stride=" +
         std::to_string(len * ex));
  };
  const int64_t nblocks = (rows + blk_rows - 1) / blk_rows;
  auto fetch = [&](int64_t blk, int64_t p) {
    const int64_t b0 = blk * blk_rows, br = std::min(blk_rows, rows - b0);
    dma_on(kStreamInFlag + static_cast<int>(p), vmem(ibuf(p)), hbm(X.addr + b0 * len * ex), br * len * ex, "");
  };
  double_buffered(nblocks, fetch, [&](int64_t blk, int64_t p) {
    par = p;
    const int64_t b0 = blk * blk_rows, br = std::min(blk_rows, rows - b0);
    // The block's row groups in sets of up to 8 (g0..g1), each group's statistic in a
    // register of its own (v22..v29), so one group's lane reductions (tens of cycles)
    // overlap the other groups' passes; every row still sees the same operations in
    // the same order.
    const int64_t ng = (br + 7) / 8;
    if (!row_out) {
      // Reductions: the sums or maxima, then the means, the block's results as rows 512
      // B apart, and one DMA out. Sets alternate between two banks of registers (v22..v29,
      // v2..v9) and set s + 1's reductions are issued before set s's means and stores,
      // so those wait for no lane reduction's latency.
      auto acc_of = [](int64_t g) { return "v" + std::to_string((g / 8 % 2 ? 2 : 22) + g % 8); };
      auto reduce_set = [&](int64_t s0) {
        for (gi = s0; gi < std::min(ng, s0 + 8); ++gi) {
          if (n.op == OpKind::kReduceMax) reduce("max", "v20", acc_of(gi), load_x);
          else reduce("sum", "v21", acc_of(gi), load_x);
        }
      };
      reduce_set(0);
      for (int64_t s0 = 0; s0 < ng; s0 += 8) {
        if (s0 + 8 < ng) reduce_set(s0 + 8);
        for (gi = s0; gi < std::min(ng, s0 + 8); ++gi) {
          if (n.op != OpKind::kReduceMax && n.op != OpKind::kReduceSum)
            line("vdiv " + acc_of(gi) + ", " + acc_of(gi) + ", v12");
          line(std::string(st(ot)) + " " + acc_of(gi) + ", " + at(obuf(par) + gi * kTile) + ", stride=512");
        }
      }
      dma_on(kStreamOutFlag + static_cast<int>(par), hbm(y + b0 * eo), vmem(obuf(par)), eo, dim(br, 512, eo));
      return;
    }
    // Softmax and layernorm: sets of 6 groups, each step over a set's groups in lockstep
    // (a temporary each: their loads' and ops' latencies overlap), and three sets in
    // flight: set s + 1's first row reduction (softmax's maxima, layernorm's sums), then
    // set s's middle step (exponentials or deviations, and the sums of those or of
    // their squares), then set s - 1's outputs, so no step waits for a lane reduction
    // (79 cycles on v3) issued just before it. The accumulators rotate over three
    // banks, the middle step's results over two scratch banks. Each row sees the same
    // operations in the same order as one group at a time (BERT's softmax, 96 x 128 x
    // 128 at batch 8 on v3: 28.9 K -> 17.4 K cycles; its layernorms 13.7 K -> 10.7 K).
    constexpr int64_t G = 6;  // three banks of accumulators and a temporary each fit v2..v29
    const int64_t nsets = (ng + G - 1) / G;
    auto accr = [](int64_t s, int64_t g) {
      static constexpr int kBank[3] = {22, 14, 2};  // v22..v27, v14..v19, v2..v7
      return "v" + std::to_string(kBank[s % 3] + g);
    };
    auto tmp = [](int64_t g) {
      static constexpr int kTmp[G] = {8, 9, 10, 11, 28, 29};
      return "v" + std::to_string(kTmp[g]);
    };
    auto groups_of = [&](int64_t s) { return std::make_pair(s * G, std::min(ng, s * G + G)); };
    auto scr = [&](int64_t s, int64_t g, int64_t t) { return at(sb + (((s % 2) * G + g) * nt + t) * kTile); };
    const bool ragged = rem < 128;
    // Rows' reduction over the tiles load(g, t) leaves in tmp(g), into the set's
    // accumulators: acc = tile 0, acc = acc op tile t, the last tile's lanes past the
    // row masked to `ident`, then the lane reduction.
    auto reduce_set = [&](int64_t s, const char* kind, const char* ident, const auto& load) {
      const auto [a, b] = groups_of(s);
      for (int64_t t = 0; t < nt; ++t) {
        for (int64_t g = a; g < b; ++g) load(g, t);
        if (t == nt - 1 && ragged)
          for (int64_t g = a; g < b; ++g) line("vsel " + tmp(g - a) + ", m1, " + tmp(g - a) + ", " + ident);
        for (int64_t g = a; g < b; ++g)
          line(t == 0 ? "vmov " + accr(s, g - a) + ", " + tmp(g - a)
                      : std::string(kind[0] == 's' ? "vadd " : "vmax ") + accr(s, g - a) + ", " + accr(s, g - a) +
                            ", " + tmp(g - a));
      }
      for (int64_t g = a; g < b; ++g)
        line(std::string("vreduce.lanes.") + kind + " " + accr(s, g - a) + ", " + accr(s, g - a));
    };
    auto load_x_of = [&](int64_t s) {
      return [&, s](int64_t g, int64_t t) {
        line(std::string(ld(xt)) + " " + tmp(g - s * G) + ", " + at(ibuf(par) + (g * 8 * len + t * 128) * ex) +
             ", stride=" + std::to_string(len * ex));
      };
    };
    // Each group's op over the set's temporaries (or accumulators).
    auto each = [&](int64_t s, const std::function<std::string(const std::string&, const std::string&)>& f) {
      const auto [a, b] = groups_of(s);
      for (int64_t g = a; g < b; ++g) line(f(tmp(g - a), accr(s, g - a)));
    };
    auto store_set = [&](int64_t s, int64_t t) {
      const auto [a, b] = groups_of(s);
      for (int64_t g = a; g < b; ++g)
        line(std::string(st(ot)) + " " + tmp(g - a) + ", " + at(obuf(par) + (g * 8 * len + t * 128) * eo) +
             ", stride=" + std::to_string(len * eo) + (t == nt - 1 && ragged ? ", mask=m1" : ""));
    };
    auto load_scr = [&](int64_t s, int64_t t) {
      const auto [a, b] = groups_of(s);
      for (int64_t g = a; g < b; ++g) line("vld " + tmp(g - a) + ", " + scr(s, g - a, t));
    };
    std::function<void(int64_t)> first, middle, outputs;
    if (n.op == OpKind::kSoftmax) {
      first = [&](int64_t s) { reduce_set(s, "max", "v20", load_x_of(s)); };
      middle = [&](int64_t s) {  // exponentials, then their sum (the max is dead)
        const auto [a, b] = groups_of(s);
        const auto load = load_x_of(s);
        for (int64_t t = 0; t < nt; ++t) {
          for (int64_t g = a; g < b; ++g) load(g, t);
          each(s, [](const std::string& x, const std::string& m) { return "vsub " + x + ", " + x + ", " + m; });
          each(s, [](const std::string& x, const std::string&) { return "vexp " + x + ", " + x; });
          // Rows of one tile: the sum is taken from the exponentials where they are, not
          // reloaded (the lanes past the row zeroed first; the outputs never store them).
          if (nt == 1) reduce_set(s, "sum", "v21", [](int64_t, int64_t) {});
          for (int64_t g = a; g < b; ++g) line("vst " + tmp(g - a) + ", " + scr(s, g - a, t));
        }
        if (nt > 1)
          reduce_set(s, "sum", "v21", [&](int64_t g, int64_t t) { line("vld " + tmp(g - a) + ", " + scr(s, g - a, t)); });
      };
      outputs = [&](int64_t s) {
        for (int64_t t = 0; t < nt; ++t) {
          load_scr(s, t);
          each(s, [](const std::string& x, const std::string& m) { return "vdiv " + x + ", " + x + ", " + m; });
          store_set(s, t);
        }
      };
    } else {
      line("vbcast v13, " + fimm(n.attr_float("epsilon")));
      first = [&](int64_t s) { reduce_set(s, "sum", "v21", load_x_of(s)); };
      middle = [&](int64_t s) {  // deviations, then their squares' sum (the mean is dead)
        const auto [a, b] = groups_of(s);
        const auto load = load_x_of(s);
        each(s, [](const std::string&, const std::string& m) { return "vdiv " + m + ", " + m + ", v12"; });  // mean
        for (int64_t t = 0; t < nt; ++t) {
          for (int64_t g = a; g < b; ++g) load(g, t);
          each(s, [](const std::string& x, const std::string& m) { return "vsub " + x + ", " + x + ", " + m; });  // d
          for (int64_t g = a; g < b; ++g) line("vst " + tmp(g - a) + ", " + scr(s, g - a, t));
        }
        reduce_set(s, "sum", "v21", [&](int64_t g, int64_t t) {
          line("vld " + tmp(g - a) + ", " + scr(s, g - a, t));
          line("vmul " + tmp(g - a) + ", " + tmp(g - a) + ", " + tmp(g - a));
        });
      };
      outputs = [&](int64_t s) {
        each(s, [](const std::string&, const std::string& m) { return "vdiv " + m + ", " + m + ", v12"; });  // var
        each(s, [](const std::string&, const std::string& m) { return "vadd " + m + ", " + m + ", v13"; });
        each(s, [](const std::string&, const std::string& m) { return "vsqrt " + m + ", " + m; });  // den
        for (int64_t t = 0; t < nt; ++t) {
          line(std::string(ld(gt)) + " v0, " + at(gb + t * kTile));
          line(std::string(ld(gt)) + " v1, " + at(bb + t * kTile));
          load_scr(s, t);
          each(s, [](const std::string& x, const std::string& m) { return "vdiv " + x + ", " + x + ", " + m; });
          each(s, [](const std::string& x, const std::string&) { return "vmul " + x + ", " + x + ", v0"; });
          each(s, [](const std::string& x, const std::string&) { return "vadd " + x + ", " + x + ", v1"; });
          store_set(s, t);
        }
      };
    }
    first(0);
    for (int64_t s = 0; s < nsets; ++s) {
      if (s + 1 < nsets) first(s + 1);
      middle(s);
      if (s > 0) outputs(s - 1);
    }
    outputs(nsets - 1);
    dma_on(kStreamOutFlag + static_cast<int>(par), hbm(y + b0 * len * eo), vmem(obuf(par)), br * len * eo, "");
  });
}

// maxpool / avgpool: each output pixel's window taps are gathered, row-major in
// (kh, kw), into one row of HBM scratch P[(n,c,oh,ow), kh*KW + kw] by one 3-D DMA
// per (n, kh, kw); then P is a row reduction (lower_rows). Taps outside the image
// are the identity for max (-inf, so the max is over the valid taps) and +0.0 for
// an average with count_include_pad (the recipe's zero taps, divisor KH*KW).
// count_include_pad = 0 with padding compacts a different tap list per border
// pixel, which this layout does not reproduce: refused.
void Emitter::lower_pool(const Node& n) {
  const Placed X = t_.at(n.inputs[0]);
  const auto& k = n.attr_ints("kernel");
  const auto& st = n.attr_ints("strides");
  const auto& pads = n.attr_ints("pads");
  const bool is_max = n.op == OpKind::kMaxPool;
  const bool any_pad = pads[0] || pads[1] || pads[2] || pads[3];
  if (!is_max && any_pad && n.attr_int("count_include_pad") == 0)
    fail(n, "avgpool with padding and count_include_pad=0 is not lowered yet");
  // A maxpool of stride 1 or 2 runs as shifted loads over padded planes, as a
  // depthwise conv does (its window, max for multiply-add).
  std::vector<DwMember> none;
  if (is_max && depthwise_shifted(n, none)) return;
  const int64_t NB = X.type.shape[0], CH = X.type.shape[1], H = X.type.shape[2], W = X.type.shape[3];
  const int64_t OH = n.type.shape[2], OW = n.type.shape[3], KK = k[0] * k[1];
  const int64_t T = NB * CH * OH * OW;
  const DType dt = X.type.dtype;
  const int64_t e = esz(dt), tile = kTileElems * e;
  // Channels per staged band (0: not even one channel fits VMEM: direct HBM gathers);
  // a maxpool band also holds its output (a tile more for the last tile's reads).
  int64_t cb = CH;
  while (cb > 0 && !staging_fits(cb * H * W * e, cb * OH * OW * (is_max ? KK + 1 : KK) * e + align_up(tile, kAlign)))
    cb /= 2;
  // Staged bands go round robin over the cores: at least one band a core when the
  // images alone do not give each core one.
  const int64_t per_image = (cores_ + NB - 1) / NB;  // bands an image needs
  if (cb > 0) cb = std::min(cb, (CH + per_image - 1) / per_image);
  // maxpool: the taps go to KK planes of output pixels in VMEM, reduced elementwise
  // there (max is exact and order-free: num::max flushes operands, NaN is canonical,
  // +0 wins a signed-zero tie), 1024 output pixels a vreg, and only the band's output
  // goes back to HBM.
  const bool planes = is_max && cb > 0;
  const int64_t P = planes ? 0 : place_hbm(align_up(T * KK * e, tile));
  check_addr(n, hbm_top_);
  if (cb == 0 && is_max && any_pad) {
    line("vbcast v0, " + fimm(-INFINITY));
    line(std::string(this->st(dt)) + " v0, " + at(0));
    dma(hbm(P), vmem(0), tile, dim(align_up(T * KK * e, tile) / tile, 0, tile));
    wait_dmas();
  }
  // The taps of band (b, c0): gathers from its channels' planes (offsets in the
  // band's staged input) into the tap planes, or (direct) HBM scratch rows.
  auto band_gathers = [&](int64_t b, int64_t nc) {
    std::vector<Gather> gathers;
    const int64_t band = nc * OH * OW;
    for (int64_t kh = 0; kh < k[0]; ++kh)
      for (int64_t kw = 0; kw < k[1]; ++kw) {
        int64_t oh0, oh1, ow0, ow1;
        tap_range(OH, H, st[0], pads[0], kh, &oh0, &oh1);
        tap_range(OW, W, st[1], pads[1], kw, &ow0, &ow1);
        if (oh0 >= oh1 || ow0 >= ow1) continue;
        const int64_t ih = oh0 * st[0] - pads[0] + kh, iw = ow0 * st[1] - pads[1] + kw;
        const int64_t soff = (ih * W + iw) * e;
        const int64_t doff = ((oh0 * OW + ow0) * KK + kh * k[1] + kw) * e;
        const std::string dims = dim(ow1 - ow0, st[1] * e, KK * e) + dim(oh1 - oh0, st[0] * W * e, OW * KK * e) +
                                 dim(nc, H * W * e, OH * OW * KK * e);
        if (planes) {  // tap plane kh*KW + kw, pixels in output order
          gathers.push_back(Gather{soff, ((kh * k[1] + kw) * band + oh0 * OW + ow0) * e, e,
                                   dim(ow1 - ow0, st[1] * e, e) + dim(oh1 - oh0, st[0] * W * e, OW * e) +
                                       dim(nc, H * W * e, OH * OW * e)});
        } else if (cb) {
          gathers.push_back(Gather{soff, doff, e, dims});
        } else {
          dma(hbm(P + (b * CH * OH * OW * KK) * e + doff), hbm(X.addr + (b * CH * H * W) * e + soff), e, dims);
          wait_dmas();  // the gathers' bounding ranges interleave (race checker)
        }
      }
    return gathers;
  };
  // The band's tap planes at dv reduced into its output at ov, stored from there.
  auto reduce_band = [&](int64_t dv, int64_t ov, int64_t band) {
    for (int64_t i = 0; i * kTileElems < band; ++i) {
      line(std::string(ld(dt)) + " v0, " + at(dv + i * tile));
      for (int64_t t = 1; t < KK; ++t) {
        line(std::string(ld(dt)) + " v1, " + at(dv + t * band * e + i * tile));
        line("vmax v0, v0, v1");
      }
      line(std::string(this->st(dt)) + " v0, " + at(ov + i * tile));
    }
  };
  struct Band {
    int64_t b, c0, nc;  // nc planes from image b's channel c0 on (whole images: across images)
  };
  // The planes' bands: whole images, several a band where three bands' buffers fit and
  // each core keeps four bands at least. A band's gathers (a tap each) hold a DMA
  // engine for the on-chip path's latency whatever their size, so the ring of bands
  // of one image was bound by the engines (the bundled CNN's l1 pool at batch 64:
  // 64 bands of 4 tap gathers, ~750 cycles a band).
  // A band's buffer of `np` planes: its input planes, its tap planes, its output.
  auto src_bytes = [&](int64_t np) { return align_up(np * H * W * e, kAlign); };
  auto taps_bytes = [&](int64_t np) { return align_up(KK * np * OH * OW * e, kAlign); };
  auto buf_of = [&](int64_t np) { return src_bytes(np) + taps_bytes(np) + align_up(np * OH * OW * e + tile, kAlign); };
  int64_t ib = 1;  // images a band
  if (planes && cb == CH)
    while (ib * 2 * 4 * cores_ <= NB &&
           static_cast<uint64_t>(kRingSlots * buf_of(ib * 2 * CH)) <= opt_.target.vmem_bytes)
      ib *= 2;
  std::vector<Band> bands;
  for (int64_t b = 0; b < NB; b += ib)
    for (int64_t c0 = 0; c0 < CH; c0 += cb ? cb : CH)
      bands.push_back(Band{b, c0, ib > 1 ? std::min(ib, NB - b) * CH : cb ? std::min(cb, CH - c0) : CH});
  // maxpool bands in a ring of three buffers: a core's band's taps are gathered while
  // the band before is reduced and stored and the next two load (the bundled CNN's l1
  // pool, v3 batch 8: a load, the gathers and a store in turn were ~1.6 K cycles a
  // band; double-buffered, each band still waited for its own gathers).
  const int64_t src_b = src_bytes(ib * cb), taps_b = taps_bytes(ib * cb), buf_b = buf_of(ib * cb);
  if (planes && bands.size() > 1 && static_cast<uint64_t>(kRingSlots * buf_b) <= opt_.target.vmem_bytes) {
    auto src_of = [&](const Band& u) { return X.addr + (u.b * CH + u.c0) * H * W * e; };
    gathered_stream(
        static_cast<int64_t>(bands.size()),
        [&](int64_t k, int64_t slot, int flag) {
          const Band& u = bands[static_cast<size_t>(k)];
          dma_on(flag, vmem(slot * buf_b), hbm(src_of(u)), u.nc * H * W * e, "");
        },
        [&](int64_t k, int64_t slot, int flag) {
          const Band& u = bands[static_cast<size_t>(k)];
          const int64_t sv = slot * buf_b, dv = sv + src_b;
          if (any_pad) fill_vmem(dv, KK * u.nc * OH * OW * e, -INFINITY, dt);
          run_gathers(sv, dv, band_gathers(u.b, u.nc), flag);
        },
        [&](int64_t k, int64_t slot, int flag) {
          const Band& u = bands[static_cast<size_t>(k)];
          const int64_t band = u.nc * OH * OW, dv = slot * buf_b + src_b, ov = dv + taps_b;
          reduce_band(dv, ov, band);
          dma_on(flag, hbm(t_.at(n.output).addr + (u.b * CH + u.c0) * OH * OW * e), vmem(ov), band * e, "");
        });
    return;
  }
  int64_t unit = 0;
  for (const Band& u : bands) {
    const int64_t b = u.b, c0 = u.c0, nc = u.nc, band = nc * OH * OW;  // output pixels of this band
    if (cb) on_core(unit++);
    const std::vector<Gather> gathers = band_gathers(b, nc);
    // Padding taps: -inf for max (the max is over the valid taps), +0.0 for an
    // average with count_include_pad.
    if (planes) {
      const int64_t dv = gather_in_vmem(X.addr + (b * CH + c0) * H * W * e, nc * H * W * e, KK * band * e, gathers,
                                        any_pad, -INFINITY, dt);
      const int64_t ov = dv + align_up(KK * band * e, kAlign);
      reduce_band(dv, ov, band);
      dma(hbm(t_.at(n.output).addr + (b * CH + c0) * OH * OW * e), vmem(ov), band * e);
      wait_dmas();
    } else if (cb)
      staged_gather(X.addr + (b * CH + c0) * H * W * e, nc * H * W * e, P + (b * CH + c0) * OH * OW * KK * e,
                    nc * OH * OW * KK * e, gathers, any_pad, is_max ? -INFINITY : 0.0f, dt);
  }
  cur_ = 0;
  if (planes) return;
  sync_all();  // the bands' gathers ran on several cores
  const std::string tag = "#pool" + std::to_string(n.id);
  t_[tag] = Placed{TensorType{dt, {T, KK}}, P};
  Node r;
  r.id = n.id;
  r.op = is_max ? OpKind::kReduceMax : OpKind::kReduceMean;
  r.inputs = {tag};
  r.output = n.output;
  r.type = n.type;
  r.attrs["axes"] = Attr::Ints({1});
  lower_rows(r);
}

// Depthwise conv2d (a channel per group, one output channel each) on the VPU:
// as a matmul it is one MXU pass per channel, each with its waits and barriers
// (mobilenet_v2 spent nearly all its time there). Blocks of output pixels, round
// robin over the cores, are whole channels of one image or whole output rows of
// one channel. A block's input channels come into VMEM as one DMA, and each tap
// (kh, kw) is one VMEM -> VMEM gather into its plane of the block's output pixels
// (+0.0 where it falls in the padding), so nothing goes through HBM scratch. Each
// output is then the contract's convolution with K = KH*KW <= R, a single chunk:
// acc = +0.0, then acc + bf16(x_k) * bf16(w_k) in increasing k = kh*KW + kw, each
// product rounded once to fp32 (exact for bf16 operands unless it over- or
// underflows, as on the MXU), each add rounded; the bias is one more add, and
// fused members follow as in the matmul's epilogue. The weights of every tap over
// a block are one VMEM -> VMEM DMA replicating each channel's weight (stride 0).
// Every core keeps the weights (OIHW with I = 1: tap k of channel c at c*KK + k),
// the bias and the members' operands (each replicated over a tile).
void Emitter::load_dw_constants(const Node& n, int64_t ws, int64_t bs, const std::vector<DwMember>& members) {
  const Placed& Wt = t_.at(n.inputs[1]);
  const int64_t CH = Wt.type.shape[0], KK = Wt.type.shape[2] * Wt.type.shape[3];
  for (int c = 0; c < cores_; ++c) {
    on_core(c);
    dma(vmem(ws), hbm(Wt.addr), CH * KK * esz(Wt.type.dtype));
    if (n.inputs.size() > 2) {
      const Placed& B = t_.at(n.inputs[2]);
      dma(vmem(bs), hbm(B.addr), CH * esz(B.type.dtype));
    }
    for (const DwMember& x : members)
      if (x.tile >= 0) replicate_scalar(x.tile, t_.at(x.other).addr, esz(t_.at(x.other).type.dtype));
    wait_dmas();
  }
  cur_ = 0;
}

std::vector<Emitter::DwMember> Emitter::conv_members(const Node& n) const {
  std::vector<DwMember> members;
  std::string run = n.output;
  for (const Node* m : chain_of(n)) {
    DwMember x{m, "", true, -1};
    if (m->inputs.size() == 2) {
      x.run_first = m->inputs[0] == run;
      x.other = m->inputs[x.run_first ? 1 : 0];
    }
    members.push_back(x);
    run = m->output;
  }
  return members;
}

// A single relu or clip member (mobilenet_v2's relu6): the caller may keep its bounds
// in two registers for the whole op (hoisted_bounds) instead of broadcasting them again
// for each tile, two of a depthwise tile's ~35 vector instructions.
bool Emitter::bounds_member(const std::vector<DwMember>& members) {
  return members.size() == 1 && (members[0].m->op == OpKind::kRelu || members[0].m->op == OpKind::kClip);
}
void Emitter::hoisted_bounds(const std::vector<DwMember>& members, int k) {
  const Node& m = *members[0].m;
  line("vbcast v" + std::to_string(k) + ", " + fimm(m.op == OpKind::kRelu ? 0.0f : m.attr_float("min")));
  if (m.op == OpKind::kClip) line("vbcast v" + std::to_string(k + 1) + ", " + fimm(m.attr_float("max")));
}

// The fused members on register v, after the conv's bias (v28-v30 scratch); with
// bounds >= 0, the single relu or clip member's bounds are in v<bounds>, v<bounds + 1>
// (the same vmax, then vmin, as emit_op's).
void Emitter::apply_dw_members(const Node& n, const std::vector<DwMember>& members, int v, int bounds) {
  const std::string r = "v" + std::to_string(v);
  DType cur = n.type.dtype;
  if (bounds >= 0 && bounds_member(members)) {
    if (cur == DType::kBf16) line("vcvt.bf16 " + r + ", " + r);
    line("vmax " + r + ", " + r + ", v" + std::to_string(bounds));
    if (members[0].m->op == OpKind::kClip) line("vmin " + r + ", " + r + ", v" + std::to_string(bounds + 1));
    return;
  }
  for (const DwMember& x : members) {
    if (cur == DType::kBf16) line("vcvt.bf16 " + r + ", " + r);
    if (x.tile >= 0) line(std::string(ld(t_.at(x.other).type.dtype)) + " v30, " + at(x.tile));
    emit_op(*x.m, v, x.run_first ? v : 30, x.run_first ? 30 : v, 28, 29);
    cur = x.m->type.dtype;
  }
}

// Depthwise conv of stride 1 (or 2, through phase planes, below) with every tap a
// shifted load (docs/codegen.md "Depthwise conv2d"). Each channel's input sits in
// VMEM as its padded plane, Wp = pl + W + pr wide, the padding +0.0 (never written by
// a DMA: zeroed once, the top and bottom rows again per block). Output q = oh * Wp +
// ow of a plane reads tap (kh, kw) at q + kh*dh*Wp + kw*dw: for 128 consecutive q one
// load, 8 channels (planes Pb apart) on the 8 sublanes. The outputs at ow >= OW are
// computed and never stored.
// Each block's weights and bias come with its input as tiles whose row s holds
// channel c + s's value in every lane (one VMEM -> VMEM DMA each), loaded into
// registers once per channel group. Four chunks of 128 outputs go through the taps
// together, so the VPU's ALU is not left waiting on one chunk's multiply-add chain.
// Blocks (image, channel groups, output rows) are double-buffered on each core.
bool Emitter::depthwise_shifted(const Node& n, std::vector<DwMember>& members) {
  // A maxpool is the same window over each channel's plane, max for multiply-add: no
  // weights, -inf in the padding, its taps in the order lower_pool's planes take them.
  const bool pool = n.op == OpKind::kMaxPool;
  const Placed X = t_.at(n.inputs[0]), Wt = pool ? X : t_.at(n.inputs[1]);
  const auto& pads = n.attr_ints("pads");
  const std::vector<int64_t> dil = pool ? std::vector<int64_t>{1, 1} : n.attr_ints("dilations");
  const auto& strides = n.attr_ints("strides");
  const int64_t NB = X.type.shape[0], CH = X.type.shape[1], H = X.type.shape[2], W = X.type.shape[3];
  const int64_t KH = pool ? n.attr_ints("kernel")[0] : Wt.type.shape[2];
  const int64_t KW = pool ? n.attr_ints("kernel")[1] : Wt.type.shape[3], KK = KH * KW;
  const int64_t OH = n.type.shape[2], OW = n.type.shape[3];
  constexpr int64_t kWeightRegs = 19;  // v4..v22 hold a channel group's taps, v23 (at most) its bias
  const int64_t S = strides[0];
  if (KK > kWeightRegs || strides[1] != S || S < 1 || S > 2) return false;
  const Node& last = chain_of(n).empty() ? n : *chain_of(n).back();
  const DType dt = X.type.dtype, wt = Wt.type.dtype, ot = last.type.dtype;
  const bool has_bias = !pool && n.inputs.size() > 2;
  const float padv = pool ? -INFINITY : 0.0f;
  const DType bt = has_bias ? t_.at(n.inputs[2]).type.dtype : DType::kF32;
  const int64_t e = esz(dt), ew = esz(wt), eb = esz(bt), eo = esz(ot);
  const int64_t pt = pads[0], pl = pads[1], Wp = pl + W + pads[3];
  const int64_t ngroups = (CH + 7) / 8;
  // With stride S each padded plane is split into S x S phase planes, phase (p, q)
  // holding padded (S*i + p, S*j + q), Wq = ceil(Wp / S) wide: tap (kh, kw) of output
  // (oh, ow) is phase ((kh*dh) % S, (kw*dw) % S) at (oh + kh*dh / S, ow + kw*dw / S),
  // so it is again a shifted load. With S = 1 the padded plane is the only phase.
  const int64_t Wq = (Wp + S - 1) / S;
  // Small strided planes keep the tap gathers: the split adds a stage of DMA latency
  // that their few blocks do not hide (mobilenet_v2 on v3, bf16, b1: 56 x 57 outputs
  // a plane 19.7 K -> 10.5 K cycles, 28 x 29 9.3 K -> 6.4 K, but 14 x 15 4.9 K -> 5.9 K
  // and 7 x 8 4.2 K -> 7.1 K).
  if (S > 1 && OH * Wq < 512) return false;
  const auto rows_in = [&](int64_t rows) { return (rows - 1) * S + (KH - 1) * dil[0] + 1; };
  // Block: gpb channel groups x rows output rows. Its planes are read up to 127 +
  // (KW - 1)*dw elements past their end (outputs never stored).
  struct Layout {
    int64_t gpb, rows, hq, pb, pq, po, img[2], ph[2], out[2], wtl[2], btl[2], ws, bs, end;
  };
  const auto layout = [&](int64_t gpb, int64_t rows) {
    Layout l{};
    l.gpb = gpb;
    l.rows = rows;
    l.hq = (rows_in(rows) + S - 1) / S;
    // The phase split reads up to S*hq rows and one element past Wp.
    // A tap's load reads 128 elements at any offset: a bf16 row of 256 B straddles
    // two of VMEM's 256-byte banks. Planes an odd number of 512 B apart start the 8
    // rows on 8 different bank pairs, so the load takes one pass (an odd number of
    // 256 B took two whenever the row straddled: mobilenet_v2 b8 v3 ~2 a load).
    constexpr int64_t kPlaneGranule = 512;
    l.pb = odd_stride(((S > 1 ? S * l.hq + 1 : rows_in(rows)) * Wp + 128 + (KW - 1) * dil[1]) * e,
                      std::max<int64_t>(128 * e, kPlaneGranule));
    l.pq = S > 1 ? odd_stride((l.hq * Wq + 128 + (KW - 1) * dil[1]) * e, std::max<int64_t>(128 * e, kPlaneGranule))
                 : l.pb;
    l.po = odd_stride(align_up(rows * Wq, 128) * eo, 128 * eo);
    int64_t a = 0;
    const auto take = [&a](int64_t bytes) { return std::exchange(a, a + align_up(bytes, 512)); };
    for (int par = 0; par < 2; ++par) {
      l.img[par] = take(gpb * 8 * l.pb);
      l.ph[par] = S > 1 ? take(S * S * gpb * 8 * l.pq) : l.img[par];
      l.out[par] = take(gpb * 8 * l.po);
      l.wtl[par] = pool ? 0 : take(gpb * KK * kTileElems * ew);
      l.btl[par] = pool ? 0 : take(gpb * kTileElems * eb);
    }
    l.ws = pool ? 0 : take(CH * KK * ew + 8 * KK * ew);  // the last group's rows past CH read these
    l.bs = pool ? 0 : take(CH * eb);
    for (DwMember& x : members)  // a member's operand tile and its one element's staging
      if (!x.other.empty()) x.tile = take(2 * kTileElems * esz(t_.at(x.other).type.dtype));
    l.end = a;
    return l;
  };
  // About 64 K outputs a block, and at least 4 blocks a core where the work allows;
  // a plane's channel groups split into blocks of equal size. A block's DMAs (its
  // input, weight tiles and store, and with stride 2 four phase splits) take ~500
  // cycles each whatever their size, and since the VPU takes a tap a cycle, 32 K
  // outputs computed faster than those held the core's four engines (mobilenet_v2 v3
  // b8: its 112 x 112 -> 56 x 56 conv 57.3 K -> 37.6 K cycles, its first 3x3 conv
  // 41.4 K -> 38.2 K). A maxpool, with no multiply-adds to cover its phase split, had
  // taken 64 K from the start (resnet18's at v3 batch 8 35,179 -> 28,240; 128 K
  // 35,458). Equal blocks: 14 x 14 planes of 48 groups went as 36 + 12, one block a
  // third of the other's work (features.8's 3x3 conv, 13.4 K in 32 K blocks: 17.3 K as
  // 36 + 12, 12.9 K as 24 + 24).
  const int64_t kBlockElems = 64 * kTileElems, want = 4 * cores_;
  int64_t gpb = 1, rows = OH;
  if (8 * OH * Wq <= kBlockElems) {
    gpb = std::min(ngroups, kBlockElems / (8 * OH * Wq));
    gpb = std::max<int64_t>(1, std::min(gpb, (NB * ngroups + want - 1) / want));
    const int64_t nblk = (ngroups + gpb - 1) / gpb;
    gpb = (ngroups + nblk - 1) / nblk;  // equal blocks
  } else {
    rows = std::max<int64_t>(1, kBlockElems / (8 * Wq));
  }
  const int64_t row_blocks = (want + NB * ngroups - 1) / (NB * ngroups);  // a plane needs, for `want` blocks
  rows = std::min(rows, (OH + row_blocks - 1) / row_blocks);
  rows = std::max<int64_t>(1, rows);
  while (static_cast<uint64_t>(layout(gpb, rows).end) > opt_.target.vmem_bytes) {
    if (gpb > 1) gpb = (gpb + 1) / 2;
    else if (rows > 1) rows = (rows + 1) / 2;
    else return false;
  }
  const Layout v = layout(gpb, rows);
  if (!pool) load_dw_constants(n, v.ws, v.bs, members);
  const bool any_pad = pads[0] || pads[1] || pads[2] || pads[3];
  const std::string zst = std::string(st(dt)) + " v2, ";
  // The padding: both input buffers zeroed (-inf for a maxpool) once (the left and
  // right columns stay so).
  if (any_pad)
    for (int c = 0; c < cores_; ++c) {
      on_core(c);
      line("vbcast v2, " + fimm(padv));
      for (int par = 0; par < 2; ++par)
        for (int64_t p = 0; p < v.gpb; ++p)
          for (int64_t q = 0; q < v.pb / e; q += 128)
            line(zst + at(v.img[par] + p * 8 * v.pb + q * e) + ", stride=" + std::to_string(v.pb));
    }
  cur_ = 0;
  struct Block {
    int64_t b, g0, g1, oh0, oh1;
  };
  std::vector<Block> blocks;
  for (int64_t b = 0; b < NB; ++b)
    for (int64_t g = 0; g < ngroups; g += v.gpb)
      for (int64_t oh0 = 0; oh0 < OH; oh0 += v.rows)
        blocks.push_back({b, g, std::min(ngroups, g + v.gpb), oh0, std::min(OH, oh0 + v.rows)});
  const int64_t y = t_.at(last.output).addr;
  constexpr int kSplitFlag = 8;  // f8/f9: a block's phase planes and weight tiles (S > 1)
  // A block's weight tiles: tile (tap t, group g) at (t * gpb + g) tiles, row-major
  // over the block's channels, 128 lanes each; its bias tiles likewise.
  const auto fetch_weights = [&](const Block& k, int64_t par, int flag) {
    const int64_t c0 = k.g0 * 8, nc = std::min(CH, k.g1 * 8) - c0;
    dma_on(flag, vmem(v.wtl[par]), vmem(v.ws + c0 * KK * ew), ew,
           dim(128, 0, ew) + dim(nc, KK * ew, 128 * ew) + dim(KK, ew, v.gpb * kTileElems * ew));
    if (has_bias) dma_on(flag, vmem(v.btl[par]), vmem(v.bs + c0 * eb), eb, dim(128, 0, eb) + dim(nc, eb, 128 * eb));
  };
  // Whether block u brings its weight tiles: with one block of channel groups an image
  // every block has the same, so each core's first two (one a buffer) bring them. Each
  // block's had expanded them again (a VMEM -> VMEM DMA of 128 copies of each weight:
  // mobilenet_v2's 7 x 7 planes, 960 channels x 9 taps, ~4.7 K cycles a block).
  const bool one_channel_block = v.gpb >= ngroups;
  const auto weights_for = [&](int64_t u) { return !one_channel_block || u < 2 * cores_; };
  // The block's padded input rows into img[par] (and with S = 1 its weight tiles).
  const auto fetch = [&](int64_t u, int64_t par) {
    const Block& k = blocks[static_cast<size_t>(u)];
    const int64_t c0 = k.g0 * 8, nc = std::min(CH, k.g1 * 8) - c0;
    const int64_t pr0 = k.oh0 * S, pr1 = pr0 + rows_in(k.oh1 - k.oh0);  // padded input rows
    const int64_t ra = std::max(pr0, pt), rb = std::min(pr1, pt + H);
    const int64_t img = v.img[par];
    // Rows in the top or bottom padding: this buffer's previous block may have had data there.
    const auto zero_rows = [&](int64_t r0, int64_t r1) {
      if (r0 >= r1) return;
      line("vbcast v2, " + fimm(padv));
      for (int64_t g = 0; g < k.g1 - k.g0; ++g)
        for (int64_t q = (r0 - pr0) * Wp; q < (r1 - pr0) * Wp; q += 128)
          line(zst + at(img + g * 8 * v.pb + q * e) + ", stride=" + std::to_string(v.pb));
    };
    zero_rows(pr0, std::min(ra, pr1));
    zero_rows(std::max(rb, pr0), pr1);
    const int flag = kStreamInFlag + static_cast<int>(par);
    if (S == 1 && !pool && weights_for(u)) fetch_weights(k, par, flag);
    if (ra >= rb) return;
    const int64_t src = X.addr + ((k.b * CH + c0) * H + ra - pt) * W * e, dst = img + ((ra - pr0) * Wp + pl) * e;
    if (Wp == W)
      dma_on(flag, vmem(dst), hbm(src), (rb - ra) * W * e, dim(nc, H * W * e, v.pb));
    else
      dma_on(flag, vmem(dst), hbm(src), W * e, dim(rb - ra, W * e, Wp * e) + dim(nc, H * W * e, v.pb));
  };
  // S > 1: the S x S phase planes of img[par] into ph[par] (VMEM -> VMEM), and the
  // weight tiles.
  const auto split = [&](int64_t u, int64_t par) {
    const Block& k = blocks[static_cast<size_t>(u)];
    const int64_t nc = std::min(CH, k.g1 * 8) - k.g0 * 8;
    const int flag = kSplitFlag + static_cast<int>(par);
    for (int64_t p = 0; p < S; ++p)
      for (int64_t q = 0; q < S; ++q)
        dma_on(flag, vmem(v.ph[par] + (p * S + q) * v.gpb * 8 * v.pq), vmem(v.img[par] + (p * Wp + q) * e), e,
               dim(Wq, S * e, e) + dim(v.hq, S * Wp * e, Wq * e) + dim(nc, v.pb, v.pq));
    if (!pool && weights_for(u)) fetch_weights(k, par, flag);
  };
  const auto body = [&](int64_t u, int64_t par) {
    const Block& k = blocks[static_cast<size_t>(u)];
    const int64_t c0 = k.g0 * 8, nc = std::min(CH, k.g1 * 8) - c0, nr = k.oh1 - k.oh0;
    constexpr int kAcc[4] = {0, 2, 24, 26}, kTap[4] = {1, 3, 25, 27};
    const auto vr = [](int64_t r) { return "v" + std::to_string(r); };
    const int64_t breg = 4 + KK;
    // A relu or clip member's bounds in v22, v23 for the block, and +0.0 in v21 (the
    // first tap's add starts from it instead of an accumulator broadcast a chunk), where
    // the taps' weights and the bias leave them free.
    constexpr int kZero = 21, kBounds = 22;
    const bool hoist = !pool && breg < kBounds && bounds_member(members);
    const bool zero_reg = !pool && breg < kZero;
    if (hoist) hoisted_bounds(members, kBounds);
    if (zero_reg) line("vbcast " + vr(kZero) + ", " + fimm(0.0f));
    for (int64_t g = k.g0; g < k.g1; ++g) {
      const int64_t out = v.out[par] + (g - k.g0) * 8 * v.po;
      // Phase plane of tap (kh, kw) for this group's 8 channels.
      const auto plane = [&](int64_t kh, int64_t kw) {
        const int64_t ph = (kh * dil[0] % S) * S + kw * dil[1] % S;
        return v.ph[par] + (ph * v.gpb + g - k.g0) * 8 * v.pq;
      };
      for (int64_t t = 0; t < (pool ? 0 : KK); ++t) {
        line(std::string(ld(wt)) + " " + vr(4 + t) + ", " + at(v.wtl[par] + (t * v.gpb + g - k.g0) * kTileElems * ew));
        if (wt != DType::kBf16) line("vcvt.bf16 " + vr(4 + t) + ", " + vr(4 + t));  // the operands enter as bf16
      }
      if (has_bias) line(std::string(ld(bt)) + " " + vr(breg) + ", " + at(v.btl[par] + (g - k.g0) * kTileElems * eb));
      for (int64_t q0 = 0; q0 < nr * Wq; q0 += 4 * 128) {
        const int U = static_cast<int>(std::min<int64_t>(4, (nr * Wq - q0 + 127) / 128));
        for (int i = 0; i < (pool || zero_reg ? 0 : U); ++i)
          line("vbcast " + vr(kAcc[i]) + ", " + fimm(0.0f));  // +0.0: the partial sum starts there
        const auto tap_at = [&](int64_t kh, int64_t kw, int i) {
          return at(plane(kh, kw) + (q0 + i * 128 + kh * dil[0] / S * Wq + kw * dil[1] / S) * e) +
                 ", stride=" + std::to_string(v.pq);
        };
        if (pool) {
          for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw) {  // the max of the taps in (kh, kw) order (max is exact)
              for (int i = 0; i < U; ++i)
                line(std::string(ld(dt)) + " " + vr(kh + kw ? kTap[i] : kAcc[i]) + ", " + tap_at(kh, kw, i));
              for (int i = 0; kh + kw && i < U; ++i)
                line("vmax " + vr(kAcc[i]) + ", " + vr(kAcc[i]) + ", " + vr(kTap[i]));
            }
        } else {
          // Items (tap, tile), tap-major, so each accumulator adds its taps in (kh, kw)
          // order. Software-pipelined: step j loads item j, converts and multiplies
          // the items before it and adds item j - 3 (j - 4 with a conversion; vmul's
          // latency is 2), so a step is one bundle of a load and two ALU ops and the
          // VPU takes an item a cycle. The tap registers rotate over kRot: a load
          // never waits for the add of its register's previous item.
          struct Item {
            int64_t kh, kw;
            int i;
          };
          std::vector<Item> items;
          for (int64_t kh = 0; kh < KH; ++kh)
            for (int64_t kw = 0; kw < KW; ++kw)
              for (int i = 0; i < U; ++i) items.push_back({kh, kw, i});
          constexpr int kRot[5] = {1, 3, 25, 27, 28};
          const int cv = dt != DType::kBf16 ? 1 : 0;  // the operands enter as bf16
          const auto tap = [&](int64_t j) { return vr(kRot[j % (4 + cv)]); };
          const int64_t N = static_cast<int64_t>(items.size());
          for (int64_t j = 0; j < N + 3 + cv; ++j) {
            if (j < N) line(std::string(ld(dt)) + " " + tap(j) + ", " + tap_at(items[j].kh, items[j].kw, items[j].i));
            if (cv && j >= 1 && j - 1 < N) line("vcvt.bf16 " + tap(j - 1) + ", " + tap(j - 1));
            const int64_t m = j - 1 - cv, a = j - 3 - cv;
            if (m >= 0 && m < N) {
              const Item& x = items[static_cast<size_t>(m)];
              line("vmul " + tap(m) + ", " + tap(m) + ", " + vr(4 + x.kh * KW + x.kw));
            }
            if (a >= 0 && a < N) {
              const Item& x = items[static_cast<size_t>(a)];
              const bool first = x.kh + x.kw == 0;
              line("vadd " + vr(kAcc[x.i]) + ", " + vr(first && zero_reg ? kZero : kAcc[x.i]) + ", " + tap(a));
            }
          }
        }
        for (int i = 0; i < U; ++i) {
          if (has_bias) line("vadd " + vr(kAcc[i]) + ", " + vr(kAcc[i]) + ", " + vr(breg));
          apply_dw_members(n, members, kAcc[i], hoist ? kBounds : -1);
          line(std::string(st(ot)) + " " + vr(kAcc[i]) + ", " + at(out + (q0 + i * 128) * eo) +
               ", stride=" + std::to_string(v.po));
        }
      }
    }
    dma_on(kStreamOutFlag + static_cast<int>(par), hbm(y + ((k.b * CH + c0) * OH + k.oh0) * OW * eo),
           vmem(v.out[par]), OW * eo, dim(nr, Wq * eo, OW * eo) + dim(nc, v.po, OH * OW * eo));
  };
  if (S == 1) {
    double_buffered(static_cast<int64_t>(blocks.size()), fetch, body);
    return true;
  }
  // S > 1, three stages a core: while block k computes, block k + 1's phases split
  // (its input came in earlier) and block k + 2's input comes in.
  for (int core = 0; core < cores_; ++core) {
    cur_ = core;
    std::vector<int64_t> mine;
    for (int64_t u = core; u < static_cast<int64_t>(blocks.size()); u += cores_) mine.push_back(u);
    const size_t m = mine.size();
    for (size_t k = 0; k < std::min<size_t>(2, m); ++k) fetch(mine[k], static_cast<int64_t>(k));
    if (m > 0) {
      wait_flag(kStreamInFlag);
      split(mine[0], 0);
    }
    for (size_t k = 0; k < m; ++k) {
      const int64_t par = static_cast<int64_t>(k % 2);
      wait_flag(kSplitFlag + static_cast<int>(par));  // block k's phases are in; its input buffer is free
      if (k + 2 < m) fetch(mine[k + 2], par);
      if (k + 1 < m) {
        wait_flag(kStreamInFlag + static_cast<int>(1 - par));
        split(mine[k + 1], 1 - par);
      }
      if (k >= 2) wait_flag(kStreamOutFlag + static_cast<int>(par));  // block k - 2's results have gone out
      body(mine[k], par);
    }
    wait_flag(kStreamOutFlag);
    wait_flag(kStreamOutFlag + 1);
  }
  cur_ = 0;
  return true;
}

bool Emitter::lower_depthwise(const Node& n) {
  const Placed X = t_.at(n.inputs[0]), Wt = t_.at(n.inputs[1]);
  const auto& st = n.attr_ints("strides");
  const auto& pads = n.attr_ints("pads");
  const auto& dil = n.attr_ints("dilations");
  const int64_t NB = X.type.shape[0], CH = X.type.shape[1], H = X.type.shape[2], W = X.type.shape[3];
  const int64_t KH = Wt.type.shape[2], KW = Wt.type.shape[3], KK = KH * KW;
  const int64_t OH = n.type.shape[2], OW = n.type.shape[3], OHW = OH * OW;
  if (KK > static_cast<int64_t>(opt_.target.mxu_rows) || NB * CH * OHW == 0) return false;  // chunks: the MXU's
  const std::vector<const Node*>& chain = chain_of(n);
  const Node& last = chain.empty() ? n : *chain.back();
  const DType dt = X.type.dtype, wt = Wt.type.dtype, ot = last.type.dtype;
  const bool has_bias = n.inputs.size() > 2;
  const DType bt = has_bias ? t_.at(n.inputs[2]).type.dtype : DType::kF32;
  const int64_t e = esz(dt), ew = esz(wt), eb = esz(bt), eo = esz(ot);
  std::vector<DwMember> members = conv_members(n);
  if (depthwise_shifted(n, members)) return true;
  // Blocks of up to `blk` outputs: `ncb` whole channels, or (when a channel has
  // more outputs) `rows` output rows of one channel; the input is the block's
  // whole channels either way. Two buffers of each block-sized region: a core
  // fetches block k + 1 while block k computes.
  struct Layout {
    int64_t blk, ncb, rows, img[2], taps[2], wp[2], bp[2], out[2], ws, bs, end;
  };
  const auto layout = [&](int64_t blk) {
    Layout l{};
    l.blk = blk;
    l.ncb = std::max<int64_t>(1, blk / OHW);
    l.rows = OHW <= blk ? OH : blk / OW;
    int64_t a = 0;
    const auto take = [&a](int64_t bytes) { return std::exchange(a, a + align_up(bytes, 512)); };
    for (int par = 0; par < 2; ++par) {
      l.img[par] = take(l.ncb * H * W * e);
      l.taps[par] = take(KK * blk * e);
      l.wp[par] = take(KK * blk * ew);
      l.bp[par] = take(blk * eb);
      l.out[par] = take(blk * eo);
    }
    l.ws = take(CH * KK * ew);
    l.bs = take(CH * eb);
    for (DwMember& x : members)  // a member's operand tile and its one element's staging
      if (!x.other.empty()) x.tile = take(2 * kTileElems * esz(t_.at(x.other).type.dtype));
    l.end = a;
    return l;
  };
  int64_t blk = 16 * kTileElems;
  while (blk >= kTileElems && (blk / OW == 0 || static_cast<uint64_t>(layout(blk).end) > opt_.target.vmem_bytes))
    blk /= 2;
  if (blk < kTileElems) return false;
  const Layout v = layout(blk);

  load_dw_constants(n, v.ws, v.bs, members);
  const bool any_pad = pads[0] || pads[1] || pads[2] || pads[3];
  const int64_t y = t_.at(last.output).addr;
  // Block: channels [c, c + ncb) of image b, output rows [oh0, oh1) of each.
  struct Block {
    int64_t b, c, ncb, oh0, oh1;
  };
  std::vector<Block> blocks;
  for (int64_t b = 0; b < NB; ++b)
    if (OHW <= blk) {
      for (int64_t c = 0; c < CH; c += v.ncb) blocks.push_back({b, c, std::min(v.ncb, CH - c), 0, OH});
    } else {
      for (int64_t c = 0; c < CH; ++c)
        for (int64_t oh0 = 0; oh0 < OH; oh0 += v.rows) blocks.push_back({b, c, 1, oh0, std::min(OH, oh0 + v.rows)});
    }
  // A core's blocks in a software pipeline over the two buffers: while block k
  // computes, block k + 1's taps gather (its input came in earlier) and block
  // k + 2's input comes in. Flags, one a buffer: input, weights and bias, gathers,
  // stores.
  constexpr int kInFlag = kStreamInFlag, kWeightFlag = 10, kGatherFlag = 8, kOutFlag = kStreamOutFlag;
  const auto pixels = [&](const Block& k) { return (k.oh1 - k.oh0) * OW; };
  const auto fetch_input = [&](const Block& k, int par) {
    dma_on(kInFlag + par, vmem(v.img[par]), hbm(X.addr + (k.b * CH + k.c) * H * W * e), k.ncb * H * W * e, "");
  };
  // The weights of all taps (and the bias) over the block's pixels, each replicated
  // by one DMA.
  const auto fetch_weights = [&](const Block& k, int par) {
    const int64_t pix = pixels(k);
    dma_on(kWeightFlag + par, vmem(v.wp[par]), vmem(v.ws + k.c * KK * ew), ew,
           dim(pix, 0, ew) + dim(k.ncb, KK * ew, pix * ew) + dim(KK, ew, blk * ew));
    if (has_bias)
      dma_on(kWeightFlag + par, vmem(v.bp[par]), vmem(v.bs + k.c * eb), eb, dim(pix, 0, eb) + dim(k.ncb, eb, pix * eb));
  };
  const auto gather = [&](const Block& k, int par) {
    const int64_t pix = pixels(k), cnt = k.ncb * pix, taps = v.taps[par], img = v.img[par];
    if (any_pad) {  // taps in the padding read +0.0
      line("vbcast v0, " + fimm(0.0f));
      for (int64_t t = 0; t < KK; ++t)
        for (int64_t i = 0; i < cnt; i += kTileElems)
          line(std::string(this->st(dt)) + " v0, " + at(taps + (t * blk + i) * e));
    }
    for (int64_t kh = 0; kh < KH; ++kh)
      for (int64_t kw = 0; kw < KW; ++kw) {
        int64_t ha, hb, ow0, ow1;
        tap_range(OH, H, st[0], pads[0], kh * dil[0], &ha, &hb);
        tap_range(OW, W, st[1], pads[1], kw * dil[1], &ow0, &ow1);
        ha = std::max(ha, k.oh0);
        hb = std::min(hb, k.oh1);
        if (ha >= hb || ow0 >= ow1) continue;
        const int64_t ih = ha * st[0] - pads[0] + kh * dil[0], iw = ow0 * st[1] - pads[1] + kw * dil[1];
        dma_on(kGatherFlag + par, vmem(taps + ((kh * KW + kw) * blk + (ha - k.oh0) * OW + ow0) * e),
               vmem(img + (ih * W + iw) * e), e,
               dim(ow1 - ow0, st[1] * e, e) + dim(hb - ha, st[0] * W * e, OW * e) + dim(k.ncb, H * W * e, pix * e));
      }
  };
  const auto compute = [&](const Block& k, int par) {
    const int64_t cnt = k.ncb * pixels(k), base = (k.b * CH + k.c) * OHW + k.oh0 * OW;
    const int64_t taps = v.taps[par], wp = v.wp[par], bp = v.bp[par], out = v.out[par];
    for (int64_t t = 0; t < cnt; t += kTileElems) {
      line("vbcast v0, " + fimm(0.0f));  // +0.0: the chunk's partial sum starts there
      for (int64_t q = 0; q < KK; ++q) {
        line(std::string(ld(dt)) + " v1, " + at(taps + (q * blk + t) * e));
        if (dt != DType::kBf16) line("vcvt.bf16 v1, v1");  // the operands enter as bf16
        line(std::string(ld(wt)) + " v2, " + at(wp + (q * blk + t) * ew));
        if (wt != DType::kBf16) line("vcvt.bf16 v2, v2");
        line("vmul v1, v1, v2");
        line("vadd v0, v0, v1");
      }
      if (has_bias) {
        line(std::string(ld(bt)) + " v3, " + at(bp + t * eb));
        line("vadd v0, v0, v3");
      }
      apply_dw_members(n, members, 0);
      line(std::string(this->st(ot)) + " v0, " + at(out + t * eo));
    }
    dma_on(kOutFlag + par, hbm(y + base * eo), vmem(out), cnt * eo, "");
  };
  for (int core = 0; core < cores_; ++core) {
    cur_ = core;
    std::vector<const Block*> mine;
    for (size_t u = static_cast<size_t>(core); u < blocks.size(); u += static_cast<size_t>(cores_))
      mine.push_back(&blocks[u]);
    const size_t m = mine.size();
    for (size_t k = 0; k < std::min<size_t>(2, m); ++k) {
      fetch_input(*mine[k], static_cast<int>(k));
      fetch_weights(*mine[k], static_cast<int>(k));
    }
    if (m > 0) {
      wait_flag(kInFlag);
      gather(*mine[0], 0);
    }
    for (size_t k = 0; k < m; ++k) {
      const int par = static_cast<int>(k % 2);
      wait_flag(kGatherFlag + par);  // block k's taps are in; its input buffer is free
      if (k + 2 < m) fetch_input(*mine[k + 2], par);
      if (k + 1 < m) {
        wait_flag(kInFlag + 1 - par);
        gather(*mine[k + 1], 1 - par);
      }
      wait_flag(kWeightFlag + par);
      if (k >= 2) wait_flag(kOutFlag + par);  // block k - 2's results have gone out
      compute(*mine[k], par);
      if (k + 2 < m) fetch_weights(*mine[k + 2], par);
    }
    wait_flag(kOutFlag);
    wait_flag(kOutFlag + 1);
  }
  cur_ = 0;
  return true;
}

}  // namespace tpusim::compiler::lowering
