// The lowering's emitter, shared by the files of compiler/lower/ (one per family
// of ops: vector.cpp, matrix.cpp, movement.cpp), so each family can change on its
// own. Internal to compiler/lower: lower.h is the public API.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "compiler/lower/lower.h"
#include "compiler/passes/passes.h"

namespace tpusim::compiler::lowering {

// One DMA completion flag, waited on with the running count of every DMA issued so
// far: completion order is not program order, so a count covering all of them is
// what makes the data usable (docs/isa.md, synchronisation rule 2).
constexpr const char* kDmaFlag = "f1";
constexpr int64_t kTileElems = 8 * 128;
constexpr int64_t kAlign = 4096;
// The top of every core's SMEM belongs to the streamed all-reduce's credits
// (compiler/lower/collective.cpp): 4-byte DMAs that only carry their rflag. SMEM
// to SMEM they touch no HBM; from HBM to HBM each paid a read on one chip's memory
// and a write on the other's, behind the landings queued there, on the path of
// every slot's next piece.
constexpr int64_t kCreditSmemBytes = 1024;

inline int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }
// A VMEM row stride of an odd number of `gran`-byte granules (gran: one 128-lane row),
// so the 8 rows of a strided vld or vst fall in different banks.
inline int64_t odd_stride(int64_t bytes, int64_t gran) {
  int64_t s = align_up(bytes, gran);
  if ((s / gran) % 2 == 0) s += gran;
  return s;
}

// An address is (unsigned 32-bit sA) + (signed 32-bit imm) (docs/isa.md): s0 names
// [0, 2 GiB); every program that names more sets two window registers once at its
// start (window_setup): s31 = 2 GiB names [2 GiB, 4 GiB), s30 = 4 GiB - 4 KiB names
// the rest up to kAddrReach (~6 GiB). Nothing else in the lowering writes s30/s31.
constexpr int64_t kWindow1 = int64_t{1} << 31;
constexpr int64_t kWindow2 = (int64_t{1} << 32) - kAlign;
constexpr int64_t kAddrReach = kWindow2 + INT32_MAX;
inline std::string addr_ref(int64_t a) {
  if (a <= INT32_MAX) return "[s0 + " + std::to_string(a) + "]";
  if (a - kWindow1 <= INT32_MAX) return "[s31 + " + std::to_string(a - kWindow1) + "]";
  return "[s30 + " + std::to_string(a - kWindow2) + "]";
}
inline std::string window_setup() {
  return "  li s31, " + std::to_string(kWindow1) + "\n  li s30, " + std::to_string(kWindow2) + "\n";
}

struct Placed {
  TensorType type;
  int64_t addr = 0;  // HBM byte address, dense row major
};

class Emitter {
 public:
  Emitter(const Graph& g, const LowerOptions& o)
      : g_(g), opt_(o), cores_(std::max(1, o.cores)), cs_(static_cast<size_t>(cores_)), tail_(static_cast<size_t>(cores_)),
        dmas_(static_cast<size_t>(cores_)), flag_dmas_(static_cast<size_t>(cores_)),
        drained_dmas_(static_cast<size_t>(cores_)), drained_flags_(static_cast<size_t>(cores_)) { hbm_top_ = o.hbm_base; }

  LowerResult run();

