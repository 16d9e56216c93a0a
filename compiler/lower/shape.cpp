// Lowerings of the ops that reshape data or reduce along any axis: concat, slice,
// pad, gather (data movement by DMA, no arithmetic), unfolded batchnorm, softmax
// and reductions over a non-innermost axis (reduce_column's order, down the
// sublanes), and average pooling that excludes padded taps.
#include "compiler/lower/emitter.h"

#include <algorithm>
#include <cmath>

#include "isa/asm/instr.h"
#include "isa/numerics/bf16.h"
#include "isa/numerics/fp32.h"

namespace tpusim::compiler::lowering {

namespace {

std::vector<int64_t> dense_strides(const Shape& s, int64_t e) {
  std::vector<int64_t> st(s.size(), e);
  for (size_t d = s.size(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}

}  // namespace

// Element (i0, i1, ...) of `shape` moves from src + sum i_d * src_strides[d] to
// dst + sum i_d * dst_strides[d]. Runs contiguous at both ends become the DMA's
// byte count, neighbouring dims that step evenly merge, the three innermost of
// what is left are the DMA's dims and the rest one DMA each. The caller waits.
void Emitter::copy_nd(int64_t dst, const std::vector<int64_t>& dst_strides, int64_t src,
                      const std::vector<int64_t>& src_strides, const Shape& shape, int64_t e) {
  for (const Gather& g : strided_copies(dst_strides, src_strides, shape, e))
    dma(hbm(dst + g.dst_off), hbm(src + g.src_off), g.run, g.dims);
}

std::vector<Emitter::Gather> Emitter::strided_copies(const std::vector<int64_t>& dst_strides,
                                                     const std::vector<int64_t>& src_strides, const Shape& shape,
                                                     int64_t e) const {
  struct D { int64_t count, s, d; };
  std::vector<D> dims;  // outermost first
  for (size_t k = 0; k < shape.size(); ++k)
    if (shape[k] != 1) dims.push_back({shape[k], src_strides[k], dst_strides[k]});
  if (std::any_of(dims.begin(), dims.end(), [](const D& x) { return x.count == 0; })) return {};
  int64_t bytes = e;
  while (!dims.empty() && dims.back().s == bytes && dims.back().d == bytes) {
    bytes *= dims.back().count;
    dims.pop_back();
  }
  for (size_t k = dims.size(); k-- > 1;) {
    D& in = dims[k];
    const D& out = dims[k - 1];
    if (out.s == in.s * in.count && out.d == in.d * in.count) {
      in.count *= out.count;
      dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(k - 1));
    }
  }
  const size_t inner = std::min<size_t>(isa::kMaxDmaDims, dims.size());
  const size_t outer_dims = dims.size() - inner;
  std::string dimtext;
  for (size_t k = 0; k < inner; ++k) {
    const D& x = dims[dims.size() - 1 - k];
    dimtext += dim(x.count, x.s, x.d);
  }
  int64_t outer = 1;
  for (size_t k = 0; k < outer_dims; ++k) outer *= dims[k].count;
  std::vector<Gather> out;
  for (int64_t o = 0; o < outer; ++o) {
    int64_t rem = o, s = 0, d = 0;
    for (size_t k = outer_dims; k-- > 0;) {
      const int64_t i = rem % dims[k].count;
      rem /= dims[k].count;
      s += i * dims[k].s;
      d += i * dims[k].d;
    }
    out.push_back({s, d, bytes, dimtext});
  }
  return out;
}

// Writes `value` as stored in dtype `t` over `bytes` bytes of HBM: one VMEM tile of
// it, replicated by a stride-0 DMA.
void Emitter::fill(int64_t dst, int64_t bytes, DType t, float value) {
  const float v = t == DType::kBf16 ? num::round_to_bf16(value) : num::flush(value);
  const int64_t tile = kTileElems * esz(t);
  line("vbcast v0, " + fimm(v));
  line(std::string(st(t)) + " v0, " + at(0));
  if (bytes >= tile) dma(hbm(dst), vmem(0), tile, dim(bytes / tile, 0, tile));
  if (bytes % tile) dma(hbm(dst + bytes / tile * tile), vmem(0), bytes % tile);
  wait_dmas();
}

void Emitter::stream_tiles(const std::vector<std::pair<int64_t, DType>>& srcs, int64_t total, int64_t dst, DType odt,
                           const std::vector<std::string>& body) {
  constexpr int64_t kSlot = 8192, kOut = 8 * kSlot;
  for (int64_t base = 0; base < total; base += kTileElems) {
    on_core(base / kTileElems);
    const int64_t cnt = std::min(kTileElems, total - base);
    for (size_t k = 0; k < srcs.size(); ++k)
      dma(vmem(static_cast<int64_t>(k) * kSlot), hbm(srcs[k].first + base * esz(srcs[k].second)), cnt * esz(srcs[k].second));
    wait_dmas();
    for (size_t k = 0; k < srcs.size(); ++k)
      line(std::string(ld(srcs[k].second)) + " v" + std::to_string(k) + ", " + at(static_cast<int64_t>(k) * kSlot));
    for (const auto& l : body) line(l);
    line(std::string(st(odt)) + " v9, " + at(kOut));
    dma(hbm(dst + base * esz(odt)), vmem(kOut), cnt * esz(odt));
    wait_dmas();
  }
  cur_ = 0;
}

void Emitter::lower_concat(const Node& n) {
  const Shape& os = n.type.shape;
  const int64_t axis = n.attr_int("axis");
  const int64_t e = esz(n.type.dtype);
  const int64_t outer = num_elements(Shape(os.begin(), os.begin() + axis));
  const int64_t inner = num_elements(Shape(os.begin() + axis + 1, os.end()));
  const int64_t y = t_.at(n.output).addr;
  int64_t at_elem = 0;
  for (const auto& name : n.inputs) {
    const Placed& X = t_.at(name);
    const int64_t chunk = X.type.shape[static_cast<size_t>(axis)] * inner;
    copy_nd(y + at_elem * e, {os[static_cast<size_t>(axis)] * inner * e, e}, X.addr, {chunk * e, e}, {outer, chunk}, e);
    wait_dmas();  // the operands' bounding ranges in y interleave (race checker)
    at_elem += chunk;
  }
}

void Emitter::lower_slice(const Node& n) {
  const Placed& X = t_.at(n.inputs[0]);
  const auto& starts = n.attr_ints("starts");
  const auto& steps = n.attr_ints("steps");
  const int64_t e = esz(n.type.dtype);
  const auto xs = dense_strides(X.type.shape, e);
  int64_t src = X.addr;
  std::vector<int64_t> ss(xs.size());
  for (size_t d = 0; d < xs.size(); ++d) {
    src += starts[d] * xs[d];
    ss[d] = steps[d] * xs[d];
  }
  copy_nd(t_.at(n.output).addr, dense_strides(n.type.shape, e), src, ss, n.type.shape, e);
  wait_dmas();
}

void Emitter::lower_pad(const Node& n) {
  const Placed& X = t_.at(n.inputs[0]);
  const auto& p = n.attr_ints("pads");
  const int64_t e = esz(n.type.dtype);
  const int64_t y = t_.at(n.output).addr;
  fill(y, num_elements(n.type.shape) * e, n.type.dtype, n.attr_float("value"));
  const auto os = dense_strides(n.type.shape, e);
  int64_t dst = y;
  for (size_t d = 0; d < os.size(); ++d) dst += p[d] * os[d];
  copy_nd(dst, os, X.addr, dense_strides(X.type.shape, e), X.type.shape, e);
  wait_dmas();
}

// gather along `axis` of data [outer, len, inner]: one DMA per index (per run of
// consecutive indices when they are constants), moving the index's inner block for
// every outer position. Constant indices are checked at compile time. Indices
// that are graph inputs live in HBM as i32 (the bundle input's dtype): each block
// of them is DMA'd to SMEM, read with `ld`, made non-negative (+len), range checked
// (out of range: a deliberate division by zero faults the run, naming this op) and
// scaled into the source address register of the DMA.
void Emitter::lower_gather(const Node& n) {
  const Placed& X = t_.at(n.inputs[0]);
  const Shape& xs = X.type.shape;
  const int64_t axis = n.attr_int("axis");
  const int64_t e = esz(X.type.dtype);
  const int64_t outer = num_elements(Shape(xs.begin(), xs.begin() + axis));
  const int64_t len = xs[static_cast<size_t>(axis)];
  const int64_t inner = num_elements(Shape(xs.begin() + axis + 1, xs.end()));
  const int64_t y = t_.at(n.output).addr;
  const int64_t row = inner * e;
  const int64_t ni = num_elements(n.type.shape) / std::max<int64_t>(outer * inner, 1);
  const std::string outer_dim = outer > 1 ? dim(outer, len * row, ni * row) : "";
  if (const Constant* c = g_.find_constant(n.inputs[1])) {
    std::vector<int64_t> v(c->i.size());
    for (size_t q = 0; q < v.size(); ++q) {
      v[q] = c->i[q] < 0 ? c->i[q] + len : c->i[q];
      if (v[q] < 0 || v[q] >= len)
        fail(n, "index " + std::to_string(c->i[q]) + " out of range [0," + std::to_string(len) + ")");
    }
    for (size_t q = 0; q < v.size();) {
      size_t r = 1;
      while (q + r < v.size() && v[q + r] == v[q] + static_cast<int64_t>(r)) ++r;
      dma(hbm(y + static_cast<int64_t>(q) * row), hbm(X.addr + v[q] * row), static_cast<int64_t>(r) * row, outer_dim);
      if (outer > 1) wait_dmas();  // bounding ranges interleave (race checker)
      q += r;
    }
    wait_dmas();
    return;
  }
  const Placed& I = t_.at(n.inputs[1]);
  // An address is unsigned 32-bit s1 + signed 32-bit imm: past 2 GiB, s1 also
  // carries a base (s4) that leaves both in range.
  const int64_t xbytes = num_elements(X.type.shape) * esz(X.type.dtype);
  const int64_t xbase = X.addr <= INT32_MAX ? 0 : std::min<int64_t>(X.addr, UINT32_MAX - xbytes);
  if (xbase < 0 || X.addr - xbase > INT32_MAX) fail(n, "the gathered tensor lies beyond what [s1 + imm] reaches");
  const int64_t block = std::min<int64_t>(ni, std::min<int64_t>(1024, (static_cast<int64_t>(opt_.target.smem_bytes) - kCreditSmemBytes) / 4));
  if (block < 1) fail(n, "no SMEM for the indices");
  for (int64_t q0 = 0; q0 < ni; q0 += block) {
    const int64_t cnt = std::min(block, ni - q0);
    dma("smem:[s0 + 0]", hbm(I.addr + q0 * 4), cnt * 4);
    wait_dmas();
    line("li s2, " + std::to_string(len));
    if (X.addr > INT32_MAX) line("li s4, " + std::to_string(xbase));
    for (int64_t k = 0; k < cnt; ++k) {
      const std::string l = "gather" + std::to_string(n.id) + "_" + std::to_string(labels_++);
      line("ld s1, " + at(k * 4));
      line("bge s1, s0, " + l + "_pos");
      line("add s1, s1, s2");  // a negative index counts from the end
      cs_[cur_] << l << "_pos:\n";
      line("blt s1, s0, " + l + "_bad");
      line("blt s1, s2, " + l + "_ok");
      cs_[cur_] << l << "_bad:\n";
      line("trap " + std::to_string(isa::kTrapIndexOutOfRange) + "  # index out of range");
      cs_[cur_] << l << "_ok:\n";
      line("mul s1, s1, " + std::to_string(row));
      if (X.addr > INT32_MAX) line("add s1, s1, s4");  // s1 + imm reaches X: see xbase
      dma(hbm(y + (q0 + k) * row), "hbm:[s1 + " + std::to_string(X.addr - xbase) + "]", row, outer_dim);
      if (outer > 1) wait_dmas();
    }
    wait_dmas();  // before the next block overwrites SMEM
  }
}

// Unfolded (inference) batchnorm: s_c = div(scale_c, sqrt(add(var_c, eps))) on the
// vector unit into fp32 scratch (an intermediate, never rounded to bf16), then
// mean, s and bias broadcast over x by DMA and y = add(mul(sub(x, mean), s), bias).
void Emitter::lower_batchnorm(const Node& n) {
  const Placed& X = t_.at(n.inputs[0]);
  const Shape& xs = X.type.shape;
  const int64_t C = xs[1];
  const DType pt = t_.at(n.inputs[1]).type.dtype;
  const int64_t S = place_hbm(C * 4);
  check_addr(n, hbm_top_);
  stream_tiles({{t_.at(n.inputs[4]).addr, pt}, {t_.at(n.inputs[1]).addr, pt}}, C, S, DType::kF32,
               {"vbcast v3, " + fimm(n.attr_float("epsilon")), "vadd v3, v0, v3", "vsqrt v3, v3", "vdiv v9, v1, v3"});
  sync_all();
  cur_ = 0;
  Shape view(xs.size() - 1, 1);
  view[0] = C;
  const std::string tag = "#bn" + std::to_string(n.id) + ".";
  t_[tag + "s"] = Placed{TensorType{DType::kF32, view}, S};
  t_[tag + "mean"] = Placed{TensorType{pt, view}, t_.at(n.inputs[3]).addr};
  t_[tag + "bias"] = Placed{TensorType{pt, view}, t_.at(n.inputs[2]).addr};
  const int64_t mb = broadcast_to(n, tag + "mean", xs);
  const int64_t sb = broadcast_to(n, tag + "s", xs);
  const int64_t bb = broadcast_to(n, tag + "bias", xs);
  sync_all();
  stream_tiles({{X.addr, X.type.dtype}, {mb, pt}, {sb, DType::kF32}, {bb, pt}}, num_elements(xs),
               t_.at(n.output).addr, n.type.dtype, {"vsub v4, v0, v1", "vmul v4, v4, v2", "vadd v9, v4, v3"});
}

// softmax / reduce_* over the axis block of `len` elements with `inner` elements
// after it. inner == 1: rows (lower_rows, reduce_row's order). Otherwise the
// recipe is reduce_column's: a vreg holds 8 consecutive positions of the axis
// (sublanes) for 128 consecutive inner positions (lanes); the tiles down the axis
// combine in increasing order into one accumulator (the last tile's missing
// sublanes set to the identity), then vreduce.sublanes does the fixed tree.
void Emitter::lower_axis_op(const Node& n) {
  const Placed& X = t_.at(n.inputs[0]);
  const Shape& xs = X.type.shape;
  const int64_t rank = static_cast<int64_t>(xs.size());
  int64_t a0, a1;
  if (n.op == OpKind::kSoftmax) {
    a0 = n.attr_int("axis");
    if (a0 < 0) a0 += rank;
    a1 = a0;
  } else {
    const auto& axes = n.attr_ints("axes");
    if (axes.empty()) fail(n, "no reduction axes");
    a0 = axes.front();
    a1 = axes.back();
  }
  const int64_t outer = num_elements(Shape(xs.begin(), xs.begin() + a0));
  const int64_t len = num_elements(Shape(xs.begin() + a0, xs.begin() + a1 + 1));
  const int64_t inner = num_elements(Shape(xs.begin() + a1 + 1, xs.end()));
  if (len == 1 && n.op != OpKind::kSoftmax) return lower_unit_axis(n);
  if (inner != 1) return lower_columns(n, outer, len, inner);
  if (a1 == rank - 1 && n.op != OpKind::kSoftmax) return lower_rows(n);
  // The axis block is innermost once trailing 1s are dropped: a 2-D view.
  const std::string tag = "#rows" + std::to_string(n.id);
  t_[tag] = Placed{TensorType{X.type.dtype, {outer, len}}, X.addr};
  Node r = n;
  r.inputs[0] = tag;
  if (n.op == OpKind::kSoftmax) r.attrs["axis"] = Attr::Int(1);
  else r.attrs["axes"] = Attr::Ints({1});
  lower_rows(r);
}

// A reduction over axes of one element: the reference's tree over that element and
// the identity padding (reduce_column or reduce_row with n = 1) leaves x (+) identity,
// add(x, +0.0) for a sum (-0 becomes +0, subnormals flush), max(x, -inf) for a max
// (NaN canonical), and a mean divides that by 1. The elements keep their order, so
// this runs over dense tiles like an elementwise op; as columns of one row it took
// a sublane reduction per 128 elements (a [1, 203536] sum over axis 0 on v3-8: 33,178
// cycles).
void Emitter::lower_unit_axis(const Node& n) {
  const Placed& X = t_.at(n.inputs[0]);
  const DType xt = X.type.dtype, ot = n.type.dtype;
  const int64_t ex = esz(xt), eo = esz(ot);
  const int64_t total = num_elements(X.type.shape);
  const int64_t tiles = (total + kTileElems - 1) / kTileElems;
  // Two blocks in and two out, in a quarter of VMEM at most.
  const int64_t T = std::max<int64_t>(
      1, std::min({kElementwiseBlockTiles, tiles, static_cast<int64_t>(opt_.target.vmem_bytes) / (16 * kTileElems * 4)}));
  const int64_t buf = T * kTileElems * 4;  // a block of fp32 at most
  const int64_t y = t_.at(n.output).addr;
  const bool max = n.op == OpKind::kReduceMax;
  sync_all();
  double_buffered(
      (tiles + T - 1) / T,
      [&](int64_t blk, int64_t par) {
        const int64_t base = blk * T * kTileElems, cnt = std::min(T * kTileElems, total - base);
        dma_on(kStreamInFlag + static_cast<int>(par), vmem(2 * par * buf), hbm(X.addr + base * ex), cnt * ex, "");
      },
      [&](int64_t blk, int64_t par) {
        const int64_t base = blk * T * kTileElems, cnt = std::min(T * kTileElems, total - base);
        line("vbcast v30, " + (max ? fimm(-INFINITY) : std::string("0.0")));
        if (n.op == OpKind::kReduceMean) line("vbcast v31, 1.0");
        for (int64_t t = 0; t * kTileElems < cnt; ++t) {
          const std::string v = "v" + std::to_string(t % 8);  // eight tiles in flight
          line(std::string(ld(xt)) + " " + v + ", " + at(2 * par * buf + t * kTileElems * ex));
          line(std::string(max ? "vmax " : "vadd ") + v + ", " + v + ", v30");
          if (n.op == OpKind::kReduceMean) line("vdiv " + v + ", " + v + ", v31");
          line(std::string(st(ot)) + " " + v + ", " + at((2 * par + 1) * buf + t * kTileElems * eo));
        }
        dma_on(kStreamOutFlag + static_cast<int>(par), hbm(y + base * eo), vmem((2 * par + 1) * buf), cnt * eo, "");
      });
}

void Emitter::lower_columns(const Node& n, int64_t outer, int64_t len, int64_t inner) {
  const Placed& X = t_.at(n.inputs[0]);
  const DType xt = X.type.dtype, ot = n.type.dtype;
  const int64_t ex = esz(xt), eo = esz(ot);
  const int64_t nt = (len + 7) / 8;
  const int64_t rem = len - (nt - 1) * 8;  // sublanes of the last tile
  constexpr int64_t kTile = 4096;
  const int64_t xb = 0, sb = nt * kTile, ob = 2 * nt * kTile;
  if (static_cast<uint64_t>(ob + nt * kTile) > opt_.target.vmem_bytes)
    fail(n, "axis of " + std::to_string(len) + " elements too long for VMEM");
  const int64_t y = t_.at(n.output).addr;
  const bool softmax = n.op == OpKind::kSoftmax;
  sync_all();
  for (cur_ = 0; cur_ < cores_; ++cur_) {
    if (rem < 8) line("vmask m1, " + std::to_string(rem) + ", 128");
    line("vbcast v20, " + fimm(-INFINITY));
    line("vbcast v21, 0.0");
    line("vbcast v12, " + fimm(static_cast<float>(len)));
  }
  cur_ = 0;
  auto reduce = [&](const char* kind, const char* ident, const std::string& acc, auto load_tile) {
    for (int64_t t = 0; t < nt; ++t) {
      load_tile(t);
      if (t == nt - 1 && rem < 8) line(std::string("vsel v1, m1, v1, ") + ident);
      if (t == 0) line("vmov " + acc + ", v1");
      else line(std::string(kind[0] == 's' ? "vadd " : "vmax ") + acc + ", " + acc + ", v1");
    }
    line(std::string("vreduce.sublanes.") + kind + " " + acc + ", " + acc);
  };
  if (!softmax) return lower_column_reduce(n, outer, len, inner, reduce);
  // Softmax: one lane block of one outer index per unit, the whole axis in VMEM.
  auto load_x = [&](int64_t t) { line(std::string(ld(xt)) + " v1, " + at(xb + t * kTile)); };
  int64_t unit = 0;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j0 = 0; j0 < inner; j0 += 128) {
      on_core(unit++);
      const int64_t w = std::min<int64_t>(128, inner - j0);
      for (int64_t t = 0; t < nt; ++t)
        dma(vmem(xb + t * kTile), hbm(X.addr + ((o * len + 8 * t) * inner + j0) * ex), w * ex,
            dim(std::min<int64_t>(8, len - 8 * t), inner * ex, 128 * ex));
      wait_dmas();
      softmax_tiles(nt, sb, kTile, reduce, load_x, [&](int64_t t) {
        line(std::string(st(ot)) + " v1, " + at(ob + t * kTile));
        const int64_t rows = std::min<int64_t>(8, len - 8 * t);
        const int64_t dst = y + ((o * len + 8 * t) * inner + j0) * eo;
        if (cores_ > 1 && inner > 128) {
          // Another core writes the neighbouring lane blocks of these rows: one
          // DMA per row keeps each bounding range to its own bytes (race checker).
          for (int64_t r = 0; r < rows; ++r)
            dma(hbm(dst + r * inner * eo), vmem(ob + t * kTile + r * 128 * eo), w * eo);
        } else {
          dma(hbm(dst), vmem(ob + t * kTile), w * eo, dim(rows, 128 * eo, inner * eo));
        }
      });
      wait_dmas();
    }
  cur_ = 0;
}

// reduce_* down a non-innermost axis block, streamed: a unit is up to LB blocks of
// 128 inner positions (lanes) of one outer index, fetched as one DMA per 8 axis
// positions (8 rows of LB x 128 lanes each, read back as tiles by a strided vld), the
// next unit's fetch in flight while this one adds, and its results stored while the
// next one adds. Per 128-lane block the tiles, their order and the sublane tree are
// lower_columns' (reduce_column's recipe), so the bits are the same; one tile per DMA
// with a wait each way made a 16 MiB reduction over an axis of 1 run at ~1 GB/s.
template <typename Reduce>
void Emitter::lower_column_reduce(const Node& n, int64_t outer, int64_t len, int64_t inner, Reduce& reduce) {
  const Placed& X = t_.at(n.inputs[0]);
  const DType xt = X.type.dtype, ot = n.type.dtype;
  const int64_t ex = esz(xt), eo = esz(ot);
  const int64_t nt = (len + 7) / 8;
  constexpr int64_t kTile = 4096;
  const int64_t y = t_.at(n.output).addr;
  // Lane blocks per unit: as many as two input and two output buffers leave room for,
  // up to 64 (a unit of 8 axis positions is then 8 runs of 32 KiB: long enough that the
  // DMA latency, paid once per unit, stays under its transfer time).
  const int64_t per_block = 2 * nt * 8 * 128 * ex + 2 * kTile;
  const int64_t LB = std::max<int64_t>(1, std::min<int64_t>({64, static_cast<int64_t>(opt_.target.vmem_bytes) / per_block,
                                                              (inner + 127) / 128}));
  const int64_t row_bytes = LB * 128 * ex;          // one axis position of a unit in VMEM
  const int64_t ibytes = nt * 8 * row_bytes;         // a unit's input buffer
  const int64_t obytes = LB * kTile;
  const int64_t ib0 = 0, ob0 = 2 * ibytes;
  if (static_cast<uint64_t>(ob0 + 2 * obytes) > opt_.target.vmem_bytes)
    fail(n, "axis of " + std::to_string(len) + " elements too long for VMEM");
  struct Unit { int64_t o, j0, w; };  // outer index, first lane, lanes
  std::vector<Unit> units;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j0 = 0; j0 < inner; j0 += LB * 128) units.push_back({o, j0, std::min(LB * 128, inner - j0)});
  auto fetch = [&](int64_t k, int64_t par) {
    const Unit& u = units[static_cast<size_t>(k)];
    for (int64_t t = 0; t < nt; ++t)
      dma_on(kStreamInFlag + static_cast<int>(par), vmem(ib0 + par * ibytes + t * 8 * row_bytes),
             hbm(X.addr + ((u.o * len + 8 * t) * inner + u.j0) * ex), u.w * ex,
             dim(std::min<int64_t>(8, len - 8 * t), inner * ex, row_bytes));
  };
  double_buffered(static_cast<int64_t>(units.size()), fetch, [&](int64_t k, int64_t par) {
    const Unit& u = units[static_cast<size_t>(k)];
    const int64_t buf = ib0 + par * ibytes, out = ob0 + par * obytes;
    const int64_t nb = (u.w + 127) / 128;
    for (int64_t b = 0; b < nb; ++b) {
      reduce(n.op == OpKind::kReduceMax ? "max" : "sum", n.op == OpKind::kReduceMax ? "v20" : "v21", "v10",
             [&](int64_t t) {
               line(std::string(ld(xt)) + " v1, " + at(buf + t * 8 * row_bytes + b * 128 * ex) +
                    ", stride=" + std::to_string(row_bytes));
             });
      if (n.op == OpKind::kReduceMean) line("vdiv v10, v10, v12");
      line(std::string(st(ot)) + " v10, " + at(out + b * kTile));
    }
    // Sublane 0 of each block's tile holds its 128 results.
    const int64_t full = u.w / 128;
    if (full > 0)
      dma_on(kStreamOutFlag + static_cast<int>(par), hbm(y + (u.o * inner + u.j0) * eo), vmem(out), 128 * eo,
             dim(full, kTile, 128 * eo));
    if (u.w % 128)
      dma_on(kStreamOutFlag + static_cast<int>(par), hbm(y + (u.o * inner + u.j0 + full * 128) * eo),
             vmem(out + full * kTile), (u.w % 128) * eo, "");
  });
}

