#include "compiler/lower/lower.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <sstream>

#include "compiler/passes/passes.h"
#include "isa/asm/assembler.h"
#include "isa/numerics/bf16.h"

namespace tpusim::compiler {
namespace {

// One DMA completion flag, waited on with the running count of every DMA issued so
// far: completion order is not program order, so a count covering all of them is
// what makes the data usable (docs/isa.md, synchronisation rule 2).
constexpr const char* kDmaFlag = "f1";
constexpr int64_t kTileElems = 8 * 128;
constexpr int64_t kAlign = 4096;

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

struct Placed {
  TensorType type;
  int64_t addr = 0;  // HBM byte address, dense row major
};

class Emitter {
 public:
  Emitter(const Graph& g, const LowerOptions& o)
      : g_(g), opt_(o), cores_(std::max(1, o.cores)), cs_(static_cast<size_t>(cores_)),
        dmas_(static_cast<size_t>(cores_)), flag_dmas_(static_cast<size_t>(cores_)) {}

  LowerResult run();

 private:
  int64_t esz(DType t) const { return t == DType::kBf16 ? 2 : 4; }
  const char* ld(DType t) const { return t == DType::kBf16 ? "vld.bf16" : "vld"; }
  const char* st(DType t) const { return t == DType::kBf16 ? "vst.bf16" : "vst"; }
  [[noreturn]] void fail(const Node& n, const std::string& why) const {
    throw CompileError(g_.name + ": node '" + n.output + "' (#" + std::to_string(n.id) + ", " + op_name(n.op) +
                       "): " + why);
  }
  int64_t place_hbm(int64_t bytes) {
    const int64_t a = hbm_top_;
    hbm_top_ = align_up(hbm_top_ + std::max<int64_t>(bytes, 1), kAlign);
    return a;
  }
  // Addresses are written as [s0 + imm] with a signed 32-bit imm.
  void check_addr(const Node& n, int64_t a) const {
    if (a > INT32_MAX) fail(n, "HBM addresses beyond 2 GiB are not supported by the lowering yet");
  }
  void line(const std::string& s) { cs_[cur_] << "  " << s << "\n"; }
  void dma(const std::string& dst, const std::string& src, int64_t bytes, const std::string& dims = "") {
    cs_[cur_] << "  dma " << dst << ", " << src << ", bytes=" << bytes << dims << ", flag=" << kDmaFlag << "\n";
    ++dmas_[cur_];
  }
  // A DMA on its own flag fF (a double buffer's), waited on by wait_flag(F).
  void dma_on(int flag, const std::string& dst, const std::string& src, int64_t bytes, const std::string& dims) {
    cs_[cur_] << "  dma " << dst << ", " << src << ", bytes=" << bytes << dims << ", flag=f" << flag << "\n";
    ++flag_dmas_[cur_][flag];
  }
  void wait_flag(int flag) { line("wait f" + std::to_string(flag) + ", " + std::to_string(flag_dmas_[cur_][flag])); }
  void wait_dmas() { line("wait " + std::string(kDmaFlag) + ", " + std::to_string(dmas_[cur_])); }
  // Every core waits for every other (the work of a node is split across cores;
  // what one core's DMAs wrote, the others may read only after this).
  void sync_all() {
    if (cores_ == 1) return;
    for (cur_ = 0; cur_ < cores_; ++cur_) line("barrier");
    cur_ = 0;
  }
  // Independent units of work go round robin over the cores.
  void on_core(int64_t unit) { cur_ = static_cast<int>(unit % cores_); }
  static std::string hbm(int64_t a) { return "hbm:[s0 + " + std::to_string(a) + "]"; }
  static std::string vmem(int64_t a) { return "vmem:[s0 + " + std::to_string(a) + "]"; }
  static std::string at(int64_t a) { return "[s0 + " + std::to_string(a) + "]"; }
  static std::string dim(int64_t count, int64_t src_stride, int64_t dst_stride) {
    return ", dim=" + std::to_string(count) + ":" + std::to_string(src_stride) + ":" + std::to_string(dst_stride);
  }
  static std::string fimm(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", u);
    return buf;
  }

  int64_t broadcast_to(const Node& n, const std::string& name, const Shape& out_shape);
  void lower_elementwise(const Node& n);
  void lower_matmul(const Node& n);
  void lower_copy(const Node& n);
  void lower_rows(const Node& n);
  void lower_conv(const Node& n);
  void lower_transpose(const Node& n);
  void lower_pool(const Node& n);