 private:
  int64_t esz(DType t) const { return t == DType::kBf16 ? 2 : 4; }
  const char* ld(DType t) const { return t == DType::kBf16 ? "vld.bf16" : "vld"; }
  const char* st(DType t) const { return t == DType::kBf16 ? "vst.bf16" : "vst"; }
  [[noreturn]] void fail(const Node& n, const std::string& why) const {
    throw CompileError(g_.name + ": node '" + n.output + "' (#" + std::to_string(n.id) + ", " + op_name(n.op) +
                       "): " + why);
  }
  // HBM plan (lower.cpp, docs/codegen.md "HBM plan"). place_hbm: scratch of the
  // node being lowered, given back when the node ends; place_hbm_pinned: never
  // reused and never reusing (constants the bundle loads, the collectives' entry
  // tokens, which other replicas write at any time).
  int64_t place_hbm(int64_t bytes) {
    const int64_t a = alloc_hbm(bytes, true);
    node_scratch_.emplace_back(a, bytes);
    return a;
  }
  int64_t place_hbm_pinned(int64_t bytes) { return alloc_hbm(bytes, false); }
  int64_t alloc_hbm(int64_t bytes, bool reuse);
  void free_hbm(int64_t a, int64_t bytes);
  void drain_dmas();
  // Scratch whose gathers leave holes that must read +0.0: zero-filled unless its
  // memory was never used before (fresh HBM is zero).
  void zero_if_reused(int64_t a, int64_t bytes, DType t) {
    if (!fresh_.count(a)) fill(a, bytes, t, 0.0f);
  }
  // Addresses are written [sA + imm]: the window registers reach kAddrReach.
  void check_addr(const Node& n, int64_t a) const {
    if (a > kAddrReach)
      fail(n, "HBM address " + std::to_string(a) + " is beyond what [sA + imm] reaches (" + std::to_string(kAddrReach) +
                  "); the lowering addresses the first 6 GiB of a chip's HBM");
  }
  void line(const std::string& s) { cs_[cur_] << "  " << s << "\n"; }
  void raw_line(const std::string& s) { cs_[cur_] << s << "\n"; }  // a line as captured_lines gives it
  // The lines f emits on the current core, taken out of its program (to be reordered).
  std::vector<std::string> captured_lines(const std::function<void()>& f) {
    std::ostringstream kept = std::move(cs_[cur_]);
    cs_[cur_] = std::ostringstream();
    f();
    std::istringstream in(cs_[cur_].str());
    cs_[cur_] = std::move(kept);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }
  void dma(const std::string& dst, const std::string& src, int64_t bytes, const std::string& dims = "") {
    cs_[cur_] << "  dma " << dst << ", " << src << ", bytes=" << bytes << dims << ", flag=" << kDmaFlag << "\n";
    ++dmas_[cur_];
  }
  // A scalar at HBM addr (element size e) replicated over the tile of 8 x 128 elements
  // at VMEM `tile`: the element comes in just past the tile (the caller reserves two
  // tiles), then one VMEM -> VMEM DMA spreads it. A stride-0 read of HBM would be a
  // memory request per element: 1024 of them, ~9 K cycles on v3 (BERT's Q K^T / 8
  // alone: 13,229 -> 5,028 cycles). The spread is waited on with the caller's f1 DMAs.
  void replicate_scalar(int64_t tile, int64_t addr, int64_t e) {
    dma(vmem(tile + kTileElems * e), hbm(addr), e);
    wait_dmas();
    dma(vmem(tile), vmem(tile + kTileElems * e), e, dim(kTileElems, 0, e));
  }
  // A DMA on its own flag fF (a double buffer's), waited on by wait_flag(F).
  void dma_on(int flag, const std::string& dst, const std::string& src, int64_t bytes, const std::string& dims) {
    cs_[cur_] << "  dma " << dst << ", " << src << ", bytes=" << bytes << dims << ", flag=f" << flag << "\n";
    ++flag_dmas_[cur_][flag];
  }
  // A copy within VMEM (dst <- src, `run`-byte runs over `dims`) on fF, in parts of at
  // least kSplitBytes along its outermost dimension, at most kDmaEngines: such a copy
  // holds an engine for the on-chip path's latency and its bytes, so a large one alone
  // leaves the others idle (the cnn step's l1 conv: ~295 KB of patches a band, 20.7 K
  // -> 15.6 K cycles). Small ones stay whole: their parts would take the engines from
  // the transfers beside them for the latency alone.
  static constexpr int64_t kSplitBytes = 64 << 10;
  void vmem_copy_on(int flag, int64_t dst, int64_t src, int64_t run, const std::string& dims) {
    const Gather whole{src, dst, run, dims};
    for (const Gather& g : whole.split(std::min(kDmaEngines, run * whole.runs() / kSplitBytes)))
      dma_on(flag, vmem(g.dst_off), vmem(g.src_off), g.run, g.dims);
  }
  void wait_flag(int flag) { line("wait f" + std::to_string(flag) + ", " + std::to_string(flag_dmas_[cur_][flag])); }
  void wait_dmas() { line("wait " + std::string(kDmaFlag) + ", " + std::to_string(dmas_[cur_])); }
  // Waits for n more landings on a collective's flag F than waited for so far.
  void wait_landed(int flag, int64_t n) { line("wait f" + std::to_string(flag) + ", " + std::to_string(coll_landed_[flag] += n)); }
  // Every core waits for every other (the work of a node is split across cores;
  // what one core's DMAs wrote, the others may read only after this).
  void sync_all() {
    if (cores_ == 1) return;
    for (cur_ = 0; cur_ < cores_; ++cur_) line("barrier");
    cur_ = 0;
  }
  // Independent units of work go round robin over the cores.
  void on_core(int64_t unit) { cur_ = static_cast<int>(unit % cores_); }
  // Streamed units, round robin over the cores and double-buffered on each: unit k
  // of a core fetches its input (fetch(unit, par), DMAs on kStreamInFlag + par, par
  // = k % 2) while unit k - 1 computes, and body(unit, par) runs once that input is
  // in and the output of unit k - 2, which used the same buffer, has gone out (its
  // DMAs on kStreamOutFlag + par).
  static constexpr int kStreamInFlag = 14, kStreamOutFlag = 16;  // f20..f62 belong to collectives and replication
  template <typename Fetch, typename Body>
  void double_buffered(int64_t units, Fetch fetch, Body body) {
    buffered(units, 2, kStreamInFlag, kStreamOutFlag, fetch, body);
  }
  // The same with `depth` buffers (par = k % depth): unit k + depth - 1 is fetched
  // while unit k computes, on flags in_flag + par and out_flag + par.
  template <typename Fetch, typename Body>
  void buffered(int64_t units, int depth, int in_flag, int out_flag, Fetch fetch, Body body) {
    for (int core = 0; core < cores_; ++core) {
      cur_ = core;
      std::vector<int64_t> mine;
      for (int64_t u = core; u < units; u += cores_) mine.push_back(u);
      const size_t d = static_cast<size_t>(depth);
      for (size_t k = 0; k + 1 < d && k < mine.size(); ++k) fetch(mine[k], static_cast<int64_t>(k));
      for (size_t k = 0; k < mine.size(); ++k) {
        const int64_t par = static_cast<int64_t>(k % d);
        if (k + d - 1 < mine.size()) fetch(mine[k + d - 1], static_cast<int64_t>((k + d - 1) % d));
        wait_flag(in_flag + static_cast<int>(par));
        if (k >= d) wait_flag(out_flag + static_cast<int>(par));
        body(mine[k], par);
      }
      for (int par = 0; par < depth; ++par) wait_flag(out_flag + par);
    }
    cur_ = 0;
  }
  // DMA engines a core has (dma.engines of every preset): how many copies within VMEM
  // are worth running at once. A plan's choice only; the values never depend on it.
  static constexpr int64_t kDmaEngines = 4;
  // lower_elementwise's blocks: at most this many 8x128 tiles (feeder_fits sizes the
  // same buffers).
  static constexpr int64_t kElementwiseBlockTiles = 64;
  // VMEM for an elementwise operand's repetitions (lower_elementwise).
  static constexpr int64_t kPeriodicBytes = 2 << 20;
  // Streamed units whose middle is a VMEM -> VMEM gather (a conv's planes, a strided
  // copy), in three stages a core on slots k % 3 (unit k of the core): fetch(unit,
  // slot, flag) brings the input in, gather(unit, slot, flag) issues the gathers and
  // leaves them in flight, finish(unit, slot, flag) (once they are done) sends the
  // result out. Unit k's gathers run while unit k - 1's result goes out and units
  // k + 1 and k + 2 come in: double-buffered, each unit waited for its own gathers
  // (~480 cycles each, the on-chip path's latency) and then for the next unit's input,
  // which could only start once those gathers had read their slot (~1,000 cycles a
  // unit on the cnn step's planes).
  static constexpr int kRingInFlag = 8, kRingGatherFlag = 11, kRingOutFlag = 13;  // f8..f10, f11/f12, f13..f15
  static constexpr int64_t kRingSlots = 3;
  template <typename Fetch, typename Gather, typename Finish>
  void gathered_stream(int64_t units, Fetch fetch, Gather gather, Finish finish) {
    constexpr int64_t S = kRingSlots;
    auto in = [](int64_t k) { return kRingInFlag + static_cast<int>(k % S); };
    auto gf = [](int64_t k) { return kRingGatherFlag + static_cast<int>(k % 2); };
    auto out = [](int64_t k) { return kRingOutFlag + static_cast<int>(k % S); };
    for (int core = 0; core < cores_; ++core) {
      cur_ = core;
      std::vector<int64_t> mine;
      for (int64_t u = core; u < units; u += cores_) mine.push_back(u);
      const int64_t n = static_cast<int64_t>(mine.size());
      auto unit = [&](int64_t k) { return mine[static_cast<size_t>(k)]; };
      for (int64_t k = 0; k < std::min(S - 1, n); ++k) fetch(unit(k), k % S, in(k));
      for (int64_t k = 0; k < n; ++k) {
        wait_flag(in(k));
        if (k >= S) wait_flag(out(k));  // unit k - S's result is out of this slot
        gather(unit(k), k % S, gf(k));
        if (k >= 1) {
          wait_flag(gf(k - 1));
          finish(unit(k - 1), (k - 1) % S, out(k - 1));
        }
        if (k + S - 1 < n) fetch(unit(k + S - 1), (k + S - 1) % S, in(k + S - 1));  // unit k - 1's slot
      }
      if (n > 0) {
        wait_flag(gf(n - 1));
        finish(unit(n - 1), (n - 1) % S, out(n - 1));
      }
      for (int64_t k = 0; k < std::min(S, n); ++k) wait_flag(out(k));
    }
    cur_ = 0;
  }
  // Softmax over the nt tiles of one row group (lower_rows) or lane block
  // (lower_columns): m = max; e = exp(x - m), kept in the tiles at scratch; y = e /
  // sum(e). reduce(kind, identity, acc, load) leaves the reduction over the tiles
  // that load(t) puts in v1 in acc (across lanes or sublanes: the caller's); load_x
  // and store_y move tile t of x and y.
  template <typename Reduce, typename LoadX, typename StoreY>
  void softmax_tiles(int64_t nt, int64_t scratch, int64_t tile_bytes, Reduce reduce, LoadX load_x, StoreY store_y) {
    auto load_e = [&](int64_t t) { line("vld v1, " + at(scratch + t * tile_bytes)); };
    reduce("max", "v20", "v10", load_x);
    for (int64_t t = 0; t < nt; ++t) {
      load_x(t);
      line("vsub v1, v1, v10");
      line("vexp v1, v1");
      line("vst v1, " + at(scratch + t * tile_bytes));
    }
    reduce("sum", "v21", "v11", load_e);
    for (int64_t t = 0; t < nt; ++t) {
      load_e(t);
      line("vdiv v1, v1, v11");
      store_y(t);
    }
  }
  static std::string hbm(int64_t a) { return "hbm:" + addr_ref(a); }
  static std::string vmem(int64_t a) { return "vmem:" + addr_ref(a); }
  static std::string at(int64_t a) { return addr_ref(a); }
  // The output positions [lo, hi) of one axis whose tap at `off` (kernel index x
  // dilation) lands inside an input of `in` elements: lo * stride - pad + off >= 0
  // and (hi - 1) * stride - pad + off < in (im2col, pooling and depthwise gathers).
  static void tap_range(int64_t out, int64_t in, int64_t stride, int64_t pad, int64_t off, int64_t* lo, int64_t* hi) {
    *lo = 0;
    while (*lo < out && *lo * stride - pad + off < 0) ++*lo;
    *hi = out;
    while (*hi > *lo && (*hi - 1) * stride - pad + off >= in) --*hi;
  }
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