// avgpool with padding and count_include_pad = 0: each output pixel's valid taps,
// row-major in (kh, kw), packed from position 0 of its row of scratch (the recipe's
// compacted tap list; the rest of the row is never written and reads +0.0, the
// identity reduce_row pads with). Pixels whose valid kh (kw) range is the same form
// runs of output rows (columns), gathered by one 3-D DMA per (image, run pair,
// tap). Sums go to fp32 scratch (lower_rows), each pixel's tap count to another
// (stride-0 DMAs of a broadcast count), then y = div(sum, count).
void Emitter::lower_avgpool_exclude_pad(const Node& n) {
  const Placed X = t_.at(n.inputs[0]);
  const auto& k = n.attr_ints("kernel");
  const auto& stv = n.attr_ints("strides");
  const auto& pads = n.attr_ints("pads");
  const int64_t NB = X.type.shape[0], CH = X.type.shape[1], H = X.type.shape[2], W = X.type.shape[3];
  const int64_t OH = n.type.shape[2], OW = n.type.shape[3], KK = k[0] * k[1];
  const int64_t T = NB * CH * OH * OW;
  const DType dt = X.type.dtype;
  const int64_t e = esz(dt);
  struct Run { int64_t o0, o1, a, b; };  // outputs [o0, o1) whose valid taps are [a, b)
  auto runs = [](int64_t out, int64_t in, int64_t stride, int64_t pad, int64_t kern) {
    std::vector<Run> r;
    for (int64_t o = 0; o < out; ++o) {
      const int64_t a = std::max<int64_t>(0, pad - o * stride), b = std::min<int64_t>(kern, in + pad - o * stride);
      if (!r.empty() && r.back().a == a && r.back().b == b) r.back().o1 = o + 1;
      else r.push_back({o, o + 1, a, b});
    }
    return r;
  };
  const auto rh = runs(OH, H, stv[0], pads[0], k[0]), rw = runs(OW, W, stv[1], pads[1], k[1]);
  for (const Run& a : rh)
    for (const Run& b : rw)
      if ((a.b - a.a) * (b.b - b.a) <= (KK - 1) / 128 * 128)
        fail(n, "windows of more than 128 taps whose valid taps fit fewer 128-lane tiles are not lowered");
  const int64_t P = place_hbm(T * KK * e);
  const int64_t Cn = place_hbm(T * 4), S = place_hbm(T * 4);
  check_addr(n, hbm_top_);
  zero_if_reused(P, T * KK * e, dt);
  // Tap counts: one VMEM tile per distinct count.
  std::map<int64_t, int64_t> slot;
  for (const Run& a : rh)
    for (const Run& b : rw) {
      const int64_t cnt = (a.b - a.a) * (b.b - b.a);
      if (!slot.count(cnt)) {
        const int64_t s = static_cast<int64_t>(slot.size()) * 4096;
        slot[cnt] = s;
        line("vbcast v0, " + fimm(static_cast<float>(cnt)));
        line("vst v0, " + at(s));
      }
      dma(hbm(Cn + (a.o0 * OW + b.o0) * 4), vmem(slot[cnt]), 4,
          dim(b.o1 - b.o0, 0, 4) + dim(a.o1 - a.o0, 0, OW * 4) + dim(NB * CH, 0, OH * OW * 4));
      wait_dmas();
    }
  for (int64_t img = 0; img < NB; ++img)
    for (const Run& a : rh)
      for (const Run& b : rw) {
        const int64_t wk = b.b - b.a;
        for (int64_t kh = a.a; kh < a.b; ++kh)
          for (int64_t kw = b.a; kw < b.b; ++kw) {
            const int64_t ih = a.o0 * stv[0] - pads[0] + kh, iw = b.o0 * stv[1] - pads[1] + kw;
            const int64_t src = X.addr + ((img * CH * H + ih) * W + iw) * e;
            const int64_t dst = P + (((img * CH * OH + a.o0) * OW + b.o0) * KK + (kh - a.a) * wk + (kw - b.a)) * e;
            dma(hbm(dst), hbm(src), e,
                dim(b.o1 - b.o0, stv[1] * e, KK * e) + dim(a.o1 - a.o0, stv[0] * W * e, OW * KK * e) +
                    dim(CH, H * W * e, OH * OW * KK * e));
            wait_dmas();  // the gathers' bounding ranges interleave (race checker)
          }
      }
  const std::string tag = "#pool" + std::to_string(n.id);
  t_[tag] = Placed{TensorType{dt, {T, KK}}, P};
  t_[tag + ".sum"] = Placed{TensorType{DType::kF32, {T, 1}}, S};
  Node r;
  r.id = n.id;
  r.op = OpKind::kReduceSum;
  r.inputs = {tag};
  r.output = tag + ".sum";
  r.type = TensorType{DType::kF32, {T, 1}};
  r.attrs["axes"] = Attr::Ints({1});
  r.attrs["keepdims"] = Attr::Int(1);
  lower_rows(r);
  sync_all();
  cur_ = 0;
  stream_tiles({{S, DType::kF32}, {Cn, DType::kF32}}, T, t_.at(n.output).addr, n.type.dtype, {"vdiv v9, v0, v1"});
}

}  // namespace tpusim::compiler::lowering