  const Graph& g_;
  const LowerOptions& opt_;
  std::ostringstream out_;
  int cores_ = 1;
  int cur_ = 0;  // the core whose program the code goes to
  std::vector<std::ostringstream> cs_;
  std::map<std::string, Placed> t_;
  int64_t hbm_top_ = 0;
  std::vector<int64_t> dmas_;
  std::vector<std::map<int, int64_t>> flag_dmas_;
};

// Copies tensor `name` broadcast (numpy rules) to `out_shape` into fresh HBM
// scratch with HBM->HBM DMAs, one per run of output rows whose source rows advance
// by a constant stride; returns its address. The same address if no broadcast is
// needed.
int64_t Emitter::broadcast_to(const Node& n, const std::string& name, const Shape& out_shape) {
  const Placed& p = t_.at(name);
  if (p.type.shape == out_shape) return p.addr;
  const int64_t e = esz(p.type.dtype);
  const size_t rank = out_shape.size();
  Shape in(rank, 1);
  const size_t off = rank - p.type.shape.size();
  for (size_t d = 0; d < p.type.shape.size(); ++d) in[off + d] = p.type.shape[d];
  std::vector<int64_t> in_stride(rank, 0);
  int64_t s = e;
  for (size_t d = rank; d-- > 0;) {
    in_stride[d] = in[d] == 1 ? 0 : s;
    s *= in[d];
  }
  const int64_t L = rank ? out_shape[rank - 1] : 1;
  const int64_t rows = rank ? num_elements(out_shape) / std::max<int64_t>(L, 1) : 1;
  const int64_t dst = place_hbm(num_elements(out_shape) * e);
  check_addr(n, dst + num_elements(out_shape) * e);
  std::vector<int64_t> src_row(rows);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t rem = r, a = 0;
    for (size_t d = rank - 1; d-- > 0;) {
      a += (rem % out_shape[d]) * in_stride[d];
      rem /= out_shape[d];
    }
    src_row[r] = p.addr + a;
  }
  const bool inner_bcast = rank && in[rank - 1] == 1 && L != 1;
  const int64_t row_bytes = L * e;
  for (int64_t r = 0; r < rows;) {
    int64_t cnt = 1;
    const int64_t step = r + 1 < rows ? src_row[r + 1] - src_row[r] : 0;
    while (r + cnt < rows && src_row[r + cnt] - src_row[r + cnt - 1] == step && cnt < 65535) ++cnt;
    std::string dims;
    int64_t bytes = row_bytes;
    if (inner_bcast) {
      bytes = e;
      dims += dim(L, 0, e);
    }
    if (cnt > 1) dims += dim(cnt, step, row_bytes);
    dma(hbm(dst + r * row_bytes), hbm(src_row[r]), bytes, dims);
    r += cnt;
  }
  wait_dmas();
  return dst;
}

// Elementwise ops: 8x128 tiles streamed HBM -> VMEM -> vector unit -> HBM. A ragged
// last tile moves only its bytes; the lanes past it compute on stale VMEM and are
// never stored back.
void Emitter::lower_elementwise(const Node& n) {
  const Shape& os = n.type.shape;
  const int64_t total = num_elements(os);
  std::vector<int64_t> src;
  std::vector<DType> sdt;
  const size_t nin = (n.op == OpKind::kAdd || n.op == OpKind::kSub || n.op == OpKind::kMul || n.op == OpKind::kDiv) ? 2 : 1;
  for (size_t i = 0; i < nin; ++i) {
    src.push_back(broadcast_to(n, n.inputs[i], os));
    sdt.push_back(t_.at(n.inputs[i]).type.dtype);
  }
  const int64_t dst = t_.at(n.output).addr;
  const DType odt = n.type.dtype;
  constexpr int64_t kIn0 = 0, kIn1 = 8192, kOut = 16384;
  sync_all();
  for (int64_t base = 0; base < total; base += kTileElems) {
    on_core(base / kTileElems);
    const int64_t cnt = std::min(kTileElems, total - base);
    for (size_t i = 0; i < nin; ++i) dma(vmem(i ? kIn1 : kIn0), hbm(src[i] + base * esz(sdt[i])), cnt * esz(sdt[i]));
    wait_dmas();
    for (size_t i = 0; i < nin; ++i) line(std::string(ld(sdt[i])) + " v" + std::to_string(i) + ", " + at(i ? kIn1 : kIn0));
    switch (n.op) {
      case OpKind::kAdd: line("vadd v2, v0, v1"); break;
      case OpKind::kSub: line("vsub v2, v0, v1"); break;
      case OpKind::kMul: line("vmul v2, v0, v1"); break;
      case OpKind::kDiv: line("vdiv v2, v0, v1"); break;
      case OpKind::kRelu: line("vbcast v3, 0.0"); line("vmax v2, v0, v3"); break;
      case OpKind::kTanh: line("vtanh v2, v0"); break;
      case OpKind::kExp: line("vexp v2, v0"); break;
      case OpKind::kLog: line("vlog v2, v0"); break;
      case OpKind::kSqrt: line("vsqrt v2, v0"); break;
      case OpKind::kRsqrt: line("vrsqrt v2, v0"); break;
      case OpKind::kErf: line("verf v2, v0"); break;
      case OpKind::kNeg: line("vneg v2, v0"); break;
      case OpKind::kIdentity:
      case OpKind::kCast: line("vmov v2, v0"); break;
      case OpKind::kSigmoid:  // div(1, add(1, exp(neg(x))))
        line("vneg v3, v0"); line("vexp v3, v3"); line("vbcast v4, 1.0"); line("vadd v3, v4, v3");
        line("vdiv v2, v4, v3");
        break;
      case OpKind::kGelu:  // t = x / fp32(sqrt 2); v = x * (erf(t) + 1); y = v * 0.5
        line("vbcast v3, " + fimm(1.41421354f)); line("vdiv v3, v0, v3"); line("verf v3, v3");
        line("vbcast v4, 1.0"); line("vadd v3, v3, v4"); line("vmul v3, v0, v3"); line("vbcast v4, 0.5");
        line("vmul v2, v3, v4");
        break;
      case OpKind::kClip:
        line("vbcast v3, " + fimm(n.attr_float("min"))); line("vbcast v4, " + fimm(n.attr_float("max")));
        line("vmax v3, v0, v3"); line("vmin v2, v3, v4");
        break;
      case OpKind::kPow: {
        const float p = n.attr_float("exponent");
        if (p == 0.5f) line("vsqrt v2, v0");
        else if (p == 1.0f) line("vmov v2, v0");
        else if (p == 2.0f) line("vmul v2, v0, v0");
        else if (p == 3.0f) { line("vmul v3, v0, v0"); line("vmul v2, v3, v0"); }
        else fail(n, "exponent " + std::to_string(p) + " is not lowered");
        break;
      }
      default: fail(n, "op is not supported by the lowering yet");
    }
    line(std::string(st(odt)) + " v2, " + at(kOut));
    dma(hbm(dst + base * esz(odt)), vmem(kOut), cnt * esz(odt));
    wait_dmas();
  }
}

// Data movement whose dense bytes do not change (reshape, flatten).
void Emitter::lower_copy(const Node& n) {
  const Placed& s = t_.at(n.inputs[0]);
  const int64_t bytes = num_elements(n.type.shape) * esz(n.type.dtype);
  constexpr int64_t kMaxDma = int64_t{1} << 30;
  for (int64_t o = 0; o < bytes; o += kMaxDma) dma(hbm(t_.at(n.output).addr + o), hbm(s.addr + o), std::min(kMaxDma, bytes - o));
  wait_dmas();
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
  const int64_t xb = 0, sb = xb + nt * kTile, gb = sb + nt * kTile, bb = gb + nt * kTile, ob = bb + nt * kTile;
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
  auto load_x = [&](int64_t t) { line(std::string(ld(xt)) + " v1, " + at(xb + t * kTile)); };
  auto load_s = [&](int64_t t) { line("vld v1, " + at(sb + t * kTile)); };
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    on_core(r0 / 8);
    const int64_t rg = std::min<int64_t>(8, rows - r0);
    for (int64_t t = 0; t < nt; ++t)
      dma(vmem(xb + t * kTile), hbm(X.addr + (r0 * len + t * 128) * ex), std::min<int64_t>(128, len - t * 128) * ex,
          dim(rg, len * ex, 128 * ex));
    wait_dmas();
    switch (n.op) {
      case OpKind::kSoftmax:  // m = max; e = exp(x - m); y = e / sum(e)
        reduce("max", "v20", "v10", load_x);
        for (int64_t t = 0; t < nt; ++t) {
          load_x(t);
          line("vsub v1, v1, v10");
          line("vexp v1, v1");
          line("vst v1, " + at(sb + t * kTile));
        }
        reduce("sum", "v21", "v11", load_s);
        for (int64_t t = 0; t < nt; ++t) {
          load_s(t);
          line("vdiv v1, v1, v11");
          line(std::string(st(ot)) + " v1, " + at(ob + t * kTile));
        }
        break;
      case OpKind::kLayerNorm:
        reduce("sum", "v21", "v10", load_x);
        line("vdiv v10, v10, v12");  // mean
        for (int64_t t = 0; t < nt; ++t) {
          load_x(t);
          line("vsub v1, v1, v10");  // d
          line("vst v1, " + at(sb + t * kTile));
        }
        reduce("sum", "v21", "v11", [&](int64_t t) { load_s(t); line("vmul v1, v1, v1"); });
        line("vdiv v11, v11, v12");  // var
        line("vbcast v13, " + fimm(n.attr_float("epsilon")));
        line("vadd v11, v11, v13");
        line("vsqrt v11, v11");  // den
        for (int64_t t = 0; t < nt; ++t) {
          load_s(t);
          line("vdiv v1, v1, v11");
          line(std::string(ld(gt)) + " v2, " + at(gb + t * kTile));
          line("vmul v1, v1, v2");
          line(std::string(ld(gt)) + " v3, " + at(bb + t * kTile));
          line("vadd v1, v1, v3");
          line(std::string(st(ot)) + " v1, " + at(ob + t * kTile));
        }
        break;
      default:
        if (n.op == OpKind::kReduceMax) {
          reduce("max", "v20", "v10", load_x);
        } else {
          reduce("sum", "v21", "v10", load_x);
          if (n.op != OpKind::kReduceSum) line("vdiv v10, v10, v12");
        }
        line(std::string(st(ot)) + " v10, " + at(ob));
    }
    if (row_out) {
      for (int64_t t = 0; t < nt; ++t) {
        dma(hbm(y + (r0 * len + t * 128) * eo), vmem(ob + t * kTile), std::min<int64_t>(128, len - t * 128) * eo,
            dim(rg, 128 * eo, len * eo));
        wait_dmas();  // neighbouring tiles' bounding ranges interleave (race checker)
      }
    } else {
      dma(hbm(y + r0 * eo), vmem(ob), eo, dim(rg, 128 * eo, eo));
      wait_dmas();
    }
  }
}