  // The operand `name` laid out in HBM scratch as out_shape (numpy broadcasting over
  // its leading and size-1 axes); its own address where the element counts are equal.
  int64_t broadcast_to(const Node& n, const std::string& name, const Shape& out_shape);
  // The moves of that layout: gathers whose offsets are relative to the operand's
  // first byte and to the result's; short_runs when their runs cost about a memory
  // request each in HBM (kStagedRunsBelow), so they are better made within VMEM.
  struct Gather;
  struct BroadcastMoves {
    std::vector<Gather> gathers;
    int64_t src_bytes = 0, dst_bytes = 0;
    bool short_runs = false;
  };
  BroadcastMoves broadcast_moves(const Placed& p, const Shape& out_shape) const;
  // A constant rearranged at compile time into a .const entry of its own at HBM `addr`
  // (conv weights as W[(kh,kw,cin), o], a Gemm's B^T as B): element i of the new
  // layout is value(i), stored as dt (bf16 exactly: the policy pass rounded it).
  void layout_constant(int64_t addr, const std::string& name, DType dt, const Shape& shape,
                       const std::function<float(int64_t)>& value);
  // Fusion (compiler/lower/fusion.cpp): the members of each root's fusion group that
  // its kernel applies to its output tiles in registers, in order; their results
  // never go through HBM.
  void plan_fusion();
  bool fused_away(const Node& n) const { return fused_.count(n.id) != 0; }
  const std::vector<const Node*>& chain_of(const Node& n) const;
  bool is_feeder(const Node& f, size_t ri, const std::map<std::string, size_t>& defined_at,
                 const std::map<std::string, int>& uses, const Node& root) const;
  bool feeder_fits(const Node& root, const Node& f) const;
  // Row regions (row_region.cpp): small subgraphs of reductions (over the innermost
  // axes, or down a 2-D value's rows) and the elementwise ops around them, one
  // VMEM-resident kernel each.
  struct RegionValue {
    enum Kind { kRows, kBcast, kConst } kind = kRows;
    int64_t rows = 0, len = 0;  // the view: rows of len contiguous elements
    float value = 0.0f;         // kConst
    int64_t addr = 0;           // VMEM
    DType dt = DType::kF32;     // as stored in VMEM (bf16 rounded by vst.bf16)
    int64_t e = 4;              // its element bytes
  };
  static RegionValue region_view(const TensorType& t, bool bcast);
  static int64_t region_bytes(const RegionValue& v);
  RegionValue::Kind region_kind(const std::string& t) const;
  void plan_row_regions();
  void lower_row_region(const Node& root);
  // Gathers through VMEM (staging.cpp): the HBM bytes [src, src + src_bytes) are
  // copied to VMEM with one contiguous DMA, rearranged there by VMEM -> VMEM DMAs
  // (whose cost is per byte, not per run, so element-sized runs are cheap), and the
  // result [0, dst_bytes) goes to HBM at dst with one DMA. Offsets of each gather are
  // relative to the staged source and the staged result; the result is first filled
  // with `fill` (element type fill_dt) where gathers leave holes (padding taps).
  struct Gather {
    int64_t src_off, dst_off, run;
    std::string dims;  // dim(...) terms
    // Writes no byte another gather of its staged_gather writes (an im2col tap's own
    // columns), so it runs beside them whatever their bounding ranges.
    bool disjoint = false;
    // The bytes [lo, hi) its writes span, relative to its image.
    std::pair<int64_t, int64_t> dst_hull() const;
    int64_t runs() const;  // how many runs of `run` bytes it moves
    std::vector<Gather> split(int64_t parts) const;
  };
  // HBM runs shorter than this (bytes) cost about a memory request each: moves made
  // of them (transposes, broadcasts, reverse, im2col's taps) go through VMEM, whose
  // gathers cost per byte, where staging_fits.
  static constexpr int64_t kStagedRunsBelow = 128;
  bool staging_fits(int64_t src_bytes, int64_t dst_bytes) const {
    return static_cast<uint64_t>(align_up(src_bytes, kAlign) + align_up(dst_bytes, kAlign) + 8192) <=
           opt_.target.vmem_bytes;
  }
  // planes > 1: the result is `planes` equal parts, part p going to dst + p * plane_stride.
  // src_runs / dst_runs: the HBM side (the source, or each part of the result) is
  // `runs` equal runs `stride` bytes apart, moved as one DMA (a band of rows of
  // every channel plane).
  struct HbmRuns {
    int64_t runs, stride;
  };
  // A relayout: the source is first laid out again by one gather into a region of
  // `bytes` (the fill goes there instead, say the padding around a padded NHWC
  // image), and the gathers read that region.
  struct Relayout {
    Gather gather;
    int64_t bytes = 0;
  };
  // The first half of staged_gather: the source in, the fill, the gathers; returns
  // the VMEM offset of the gathered image (dst_bytes), all DMAs waited for.
  int64_t gather_in_vmem(int64_t src, int64_t src_bytes, int64_t dst_bytes, const std::vector<Gather>& gathers,
                         bool fill, float fill_value, DType fill_dt, HbmRuns src_runs = {1, 0},
                         const Relayout* relayout = nullptr);
  // The gathers from an image staged at VMEM sv into one at dv: VMEM -> VMEM DMAs on
  // f1, all waited for; or on fF (flag >= 0), left in flight (gathered_stream).
  void run_gathers(int64_t sv, int64_t dv, const std::vector<Gather>& gathers, int flag = -1);
  // VMEM [addr, addr + bytes) filled with `value` of dtype dt: one vst per tile (8 x 128
  // elements) from v0.
  void fill_vmem(int64_t addr, int64_t bytes, float value, DType dt);
  void staged_gather(int64_t src, int64_t src_bytes, int64_t dst, int64_t dst_bytes, const std::vector<Gather>& gathers,
                     bool fill, float fill_value, DType fill_dt, int64_t planes = 1, int64_t plane_stride = 0,
                     HbmRuns src_runs = {1, 0}, HbmRuns dst_runs = {1, 0}, const Relayout* relayout = nullptr);
  // The recipe's instruction sequence of elementwise op `n` on registers: vd = op(va[, vb]),
  // t0 and t1 are scratch (vector.cpp).
  void emit_op(const Node& n, int vd, int va, int vb, int t0, int t1);
  void lower_elementwise(const Node& n);
  void lower_matmul(const Node& n);
  void lower_copy(const Node& n);
  void lower_rows(const Node& n);
  void lower_conv(const Node& n);
  void lower_transpose(const Node& n);
  void lower_pool(const Node& n);
  // A depthwise conv2d on the VPU (vector.cpp); false when it does not apply or
  // fit, and lower_conv takes it as a matmul per channel.
  bool lower_depthwise(const Node& n);
  // A fused member of a conv whose epilogue is its own (depthwise on the VPU,
  // lower_conv_patches), with its single-element operand if binary.
  struct DwMember {
    const Node* m;
    std::string other;  // a binary member's single-element operand
    bool run_first;     // the running value is its first operand
    int64_t tile;       // VMEM of that operand replicated over a tile
  };
  std::vector<DwMember> conv_members(const Node& n) const;  // n's chain, each member's operand named
  bool depthwise_shifted(const Node& n, std::vector<DwMember>& members);
  void load_dw_constants(const Node& n, int64_t ws, int64_t bs, const std::vector<DwMember>& members);
  void apply_dw_members(const Node& n, const std::vector<DwMember>& members, int v, int bounds = -1);
  static bool bounds_member(const std::vector<DwMember>& members);
  void hoisted_bounds(const std::vector<DwMember>& members, int k);
  // A conv2d node's operands and attributes (NCHW input, OIHW weights): CIall the
  // input's channels, CI a group's.
  struct ConvShape {
    Placed X, Wt;
    std::vector<int64_t> st, pads, dil;
    int64_t G, NB, CIall, H, W, CO, CI, KH, KW, OH, OW;
  };
  ConvShape conv_shape(const Node& n) const {
    const Placed& X = t_.at(n.inputs[0]);
    const Placed& Wt = t_.at(n.inputs[1]);
    const Shape& xs = X.type.shape;
    const Shape& ws = Wt.type.shape;
    return ConvShape{X, Wt, n.attr_ints("strides"), n.attr_ints("pads"), n.attr_ints("dilations"),
                     n.has_attr("groups") ? n.attr_int("groups") : 1, xs[0], xs[1], xs[2], xs[3],
                     ws[0], ws[1], ws[2], ws[3], n.type.shape[2], n.type.shape[3]};
  }
  // A conv lower_pointwise takes, W x X in NCHW: the passes' conv_tiles_nchw (1x1,
  // unpadded, one group; a strided one on its input's every s-th pixel).
  bool pointwise(const Node& n) const { return conv_tiles_nchw(n, t_.at(n.inputs[1]).type.shape); }
  // A conv2d whose im2col rows the matmul reads straight from padded NHWC planes
  // (matrix.cpp); false when it does not apply or fit.
  bool lower_conv_shifted(const Node& n);
  // A conv2d of K <= R a chunk per MXU (the stems) as W x P^T: its patches gathered in
  // VMEM a band of output rows at a time and pushed as the MXUs' columns, its tiles
  // NCHW (matrix.cpp); false when it does not apply or fit.
  bool lower_conv_patches(const Node& n);
  // The planes of a shifted conv: one per stride phase (phases, in first-use order),
  // Hr rows of Wq pixels each (prow pixels), an image's planes `image` bytes; tap t
  // reads plane tap_at[t].first at a shift of tap_at[t].second pixels; M1 matmul rows
  // an image. False when the conv is not a shifted one (lower_conv takes another way,
  // or its taps are under 128 bytes, or the planes do not fit VMEM's staging).
  struct ShiftPlanes {
    int64_t Hq, Wq, Hr, prow, nph, image, M1;
    std::vector<std::pair<int64_t, int64_t>> phases, tap_at;
  };
  bool shift_planes(const Node& n, ShiftPlanes* p) const;
  // Conv results stored as the planes of their sole consumer, a one-phase shifted
  // conv whose rows are as wide as the producer's (lower_conv_shifted writes them so,
  // the consumer reads them as they are): tensor -> the planes' bytes, which the HBM
  // plan gives it instead of its NCHW size (lower.cpp), one image's, and the pixel
  // the producer's row 0 starts at.
  struct PlanesOut {
    int64_t bytes, image, shift, wq;  // all images' planes; one image's; where row 0 pixel 0 goes (pixels); pixels a row
  };
  std::map<std::string, PlanesOut> planes_out_;
  // Producers of several phases (stride 2) whose rows are narrower than their
  // consumer's planes compute that many pixels a row instead (conv id -> Wq): the
  // extra ones read zero padding and land on the consumer's padding.
  std::map<int, int64_t> wq_at_least_;
  void plan_planes_out();
  // A conv's NHWC result at Y (rows of Wq pixels, the first OW outputs; images
  // ystride bytes apart, 0: OH rows) -> group g's channels of the NCHW output at y.
  void zero_planes_padding(int64_t addr, const PlanesOut& po, int64_t NB, int64_t OH, int64_t OW, int64_t Wq,
                           int64_t CO, DType dt);
  void move_to_nchw(int64_t Y, int64_t y, int64_t NB, int64_t OH, int64_t OW, int64_t Wq, int64_t COg, int64_t CO,
                    int64_t g, DType dt, int64_t ystride = 0);
  // Group g's OIHW weights as the im2col matmul's B, W[(kh,kw,cin), o], at HBM Wm.
  void conv_weights(const Node& n, int64_t g, int64_t Wm, bool const_w);
  bool staged_weights(int64_t src, int64_t Wm, int64_t CO, int64_t CI, int64_t T, DType dt, bool swapped, bool flip);
  // A 1x1 conv2d as the matmul W x X per image, in NCHW (matrix.cpp).
  void lower_pointwise(const Node& n);
  // `members`: how many of n's chain the matmul's epilogue applies (-1: all).
  void conv_matmul(const Node& n, const std::string& tag, const std::string& lhs, const std::string& rhs,
                   const Shape& shape, int members = -1);
  // A shifted conv on full-width MXUs stores its NCHW result itself (lower_matmul's
  // nchw_out_), so a fused member may take an operand of its shape: it runs on the
  // transposed bands (NCHW), after the epilogue.
  bool stores_nchw_bands(const Node& conv) const;
  size_t first_on_bands(const Node& conv) const;
  void lower_all_reduce(const Node& n);  // collective.cpp
  void lower_direct_collective(const Node& n);  // all_gather, reduce_scatter, all_to_all
  // grad.cpp: the training graphs' backward ops (docs/training.md).
  void lower_maxpool_grad(const Node& n);
  void lower_reverse(const Node& n);
  void lower_im2col(const Node& n);
  // shape.cpp: data movement (concat, slice, pad, gather), unfolded batchnorm,
  // softmax/reductions over any axis, avgpool excluding padded taps.
  void copy_nd(int64_t dst, const std::vector<int64_t>& dst_strides, int64_t src,
               const std::vector<int64_t>& src_strides, const Shape& shape, int64_t e);
  // copy_nd's transfers, their offsets from the two bases (none for an empty shape).
  std::vector<Gather> strided_copies(const std::vector<int64_t>& dst_strides, const std::vector<int64_t>& src_strides,
                                     const Shape& shape, int64_t e) const;
  void fill(int64_t dst, int64_t bytes, DType t, float value);
  // Streams `total` elements in 8x128 tiles, round robin over the cores: source k
  // (address, dtype) is loaded into vk, `body` leaves the result in v9.
  void stream_tiles(const std::vector<std::pair<int64_t, DType>>& srcs, int64_t total, int64_t dst, DType odt,
                    const std::vector<std::string>& body);
  void lower_concat(const Node& n);
  void lower_slice(const Node& n);
  void lower_pad(const Node& n);
  void lower_gather(const Node& n);
  void lower_batchnorm(const Node& n);
  void lower_axis_op(const Node& n);
  void lower_columns(const Node& n, int64_t outer, int64_t len, int64_t inner);
  void lower_unit_axis(const Node& n);
  template <typename Reduce>
  void lower_column_reduce(const Node& n, int64_t outer, int64_t len, int64_t inner, Reduce& reduce);
  void lower_avgpool_exclude_pad(const Node& n);
  // arrival.cpp: a stream's events (their code, in program order) with a dispatch
  // that lets an event go before those ahead of it when its data comes first.
  // mode: LowerOptions::arrival_order, 1 or 2 (0 emits the events in place).
  // What the code's text does not say about an event:
  struct ArrivalEvent {
    int flag = -1;        // a consume's landing wait: flag (-1 for other events) and count
    int64_t count = 0;
    char space = 0;       // where the landing writes: 'v' VMEM (a slot), 'h' HBM (y)
    int64_t lo = 0, hi = 0;
    bool pinned = false;  // stays in place (a block gate's lines around it)
  };
  void emit_in_arrival_order(const std::vector<std::string>& texts, const std::vector<ArrivalEvent>& events,
                             int stream, int mode);
  int labels_ = 0;  // unique branch labels (gather's index checks, arrival-order dispatch)
  std::vector<std::string> notes_;  // LowerResult::notes
  // Adds a note once (a node's replicas lower it alike, each would add it).
  void note_once(const std::string& note) {
    if (std::find(notes_.begin(), notes_.end(), note) == notes_.end()) notes_.push_back(note);
  }