// conv2d (each group on its own) as a matmul over im2col rows: P[(n,oh,ow), (kh,kw,cin)] is
// gathered into fresh HBM scratch by one 3-D DMA per (n, kh, kw) (padding taps are
// never written, so they read +0.0), the OIHW weights become W[(kh,kw,cin), o], and
// the tiled matmul's chunk order over k = (kh*KW + kw)*Cin + cin is the contract's
// convolution. Its NHWC result is moved back to NCHW by one DMA per image.
void Emitter::lower_conv(const Node& n) {
  const Placed X = t_.at(n.inputs[0]);
  const Placed Wt = t_.at(n.inputs[1]);
  const auto& st = n.attr_ints("strides");
  const auto& pads = n.attr_ints("pads");
  const auto& dil = n.attr_ints("dilations");
  const int64_t G = n.has_attr("groups") ? n.attr_int("groups") : 1;
  const int64_t NB = X.type.shape[0], H = X.type.shape[2], W = X.type.shape[3];
  const int64_t CO = Wt.type.shape[0], CI = Wt.type.shape[1], KH = Wt.type.shape[2], KW = Wt.type.shape[3];
  const int64_t COg = CO / G, CIall = X.type.shape[1];
  const int64_t OH = n.type.shape[2], OW = n.type.shape[3];
  const int64_t K = KH * KW * CI, M = NB * OH * OW;
  const int64_t ex = esz(X.type.dtype), ew = esz(Wt.type.dtype), eo = esz(n.type.dtype);
  // Each group is its own convolution (the reference's per-group chunking).
  for (int64_t g = 0; g < G; ++g) {
  const std::string tag = "#conv" + std::to_string(n.id) + "g" + std::to_string(g);
  const int64_t P = place_hbm(M * K * ex), Wm = place_hbm(K * COg * ew), Y = place_hbm(M * COg * eo);
  check_addr(n, hbm_top_);
  for (int64_t b = 0; b < NB; ++b)
    for (int64_t kh = 0; kh < KH; ++kh)
      for (int64_t kw = 0; kw < KW; ++kw) {
        // Output positions whose tap (kh, kw) lands inside the image.
        auto range = [](int64_t out, int64_t in, int64_t stride, int64_t pad, int64_t off, int64_t* lo, int64_t* hi) {
          *lo = 0;
          while (*lo < out && *lo * stride - pad + off < 0) ++*lo;
          *hi = out;
          while (*hi > *lo && (*hi - 1) * stride - pad + off >= in) --*hi;
        };
        int64_t oh0, oh1, ow0, ow1;
        range(OH, H, st[0], pads[0], kh * dil[0], &oh0, &oh1);
        range(OW, W, st[1], pads[1], kw * dil[1], &ow0, &ow1);
        if (oh0 >= oh1 || ow0 >= ow1) continue;
        const int64_t ih = oh0 * st[0] - pads[0] + kh * dil[0], iw = ow0 * st[1] - pads[1] + kw * dil[1];
        const int64_t src = X.addr + ((b * CIall + g * CI) * H * W + ih * W + iw) * ex;
        const int64_t dst = P + (((b * OH + oh0) * OW + ow0) * K + (kh * KW + kw) * CI) * ex;
        dma(hbm(dst), hbm(src), ex,
            dim(ow1 - ow0, st[1] * ex, K * ex) + dim(CI, H * W * ex, ex) + dim(oh1 - oh0, st[0] * W * ex, OW * K * ex));
        wait_dmas();  // the gathers' bounding ranges interleave (race checker)
      }
  for (int64_t kh = 0; kh < KH; ++kh)
    for (int64_t kw = 0; kw < KW; ++kw)
      dma(hbm(Wm + (kh * KW + kw) * CI * COg * ew), hbm(Wt.addr + (g * COg * CI * KH * KW + kh * KW + kw) * ew), ew,
          dim(COg, CI * KH * KW * ew, ew) + dim(CI, KH * KW * ew, COg * ew));
  wait_dmas();
  t_[tag + "p"] = Placed{TensorType{X.type.dtype, {M, K}}, P};
  t_[tag + "w"] = Placed{TensorType{Wt.type.dtype, {K, COg}}, Wm};
  t_[tag + "y"] = Placed{TensorType{n.type.dtype, {M, COg}}, Y};
  Node mm;
  mm.id = n.id;
  mm.op = OpKind::kMatmul;
  mm.inputs = {tag + "p", tag + "w"};
  if (n.inputs.size() > 2) {
    const Placed& Bi = t_.at(n.inputs[2]);
    t_[tag + "b"] = Placed{TensorType{Bi.type.dtype, {COg}}, Bi.addr + g * COg * esz(Bi.type.dtype)};
    mm.inputs.push_back(tag + "b");
  }
  mm.output = tag + "y";
  mm.type = TensorType{n.type.dtype, {M, COg}};
  lower_matmul(mm);
  sync_all();
  const int64_t y = t_.at(n.output).addr;
  for (int64_t b = 0; b < NB; ++b)
    dma(hbm(y + (b * CO + g * COg) * OH * OW * eo), hbm(Y + b * OH * OW * COg * eo), eo,
        dim(OH * OW, COg * eo, eo) + dim(COg, eo, OH * OW * eo));
  wait_dmas();
  }
}

// transpose: HBM -> HBM, element-sized runs; the three innermost output dims are a
// DMA's dims, the outer ones one DMA each (their destinations are disjoint blocks).
void Emitter::lower_transpose(const Node& n) {
  const Placed& X = t_.at(n.inputs[0]);
  const auto& perm = n.attr_ints("perm");
  const Shape& os = n.type.shape;
  const int64_t e = esz(n.type.dtype);
  const size_t rank = os.size();
  std::vector<int64_t> in_stride(rank), out_stride(rank);
  for (int64_t d = static_cast<int64_t>(rank) - 1, si = e, so = e; d >= 0; --d) {
    in_stride[static_cast<size_t>(d)] = si;
    si *= X.type.shape[static_cast<size_t>(d)];
    out_stride[static_cast<size_t>(d)] = so;
    so *= os[static_cast<size_t>(d)];
  }
  const size_t inner = std::min<size_t>(3, rank);
  std::string dims;
  for (size_t k = 0; k < inner; ++k) {
    const size_t d = rank - 1 - k;
    dims += dim(os[d], in_stride[static_cast<size_t>(perm[d])], out_stride[d]);
  }
  const int64_t outer = num_elements(Shape(os.begin(), os.end() - static_cast<std::ptrdiff_t>(inner)));
  const int64_t y = t_.at(n.output).addr;
  for (int64_t o = 0; o < outer; ++o) {
    int64_t rem = o, src = X.addr, dst = y;
    for (size_t d = rank - inner; d-- > 0;) {
      const int64_t i = rem % os[d];
      rem /= os[d];
      src += i * in_stride[static_cast<size_t>(perm[d])];
      dst += i * out_stride[d];
    }
    dma(hbm(dst), hbm(src), e, dims);
  }
  wait_dmas();
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
  const int64_t NB = X.type.shape[0], CH = X.type.shape[1], H = X.type.shape[2], W = X.type.shape[3];
  const int64_t OH = n.type.shape[2], OW = n.type.shape[3], KK = k[0] * k[1];
  const int64_t T = NB * CH * OH * OW;
  const DType dt = X.type.dtype;
  const int64_t e = esz(dt), tile = kTileElems * e;
  const int64_t P = place_hbm(align_up(T * KK * e, tile));
  check_addr(n, hbm_top_);
  if (is_max && any_pad) {
    line("vbcast v0, " + fimm(-INFINITY));
    line(std::string(this->st(dt)) + " v0, " + at(0));
    dma(hbm(P), vmem(0), tile, dim(align_up(T * KK * e, tile) / tile, 0, tile));
    wait_dmas();
  }
  for (int64_t b = 0; b < NB; ++b)
    for (int64_t kh = 0; kh < k[0]; ++kh)
      for (int64_t kw = 0; kw < k[1]; ++kw) {
        auto range = [](int64_t out, int64_t in, int64_t stride, int64_t pad, int64_t off, int64_t* lo, int64_t* hi) {
          *lo = 0;
          while (*lo < out && *lo * stride - pad + off < 0) ++*lo;
          *hi = out;
          while (*hi > *lo && (*hi - 1) * stride - pad + off >= in) --*hi;
        };
        int64_t oh0, oh1, ow0, ow1;
        range(OH, H, st[0], pads[0], kh, &oh0, &oh1);
        range(OW, W, st[1], pads[1], kw, &ow0, &ow1);
        if (oh0 >= oh1 || ow0 >= ow1) continue;
        const int64_t ih = oh0 * st[0] - pads[0] + kh, iw = ow0 * st[1] - pads[1] + kw;
        const int64_t src = X.addr + ((b * CH * H + ih) * W + iw) * e;
        const int64_t dst = P + (((b * CH * OH + oh0) * OW + ow0) * KK + kh * k[1] + kw) * e;
        dma(hbm(dst), hbm(src), e,
            dim(ow1 - ow0, st[1] * e, KK * e) + dim(oh1 - oh0, st[0] * W * e, OW * KK * e) +
                dim(CH, H * W * e, OH * OW * KK * e));
        wait_dmas();  // the gathers' bounding ranges interleave (race checker)
      }
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

// matmul / Gemm. Per batch element, rows in groups of up to 512 and output columns
// in tiles of C, one tile per MXU at a time (several MXUs share each LHS tile). K is
// cut into chunks of R rows: chunk c's weights are pushed, `mswap k=kr` makes the
// unused rows of a short chunk contribute nothing, and the chunk sums are combined
// in increasing c by mpop (c = 0) and mpop.add onto the partial sums kept in VMEM,
// exactly the contract's acc = s_0; acc = acc + s_1; ... Then alpha, beta * C, store.
void Emitter::lower_matmul(const Node& n) {
  const Placed& A = t_.at(n.inputs[0]);
  const Placed& B = t_.at(n.inputs[1]);
  const bool ta = n.has_attr("trans_a") && n.attr_int("trans_a");
  const bool tb = n.has_attr("trans_b") && n.attr_int("trans_b");
  const float alpha = n.has_attr("alpha") ? n.attr_float("alpha") : 1.0f;
  const float beta = n.has_attr("beta") ? n.attr_float("beta") : 1.0f;
  const Shape& as = A.type.shape;
  const Shape& bs = B.type.shape;
  const Shape& os = n.type.shape;
  const size_t rank = os.size();
  const int64_t M = os[rank - 2], N = os[rank - 1];
  const int64_t K = ta ? as[as.size() - 2] : as[as.size() - 1];
  const DType at_ = A.type.dtype, bt = B.type.dtype, ot = n.type.dtype;
  const int64_t ea = esz(at_), eb = esz(bt), eo = esz(ot);
  const int64_t R = opt_.target.mxu_rows, C = opt_.target.mxu_cols;
  const int64_t mxus = opt_.target.mxus_per_core;
  const int64_t bias = n.inputs.size() > 2 ? broadcast_to(n, n.inputs[2], os) : -1;
  const DType ct = n.inputs.size() > 2 ? t_.at(n.inputs[2]).type.dtype : ot;
  const int64_t ec = esz(ct);

  // Batch offsets with numpy broadcasting of the leading dims.
  const int64_t batches = num_elements(os) / std::max<int64_t>(M * N, 1);
  auto batch_offset = [&](const Shape& s, int64_t b, int64_t e) {
    const size_t r = s.size();
    int64_t off = 0, stride = s[r - 1] * s[r - 2] * e;
    for (size_t d = rank - 2, sd = r - 2; d-- > 0;) {
      const int64_t idx = b % os[d];
      b /= os[d];
      if (sd == 0) break;
      --sd;
      if (s[sd] != 1) off += idx * stride;
      stride *= s[sd];
    }
    return off;
  };

  // VMEM plan (fixed regions; a node's tiles are dead when the next node starts).
  // Rows per group: up to 512, fewer when that gives every core a group.
  const int64_t kMg = std::max<int64_t>(8, std::min<int64_t>(512, align_up((M + cores_ - 1) / cores_, 8)));
  const int64_t lane_f32 = 128 * 4;
  // Two buffers, each the weights of one chunk per MXU (R rows x 128 lanes) and the
  // LHS rows of that chunk (kMg rows x 128 lanes): chunk c+1 is fetched, on buffer
  // (c+1)%2's flag, while chunk c computes.
  const int64_t buf_bytes = mxus * R * lane_f32 + kMg * lane_f32;
  auto w_buf = [&](int64_t c) { return (c % 2) * buf_bytes; };
  auto lhs_buf = [&](int64_t c) { return (c % 2) * buf_bytes + mxus * R * lane_f32; };
  const int64_t acc_base = 2 * buf_bytes;                   // mxus x kMg rows fp32
  const int64_t bias_base = acc_base + mxus * kMg * lane_f32;
  const int64_t out_base = bias_base + mxus * kMg * lane_f32;
  const int64_t vmem_need = out_base + mxus * kMg * lane_f32;
  if (static_cast<uint64_t>(vmem_need) > opt_.target.vmem_bytes)
    fail(n, "needs " + std::to_string(vmem_need) + " bytes of VMEM, the target has " +
                std::to_string(opt_.target.vmem_bytes));
  const int64_t wrow = 128 * eb, lrow = 128 * ea, orow = 128 * eo, crow = 128 * ec;

  sync_all();
  int64_t unit = 0;
  for (int64_t b = 0; b < batches; ++b) {
    const int64_t a0 = A.addr + batch_offset(as, b, ea);
    const int64_t b0 = B.addr + batch_offset(bs, b, eb);
    const int64_t o0 = t_.at(n.output).addr + b * M * N * eo;
    const int64_t c0 = bias + b * M * N * ec;
    for (int64_t m0 = 0; m0 < M; m0 += kMg) {
      on_core(unit++);  // a row group writes its own rows of the output
      const int64_t mr = std::min(kMg, M - m0);
      const int64_t blocks = (mr + 7) / 8;
      for (int64_t n0 = 0; n0 < N; n0 += C * mxus) {
        const int64_t slots = std::min<int64_t>(mxus, (N - n0 + C - 1) / C);
        auto ncols = [&](int64_t s) { return std::min(C, N - (n0 + s * C)); };
        const int64_t chunks = (K + R - 1) / R;
        auto fetch = [&](int64_t c) {
          const int64_t k0 = c * R, kr = std::min(R, K - k0);
          const int flag = 2 + static_cast<int>(c % 2);
          for (int64_t s = 0; s < slots; ++s) {
            const int64_t col = n0 + s * C;
            if (!tb)
              dma_on(flag, vmem(w_buf(c) + s * R * wrow), hbm(b0 + (k0 * N + col) * eb), ncols(s) * eb,
                     dim(kr, N * eb, wrow));
            else
              dma_on(flag, vmem(w_buf(c) + s * R * wrow), hbm(b0 + (col * K + k0) * eb), eb,
                     dim(ncols(s), K * eb, eb) + dim(kr, eb, wrow));
          }
          if (!ta)
            dma_on(flag, vmem(lhs_buf(c)), hbm(a0 + (m0 * K + k0) * ea), kr * ea, dim(mr, K * ea, lrow));
          else
            dma_on(flag, vmem(lhs_buf(c)), hbm(a0 + (k0 * M + m0) * ea), ea, dim(kr, M * ea, ea) + dim(mr, ea, lrow));
        };
        fetch(0);
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t kr = std::min(R, K - c * R);
          if (c + 1 < chunks) fetch(c + 1);
          wait_flag(2 + static_cast<int>(c % 2));
          const int64_t w_base = w_buf(c), lhs_base = lhs_buf(c);
          for (int64_t s = 0; s < slots; ++s) {
            for (int64_t r = 0; r < kr; r += 8) {
              line(std::string(ld(bt)) + " v0, " + at(w_base + s * R * wrow + r * wrow));
              line("mpush mxu" + std::to_string(s) + ", v0");
            }
            line("mswap mxu" + std::to_string(s) + ", k=" + std::to_string(kr));
          }
          for (int64_t i = 0; i < blocks; ++i) {
            line(std::string(ld(at_)) + " v1, " + at(lhs_base + i * 8 * lrow));
            for (int64_t s = 0; s < slots; ++s) line("mmul mxu" + std::to_string(s) + ", v1");
            for (int64_t s = 0; s < slots; ++s) {
              const int64_t acc = acc_base + (s * kMg + i * 8) * lane_f32;
              if (c == 0) {
                line("mpop v2, mxu" + std::to_string(s));
              } else {
                line("vld v2, " + at(acc));
                line("mpop.add v2, mxu" + std::to_string(s));
              }
              line("vst v2, " + at(acc));
            }
          }
        }
        // Epilogue: (alpha * acc) + (beta * C), then the store rounding.
        if (bias >= 0) {
          for (int64_t s = 0; s < slots; ++s)
            dma(vmem(bias_base + s * kMg * crow), hbm(c0 + (m0 * N + n0 + s * C) * ec), ncols(s) * ec,
                dim(mr, N * ec, crow));
          wait_dmas();
        }
        if (alpha != 1.0f) line("vbcast v5, " + fimm(alpha));
        if (beta != 1.0f) line("vbcast v6, " + fimm(beta));
        for (int64_t s = 0; s < slots; ++s) {
          for (int64_t i = 0; i < blocks; ++i) {
            line("vld v2, " + at(acc_base + (s * kMg + i * 8) * lane_f32));
            if (alpha != 1.0f) line("vmul v2, v5, v2");
            if (bias >= 0) {
              line(std::string(ld(ct)) + " v3, " + at(bias_base + s * kMg * crow + i * 8 * crow));
              if (beta != 1.0f) line("vmul v3, v6, v3");
              line("vadd v2, v2, v3");
            }
            line(std::string(st(ot)) + " v2, " + at(out_base + s * kMg * orow + i * 8 * orow));
          }
          dma(hbm(o0 + (m0 * N + n0 + s * C) * eo), vmem(out_base + s * kMg * orow), ncols(s) * eo,
              dim(mr, orow, N * eo));
          // The race checker sees a strided DMA's bounding range, and neighbouring
          // column tiles interleave, so each store completes before the next starts.
          wait_dmas();
        }
      }
    }
  }
}