  const Graph& g_;
  const LowerOptions& opt_;
  std::ostringstream out_;
  int cores_ = 1;
  int cur_ = 0;  // the core whose program the code goes to
  std::vector<std::ostringstream> cs_;
  std::vector<std::ostringstream> tail_;  // per core: code placed after its halt (forked streams)
  std::map<std::string, Placed> t_;
  int64_t hbm_top_ = 0;                        // high-water mark: nothing at or above it was ever placed
  std::map<int64_t, int64_t> hbm_free_;        // free blocks below hbm_top_: start -> bytes, coalesced
  std::set<int64_t> fresh_;                    // starts of placements carved from never-used HBM
  std::vector<std::pair<int64_t, int64_t>> node_scratch_;  // the current node's scratch: (start, bytes)
  int64_t hbm_sum_ = 0;                        // what a bump allocator would have reached (no reuse)
  int64_t coll_sent_ = 0;                // collective.cpp's running count of sends
  std::map<int, int64_t> coll_landed_;  // and of landings, per rflag
  std::map<int, int64_t> entry_token_slots_;  // LowerResult::entry_token_slots
  std::vector<int64_t> dmas_;
  std::vector<std::map<int, int64_t>> flag_dmas_;
  std::vector<int64_t> drained_dmas_;                  // per core: DMAs on f1 waited for by drain_dmas
  std::vector<std::map<int, int64_t>> drained_flags_;  // and on the per-op flags
  std::map<int, std::vector<const Node*>> chains_;  // root id -> fused members
  std::map<int, int> fused_;                        // member (or feeder) id -> root id
  // Feeders: an elementwise op of operands that exist before the root runs, read only
  // by one member of an elementwise chain as its other operand. The chain's kernel
  // computes it in registers from its operands (lower_elementwise); it is never stored.
  std::map<int, const Node*> feeds_;  // member id -> its feeder
  // Results inside an elementwise chain that other nodes read too: the chain's kernel
  // stores them as it goes on (lower_elementwise), instead of ending the chain there.
  std::set<std::string> side_stored_;
  std::map<int, std::vector<const Node*>> regions_;  // row region: first node's id -> its nodes in order
  std::map<int, int> region_of_;                     // node id -> its region's first node id
  std::set<std::string> region_exports_;             // region values read outside it (or graph outputs)
  std::map<std::string, RegionValue::Kind> kinds_;   // a region value's layout in VMEM
  std::vector<const Node*> epi_;  // the chain lower_matmul applies (set by its caller)
  std::string epi_src_;           // the result the chain's first member reads, when not the matmul's own
  std::string epi_dst_;           // where lower_matmul stores, if not the chain's end (conv's NHWC scratch)
  // Set by lower_conv_shifted for one lower_matmul: the LHS is im2col rows that are never
  // built. Row r of batch element b, columns [t * ci, (t + 1) * ci) (tap t), is
  // `ci` elements at HBM base + b * image + (tap_rows[t] + r) * ci * element size:
  // a padded NHWC plane read at the tap's shift (matrix.cpp, lower_conv_shifted).
  struct ShiftedLhs {
    int64_t base = 0, image = 0, ci = 0, prow = 0;  // prow: the rows of one plane
    std::vector<int64_t> tap_rows;
  } shifted_;
  // Set for one lower_matmul: its output's batch stride in bytes (0: M x N elements),
  // when a conv's NHWC result goes straight into its consumer's planes.
  int64_t out_batch_stride_ = 0;
  // Head transposes folded into a matmul (lower.cpp): a [B0, S, H, D] tensor read or
  // written as the [B0, H, S, D] one (perm [0, 2, 1, 3]), whose batch b = b0 * H + h
  // starts at element (b0 * S * H + h) * D and whose rows are H * D elements apart.
  // Keyed by the matmul operand (the transpose's result, never stored) or the matmul's
  // result (stored so: the transpose's result is its bytes).
  struct HeadView {
    int64_t S = 0, H = 0, D = 0;
  };
  std::map<std::string, HeadView> views_;
  // Set by lower_conv_shifted for one lower_matmul: the conv's NCHW output (addr < 0:
  // none). The matmul stores it straight, each output band transposed through VMEM,
  // instead of NHWC rows that move_to_nchw reads back; transposed_stored_ says it did.
  // Matmul row m is pixel m % Wq of output row m / Wq (pixels >= OW dropped) of image
  // b, or with `prow` (a tall matmul over the batch) of image m / prow at row m % prow
  // (rows >= OH * Wq dropped). `post`: the chain's members from the first whose operand
  // is a tensor of the conv's shape (NCHW) on, applied to the transposed bands; `run`
  // is the value the first of them reads.
  struct NchwOut {
    int64_t addr = -1, OH = 0, OW = 0, Wq = 0, prow = 0;
    std::vector<const Node*> post;
    std::string run;
  } nchw_out_;
  // Set by lower_pointwise for one lower_matmul: its W x X tiles (rows channels, columns
  // pixels) go transposed into the next conv's planes (plan_planes_out): pixel
  // oh * W + ow of image b is plane pixel head + oh * Wq + ow, at addr + b * image.
  struct PlanesStore {
    int64_t addr = -1, image = 0, head = 0, W = 0, Wq = 0;
  } planes_store_;
  bool transposed_stored_ = false;  // lower_matmul stored nchw_out_ or planes_store_
  std::vector<isa::IoEntry> extra_consts_;  // constants the lowering lays out itself (conv weights as W[(kh,kw,cin), o])
  // A conv's weight gradient matmul(im2col(x), im2col(dy, 1x1), trans_a=1) read
  // straight from x and dy in VMEM (grad.cpp, lower_conv_wgrad): no patches in HBM.
  // nb: images a VMEM load holds (nb * H * W a multiple of R unless it is the batch).
  // oihw: the result is stored as transpose(reshape(it, [KH,KW,CI,CO]), [3,2,0,1]),
  // whose bytes it then is (the training graph's dW in the weight's own layout).
  struct WGrad {
    std::string x, dy;
    int64_t KH = 0, KW = 0, pt = 0, pl = 0, nb = 0;
    bool oihw = false;
  };
  std::map<int, WGrad> wgrads_;  // matmul id -> its plan
  // Nodes never lowered because their one reader reads their operands instead: a
  // weight gradient's im2cols, a flipped weight's transpose (folded_transpose_).
  std::set<int> read_past_;
  void plan_read_past(const std::map<std::string, size_t>& producer, const std::map<std::string, int>& readers,
                      const std::set<std::string>& kept);
  // reverse(transpose(W, [1,0,2,3]), axes [2,3]) (a conv's flipped weight for its
  // input gradient) -> the transpose: the reverse reads W through its perm
  // (lower_reverse), one gather.
  std::map<int, const Node*> folded_transpose_;
  // A shifted conv whose weight is such a reverse read by it alone (its input
  // gradient): conv_weights gathers its im2col weights from the reverse's source at
  // once, and the reverse is not lowered. conv id -> the reverse.
  std::map<int, const Node*> flipped_weights_;
  void lower_conv_wgrad(const Node& m);
};

}  // namespace tpusim::compiler::lowering