LowerResult Emitter::run() {
  const isa::Target& t = opt_.target;
  out_ << ".target chips=1 cores=" << cores_ << " mxus=" << t.mxus_per_core << " mxu_rows=" << t.mxu_rows
       << " mxu_cols=" << t.mxu_cols << " fifo_rows=" << t.fifo_rows << " vmem=" << t.vmem_bytes
       << " smem=" << t.smem_bytes << " hbm=" << t.hbm_bytes << " host=" << t.host_bytes << "\n";
  std::vector<isa::IoEntry> io;
  auto entry = [&](isa::IoKind kind, const std::string& name, const TensorType& type, int64_t addr) {
    isa::IoEntry e;
    e.kind = kind;
    e.name = name;
    e.dtype = type.dtype == DType::kBf16 ? isa::Dtype::kBf16 : isa::Dtype::kF32;
    e.shape = type.shape;
    e.space = isa::Space::kHbm;
    e.addr = static_cast<uint64_t>(addr);
    return e;
  };
  auto place = [&](const std::string& name, const TensorType& type) {
    if (type.dtype == DType::kI64)
      throw CompileError(g_.name + ": tensor '" + name + "': i64 tensors are not supported by the lowering yet");
    t_[name] = Placed{type, place_hbm(num_elements(type.shape) * esz(type.dtype))};
    return t_[name].addr;
  };
  for (const auto& in : g_.inputs) io.push_back(entry(isa::IoKind::kInput, in.name, in.type, place(in.name, in.type)));
  for (const auto& c : g_.constants) {
    isa::IoEntry e = entry(isa::IoKind::kConst, c.name, c.type, place(c.name, c.type));
    for (float f : c.f) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      if (c.type.dtype == DType::kBf16) {
        const uint16_t h = num::fp32_to_bf16(f);  // exact: the policy pass rounded it
        e.data.push_back(static_cast<uint8_t>(h));
        e.data.push_back(static_cast<uint8_t>(h >> 8));
      } else {
        for (int k = 0; k < 4; ++k) e.data.push_back(static_cast<uint8_t>(u >> (8 * k)));
      }
    }
    io.push_back(std::move(e));
  }
  for (const auto& n : g_.nodes) place(n.output, n.type);

  for (const auto& n : g_.nodes) {
    for (auto& c : cs_) c << "  op " << n.id << "\n";
    cur_ = 0;
    switch (n.op) {
      case OpKind::kMatmul: lower_matmul(n); break;
      case OpKind::kConv2d: lower_conv(n); break;
      case OpKind::kTranspose: lower_transpose(n); break;
      case OpKind::kMaxPool:
      case OpKind::kAvgPool: lower_pool(n); break;
      case OpKind::kReshape:
      case OpKind::kFlatten: lower_copy(n); break;
      case OpKind::kSoftmax:
      case OpKind::kLayerNorm:
      case OpKind::kReduceSum:
      case OpKind::kReduceMean:
      case OpKind::kReduceMax:
      case OpKind::kGlobalAvgPool: lower_rows(n); break;
      default:
        if (!is_elementwise(n.op) && n.op != OpKind::kCast && n.op != OpKind::kIdentity)
          fail(n, "op is not supported by the lowering yet");
        lower_elementwise(n);
    }
    sync_all();
  }
  for (int c = 0; c < cores_; ++c) out_ << ".core chip0.core" << c << "\n" << cs_[static_cast<size_t>(c)].str() << "  halt\n";
  for (const auto& o : g_.outputs) {
    const Placed& p = t_.at(o);
    io.push_back(entry(isa::IoKind::kOutput, o, p.type, p.addr));
  }
  if (static_cast<uint64_t>(hbm_top_) > t.hbm_bytes)
    throw CompileError(g_.name + ": needs " + std::to_string(hbm_top_) + " bytes of HBM, the target has " +
                       std::to_string(t.hbm_bytes));

  LowerResult r;
  r.assembly = out_.str();
  try {
    r.bundle = isa::assemble(r.assembly, g_.name + ".s");
  } catch (const isa::AsmError& e) {
    throw CompileError(std::string("internal lowering error: ") + e.what());
  }
  r.bundle.io = std::move(io);
  const std::string err = isa::check_bundle(r.bundle);
  if (!err.empty()) throw CompileError(g_.name + ": internal lowering error: " + err);
  return r;
}

}  // namespace

LowerResult lower_graph(const Graph& graph, const LowerOptions& options) {
  Graph g = graph;
  apply_precision(g, options.policy);
  verify(g, "lowering");
  if (options.cores < 1 || options.cores > 254) throw CompileError(g.name + ": cores must be 1..254");
  const std::string err = options.target.check();
  if (!err.empty()) throw CompileError(g.name + ": bad target: " + err);
  Emitter e(g, options);
  return e.run();
}

}  // namespace tpusim::compiler
