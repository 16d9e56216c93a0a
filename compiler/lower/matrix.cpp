// MXU lowerings: matmul / Gemm, and conv2d as a matmul over im2col rows.
#include "compiler/lower/emitter.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <tuple>
#include <utility>

#include "isa/numerics/bf16.h"

namespace tpusim::compiler::lowering {

void Emitter::layout_constant(int64_t addr, const std::string& name, DType dt, const Shape& shape,
                              const std::function<float(int64_t)>& value) {
  isa::IoEntry e;
  e.kind = isa::IoKind::kConst;
  e.name = name;
  e.dtype = dt == DType::kBf16 ? isa::Dtype::kBf16 : isa::Dtype::kF32;
  e.shape = shape;
  e.space = isa::Space::kHbm;
  e.addr = static_cast<uint64_t>(addr);
  const int64_t es = esz(dt), count = num_elements(shape);
  e.data.resize(static_cast<size_t>(count * es));
  for (int64_t i = 0; i < count; ++i) {
    const float f = value(i);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (es == 2) u = num::fp32_to_bf16(f);
    for (int64_t k = 0; k < es; ++k) e.data[static_cast<size_t>(i * es + k)] = static_cast<uint8_t>(u >> (8 * k));
  }
  extra_consts_.push_back(std::move(e));
}

// Group g's OIHW weights as W[(kh,kw,cin), o] at HBM Wm, the im2col matmul's B: a
// constant is laid out at compile time (a .const entry of its own: no run-time
// rearrangement, and the matmul's weight loads read contiguous rows); otherwise
// through VMEM when it fits (staged_weights).
void Emitter::conv_weights(const Node& n, int64_t g, int64_t Wm, bool const_w) {
  const Placed Wt = t_.at(n.inputs[1]);
  const int64_t G = n.has_attr("groups") ? n.attr_int("groups") : 1;
  const int64_t CO = Wt.type.shape[0], CI = Wt.type.shape[1], KH = Wt.type.shape[2], KW = Wt.type.shape[3];
  const int64_t COg = CO / G, K = KH * KW * CI, ew = esz(Wt.type.dtype);
  const int64_t wbytes = COg * CI * KH * KW * ew;
  const Constant* wc = g_.find_constant(n.inputs[1]);
  if (const auto fw = flipped_weights_.find(n.id); fw != flipped_weights_.end()) {
    // The weight is reverse(V, axes [2, 3]) (plan_read_past), V OIHW or, with a
    // transpose [1, 0, 2, 3] folded in, W = V with o and i swapped: B[(kh, kw, ci), co]
    // = V[co, ci, KH-1-kh, KW-1-kw], gathered from V's (or W's) bytes.
    const auto ft = folded_transpose_.find(fw->second->id);
    const bool swapped = ft != folded_transpose_.end();
    const Placed& src = t_.at(swapped ? ft->second->inputs[0] : fw->second->inputs[0]);
    if (G != 1 || !staged_weights(src.addr, Wm, CO, CI, KH * KW, Wt.type.dtype, swapped, true))
      fail(n, "internal: a flipped weight it cannot gather");
    return;
  }
  if (wc && const_w) {
    layout_constant(Wm, "#conv" + std::to_string(n.id) + "g" + std::to_string(g) + "w", Wt.type.dtype, {K, COg},
                    [&](int64_t i) {
                      const int64_t o = i % COg, ci = i / COg % CI, t = i / (COg * CI), kh = t / KW, kw = t % KW;
                      return wc->f[static_cast<size_t>((((g * COg + o) * CI + ci) * KH + kh) * KW + kw)];
                    });
    return;
  }
  if (staged_weights(Wt.addr + g * wbytes, Wm, COg, CI, KH * KW, Wt.type.dtype, false, false)) return;
  for (int64_t kh = 0; kh < KH; ++kh)
    for (int64_t kw = 0; kw < KW; ++kw)
      dma(hbm(Wm + (kh * KW + kw) * CI * COg * ew), hbm(Wt.addr + (g * COg * CI * KH * KW + kh * KW + kw) * ew), ew,
          dim(COg, CI * KH * KW * ew, ew) + dim(CI, KH * KW * ew, COg * ew));
  wait_dmas();
}

// B[(t, ci), co] (t = kh * KW + kw of T taps; CO x CI x T elements of ew bytes) at
// HBM Wm from the source at src: OIHW [co][ci][t], or with `swapped` [ci][co][t];
// `flip` reads tap T-1-t (a reverse of both spatial axes). Through VMEM: one load,
// the gathers, one store. A copy within VMEM holds one of the core's DMA engines for
// the on-chip path's latency and its bytes (tensorcore.md, "DMA"), so the gathers are
// one a DMA engine, each a range of taps (disjoint destinations): a gather a tap took
// three rounds of the four engines (~1.6 K cycles for a 3x3x128x128 fp32 weight, 590
// KB, against ~0.7 K). False if the weight does not fit VMEM twice.
bool Emitter::staged_weights(int64_t src, int64_t Wm, int64_t CO, int64_t CI, int64_t T, DType dt, bool swapped,
                             bool flip) {
  const int64_t ew = esz(dt), bytes = CO * CI * T * ew;
  if (!staging_fits(bytes, bytes)) return false;
  const int64_t so = (swapped ? T : CI * T) * ew, si = (swapped ? CO * T : T) * ew;  // source strides of co, ci
  const int64_t parts = std::min(T, kDmaEngines);
  std::vector<Gather> gathers;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t t0 = T * p / parts, t1 = T * (p + 1) / parts;
    gathers.push_back(Gather{(flip ? T - 1 - t0 : t0) * ew, t0 * CI * CO * ew, ew,
                             dim(CO, so, ew) + dim(CI, si, CO * ew) + dim(t1 - t0, flip ? -ew : ew, CI * CO * ew),
                             true});
  }
  staged_gather(src, bytes, Wm, bytes, gathers, false, 0.0f, dt);
  return true;
}

// A conv's NHWC result (NB images of OH rows of Wq pixels, COg channels; the first OW
// pixels of a row are outputs) -> group g's channels of the NCHW output at y (CO
// channels). Through VMEM when it fits (element-sized runs are cheap there, one memory
// request each in HBM), in bands of output rows, round robin over the cores (a band a
// core when images are fewer than cores): a band's rows come in as one DMA and go out
// as one, a run per channel.
void Emitter::move_to_nchw(int64_t Y, int64_t y, int64_t NB, int64_t OH, int64_t OW, int64_t Wq, int64_t COg,
                           int64_t CO, int64_t g, DType dt, int64_t ystride) {
  const int64_t eo = esz(dt), ibytes = ystride > 0 ? ystride : OH * Wq * COg * eo;
  const int64_t per_image = (cores_ + NB - 1) / NB, band = (OH + per_image - 1) / per_image;
  int64_t unit = 0;
  for (int64_t b = 0; b < NB; ++b) {
    const int64_t out = y + ((b * CO + g * COg) * OH) * OW * eo;
    if (!staging_fits(ibytes, OH * OW * COg * eo)) {
      dma(hbm(out), hbm(Y + b * ibytes), eo, dim(OW, COg * eo, eo) + dim(OH, Wq * COg * eo, OW * eo) +
                                               dim(COg, eo, OH * OW * eo));
      wait_dmas();
      continue;
    }
    for (int64_t r0 = 0; r0 < OH; r0 += band) {
      const int64_t nr = std::min(band, OH - r0);
      on_core(unit++);
      staged_gather(Y + b * ibytes + r0 * Wq * COg * eo, nr * Wq * COg * eo, out + r0 * OW * eo, COg * nr * OW * eo,
                    {Gather{0, 0, eo, dim(OW, COg * eo, eo) + dim(nr, Wq * COg * eo, OW * eo) + dim(COg, eo, nr * OW * eo)}},
                    false, 0.0f, dt, 1, 0, {1, 0}, {COg, OH * OW * eo});
    }
  }
  cur_ = 0;
}

// An ungrouped conv2d as the im2col matmul whose rows are never built (docs/codegen.md,
// "Shifted convolutions"). Each image is laid out once as padded NHWC planes, one per
// stride phase (plane (p, q) holds padded (s0 * i + p, s1 * j + q), i < Hq, j < Wq,
// zeros in the padding), and the matmul computes Wq outputs per output row: row
// oh * Wq + ow, tap (kh, kw) is the plane of phase (kh*d0 % s0, kw*d1 % s1) at row
// oh * Wq + ow + (kh*d0 / s0) * Wq + kw*d1 / s1, so each tap's columns of a band of
// LHS rows are one strided DMA from HBM (lower_matmul's ShiftedLhs). Columns ow >= OW
// read past the row's end and are dropped by the move to NCHW. The chunk order over
// k = (kh*KW + kw)*Cin + cin and every product are the im2col matmul's, so the values
// are the contract's convolution. Against im2col rows in HBM this neither writes nor
// gathers the K-times-larger rows: resnet's 64-channel 3x3 conv on 56 x 56 (v3 bf16,
// 2 cores, run-time weights) 27,658 -> 17,855 cycles.
bool Emitter::shift_planes(const Node& n, ShiftPlanes* sp) const {
  const ConvShape cs = conv_shape(n);
  const auto& [X, Wt, st, pads, dil, G, NB, CIall, H, W, CO, CI, KH, KW, OH, OW] = cs;
  const int64_t ex = esz(X.type.dtype);
  // Pointwise convs take their own lowering (lower_conv). A tap's run is Cin elements
  // per LHS row: below 128 bytes (the 7x7 stems' 3 channels) the DMAs' short runs cost
  // more than the im2col rows save.
  if (G != 1 || CI * ex < kStagedRunsBelow || pointwise(n)) return false;
  ShiftPlanes& p = *sp;
  const int64_t s0 = st[0], s1 = st[1];
  p.Hq = (H + pads[0] + pads[2] + s0 - 1) / s0;
  p.Wq = (W + pads[1] + pads[3] + s1 - 1) / s1;
  if (const auto wq = wq_at_least_.find(n.id); wq != wq_at_least_.end()) p.Wq = std::max(p.Wq, wq->second);
  // The phases the taps use, in first-use order, and each tap's plane row offset.
  p.phases.clear();
  p.tap_at.clear();
  int64_t max_shift = 0;
  for (int64_t kh = 0; kh < KH; ++kh)
    for (int64_t kw = 0; kw < KW; ++kw) {
      const std::pair<int64_t, int64_t> ph{kh * dil[0] % s0, kw * dil[1] % s1};
      const auto it = std::find(p.phases.begin(), p.phases.end(), ph);
      const int64_t idx = it - p.phases.begin();
      if (it == p.phases.end()) p.phases.push_back(ph);
      const int64_t shift = kh * dil[0] / s0 * p.Wq + kw * dil[1] / s1;
      p.tap_at.push_back({idx, shift});
      max_shift = std::max(max_shift, shift);
    }
  p.M1 = OH * p.Wq;  // matmul rows per image
  // Rows of a plane: the padded ones and what the last output rows' dropped columns
  // read, in whole rows of Wq.
  p.Hr = std::max(p.Hq, (p.M1 + max_shift + p.Wq - 1) / p.Wq);
  p.prow = p.Hr * p.Wq;
  p.nph = static_cast<int64_t>(p.phases.size());
  p.image = p.nph * p.prow * CI * ex;
  return staging_fits(CI * H * W * ex, p.image);
}

// The index in n's chain of the first member whose other operand is a tensor (not a
// single element): on a shifted conv it and the rest run on the NCHW bands (fusion.cpp).
size_t Emitter::first_on_bands(const Node& n) const {
  const std::vector<const Node*>& chain = chain_of(n);
  std::string run = n.output;
  for (size_t i = 0; i < chain.size(); ++i) {
    const Node& m = *chain[i];
    if (m.inputs.size() == 2 && num_elements(t_.at(m.inputs[m.inputs[0] == run ? 1 : 0]).type.shape) > 1) return i;
    run = m.output;
  }
  return chain.size();
}

bool Emitter::stores_nchw_bands(const Node& n) const {
  ShiftPlanes sp;
  return n.op == OpKind::kConv2d && opt_.target.mxu_cols == 128 && shift_planes(n, &sp);
}

// Before the nodes are lowered: a shifted conv whose chain's end is read by one node
// only, a shifted conv of one phase (stride 1) whose planes are rows of the same Wq
// pixels, writes its NHWC result straight into those planes (lower_conv_shifted):
// its move to NCHW and the consumer's planes are never made.
void Emitter::plan_planes_out() {
  std::map<std::string, int> readers;  // a graph output counts as two
  std::map<std::string, const Node*> reader_of;
  for (const Node& n : g_.nodes)
    for (const std::string& in : n.inputs) ++readers[in], reader_of[in] = &n;
  for (const std::string& out : g_.outputs) readers[out] += 2;
  ShiftPlanes mine, theirs;
  for (const Node& n : g_.nodes) {
    if (n.op != OpKind::kConv2d || fused_away(n)) continue;
    // A pointwise conv's W x X tiles go transposed into the planes on full-width MXUs
    // (lower_matmul's planes_store_): any Wq.
    const bool pw = pointwise(n) && opt_.target.mxu_cols == 128;
    if (!pw && !shift_planes(n, &mine)) continue;
    const std::vector<const Node*>& chain = chain_of(n);
    const Node& last = chain.empty() ? n : *chain.back();
    if (readers[last.output] != 1 || (!pw && first_on_bands(n) < chain.size())) continue;
    const Node& next = *reader_of.at(last.output);
    if (next.op != OpKind::kConv2d || next.inputs[0] != last.output || !shift_planes(next, &theirs)) continue;
    const auto& pads = next.attr_ints("pads");
    const int64_t shift = pads[0] * theirs.Wq + pads[1];
    if (theirs.nph != 1) continue;
    if (pw) {
      planes_out_[last.output] = PlanesOut{n.type.shape[0] * theirs.image, theirs.image, shift, theirs.Wq};
      continue;
    }
    // A producer of several phases reads no planes (only a one-phase conv does), so
    // its rows may widen to the consumer's: the extra pixels read padding.
    if (mine.nph > 1 && mine.Wq < theirs.Wq) {
      wq_at_least_[n.id] = theirs.Wq;
      if (!shift_planes(n, &mine)) {
        wq_at_least_.erase(n.id);
        continue;
      }
    }
    if (theirs.Wq != mine.Wq || shift + mine.M1 > theirs.prow) {
      wq_at_least_.erase(n.id);
      continue;
    }
    planes_out_[last.output] = PlanesOut{n.type.shape[0] * theirs.image, theirs.image, shift, theirs.Wq};
  }
}

// A producer's result written into its consumer's planes (plan_planes_out) leaves
// the consumer's padding to zero: an image's pixels before row 0 and after the last
// row, and the Wq - OW pixels after each row (its right padding and the next one's
// left; a shifted producer's dropped columns wrote over them), zeros from VMEM, an
// image a core.
void Emitter::zero_planes_padding(int64_t addr, const PlanesOut& po, int64_t NB, int64_t OH, int64_t OW, int64_t Wq,
                                  int64_t CO, DType dt) {
  const int64_t eo = esz(dt), px = CO * eo, head = po.shift, tail = po.image / px - head - OH * Wq;
  const int64_t zbytes = align_up(std::max({head, tail, Wq - OW}) * px, kTileElems * eo);
  for (int64_t b = 0; b < NB; ++b) {
    on_core(b);
    const int64_t base = addr + b * po.image;
    if (b < cores_) fill_vmem(0, zbytes, 0.0f, dt);  // the core's zeros
    if (head > 0) dma(hbm(base), vmem(0), head * px, "");
    if (tail > 0) dma(hbm(base + (head + OH * Wq) * px), vmem(0), tail * px, "");
    if (Wq > OW) dma(hbm(base + (head + OW) * px), vmem(0), (Wq - OW) * px, dim(OH, 0, Wq * px));
  }
  for (cur_ = 0; cur_ < std::min<int64_t>(cores_, NB); ++cur_) wait_dmas();
  cur_ = 0;
}

bool Emitter::lower_conv_shifted(const Node& n) {
  ShiftPlanes sp;
  if (!shift_planes(n, &sp)) return false;
  const ConvShape cs = conv_shape(n);
  const auto& [X, Wt, st, pads, dil, G, NB, CIall, H, W, CO, CI, KH, KW, OH, OW] = cs;
  const std::vector<const Node*>& chain = chain_of(n);
  const Node& last = chain.empty() ? n : *chain.back();
  const int64_t ex = esz(X.type.dtype), eo = esz(last.type.dtype);
  const int64_t s0 = st[0], s1 = st[1];
  const int64_t Hq = sp.Hq, Wq = sp.Wq, M1 = sp.M1, Hr = sp.Hr, prow = sp.prow, nph = sp.nph, image = sp.image;
  const auto& phases = sp.phases;
  const int64_t ybytes = M1 * CO * eo;
  const std::string tag = "#conv" + std::to_string(n.id) + "g0";
  const bool const_w = g_.find_constant(n.inputs[1]) != nullptr;
  const int64_t K = KH * KW * CI;
  // Planes the producer wrote (plan_planes_out): the input tensor is them.
  const bool planes_in = planes_out_.count(n.inputs[0]) != 0;
  // This conv's result goes into its consumer's planes: row 0 pixel 0 at `shift`
  // pixels into an image's, the images `image` bytes apart.
  const auto po = planes_out_.find(last.output);
  const bool planes_out = po != planes_out_.end();
  const int64_t Xq = planes_in ? X.addr : place_hbm(NB * image);
  // Small images go through the MXUs as one tall matmul over the batch: the planes are
  // laid out phase by phase, each phase's of every image in turn, so image b's rows of
  // a plane follow image b - 1's, matmul row b * prow + r is image b's row r, and rows
  // r >= M1 between images are computed and dropped. Taken where an image's weights
  // outweigh its rows twice (per image, each would fetch and push all the weights for
  // its few rows: resnet50's layer4, 63 rows an image against 4.7 MB of weights, and
  // its stride-2 conv of 4 phases, 56 rows an image), or, with one phase, where the
  // dropped rows are at most 1/16.
  const bool tall = NB > 1 && (CO * esz(Wt.type.dtype) > 2 * M1 * ex || (nph == 1 && (prow - M1) * 16 <= M1)) &&
                    (!planes_out || prow * CO * eo == po->second.image);
  // Plane k of image b is at Xq + b * istride + k * pstride.
  const int64_t istride = tall ? prow * CI * ex : image, pstride = tall ? NB * prow * CI * ex : prow * CI * ex;
  const int64_t ystride = tall ? prow * CO * eo : ybytes;  // an image's result rows
  const int64_t MB = tall ? 1 : NB, MR = tall ? (NB - 1) * prow + M1 : M1;  // the matmul's batches and rows
  const int64_t Y = planes_out ? t_.at(last.output).addr + po->second.shift * CO * eo : place_hbm(NB * ystride);
  const int64_t Wm = const_w ? place_hbm_pinned(K * CO * esz(Wt.type.dtype)) : place_hbm(K * CO * esz(Wt.type.dtype));
  check_addr(n, hbm_top_);
  // Run-time weights are laid out on the last core, beside the first image's planes.
  cur_ = cores_ - 1;
  conv_weights(n, 0, Wm, const_w);
  // Each image's planes are built in bands of plane rows, round robin over the cores
  // (a band a core when the images do not give each core one): the input rows a band
  // uses come in as one DMA, the band's rows of every phase are zero-filled and then
  // one VMEM -> VMEM gather per phase, and each phase's rows go out as one DMA.
  struct PlaneBand {
    int64_t src, src_bytes, dst, dst_bytes;
    std::vector<Gather> gathers;
  };
  std::vector<PlaneBand> bands;
  const int64_t per_image = (cores_ + NB - 1) / NB, band = (Hr + per_image - 1) / per_image;
  for (int64_t b = 0; b < (planes_in ? 0 : NB); ++b)
    for (int64_t i0 = 0; i0 < Hr; i0 += band) {
      const int64_t i1 = std::min(Hr, i0 + band);
      // Input rows [ya, yb): every row a phase's plane rows [i0, i1) hold.
      const int64_t ya = std::clamp(i0 * s0 - pads[0], int64_t{0}, H);
      const int64_t yb = std::clamp((i1 - 1) * s0 - pads[0] + s0, ya, H);
      std::vector<Gather> gathers;
      for (int64_t k = 0; k < nph; ++k) {
        const auto [p, q] = phases[static_cast<size_t>(k)];
        int64_t r0, r1, j0, j1;  // the plane's rows and columns that hold image pixels
        tap_range(Hq, H, s0, pads[0], p, &r0, &r1);
        tap_range(Wq, W, s1, pads[1], q, &j0, &j1);
        r0 = std::max(r0, i0);
        r1 = std::min(r1, i1);
        if (r0 >= r1 || j0 >= j1) continue;
        gathers.push_back(Gather{((r0 * s0 - pads[0] + p - ya) * W + j0 * s1 - pads[1] + q) * ex,
                                 ((k * (i1 - i0) + r0 - i0) * Wq + j0) * CI * ex, ex,
                                 dim(j1 - j0, s1 * ex, CI * ex) + dim(CI, (yb - ya) * W * ex, ex) +
                                     dim(r1 - r0, s0 * W * ex, Wq * CI * ex)});
      }
      const int64_t rows = std::max<int64_t>(yb - ya, 1);  // a band of padding only still loads a row
      bands.push_back(PlaneBand{X.addr + (b * CI * H + std::min(ya, H - 1)) * W * ex, CI * rows * W * ex,
                                Xq + b * istride + i0 * Wq * CI * ex, nph * (i1 - i0) * Wq * CI * ex,
                                std::move(gathers)});
    }
  int64_t in_bytes = 0, out_bytes = 0;
  for (const PlaneBand& pb : bands) {
    in_bytes = std::max(in_bytes, align_up(pb.src_bytes, kAlign));
    out_bytes = std::max(out_bytes, align_up(pb.dst_bytes, kAlign));
  }
  const int64_t S = kRingSlots;
  if (bands.size() > static_cast<size_t>(cores_) && staging_fits(S * in_bytes, S * out_bytes)) {
    // More bands than cores: a ring of three, so a core's band is gathered while the
    // one before goes out and the next two come in (one after the other, resnet50's
    // layer4.0 conv2 at v3 batch 8 spent ~8 K cycles building its planes).
    const HbmRuns runs{CI, H * W * ex};
    auto out_at = [&](int64_t slot) { return S * in_bytes + slot * out_bytes; };
    gathered_stream(
        static_cast<int64_t>(bands.size()),
        [&](int64_t u, int64_t slot, int flag) {
          const PlaneBand& pb = bands[static_cast<size_t>(u)];
          dma_on(flag, vmem(slot * in_bytes), hbm(pb.src), pb.src_bytes / runs.runs,
                 dim(runs.runs, runs.stride, pb.src_bytes / runs.runs));
        },
        [&](int64_t u, int64_t slot, int flag) {
          const PlaneBand& pb = bands[static_cast<size_t>(u)];
          fill_vmem(out_at(slot), pb.dst_bytes, 0.0f, X.type.dtype);
          run_gathers(slot * in_bytes, out_at(slot), pb.gathers, flag);
        },
        [&](int64_t u, int64_t slot, int flag) {
          const PlaneBand& pb = bands[static_cast<size_t>(u)];
          const int64_t part = pb.dst_bytes / nph;
          for (int64_t k = 0; k < nph; ++k)
            dma_on(flag, hbm(pb.dst + k * pstride), vmem(out_at(slot) + k * part), part, "");
        });
  } else {
    for (size_t u = 0; u < bands.size(); ++u) {
      const PlaneBand& pb = bands[u];
      on_core(static_cast<int64_t>(u));
      staged_gather(pb.src, pb.src_bytes, pb.dst, pb.dst_bytes, pb.gathers, true, 0.0f, X.type.dtype, nph, pstride,
                    {CI, H * W * ex});
    }
  }
  cur_ = 0;
  t_[tag + "p"] = Placed{TensorType{X.type.dtype, {MB, MR, K}}, Xq};
  t_[tag + "w"] = Placed{TensorType{Wt.type.dtype, {K, CO}}, Wm};
  t_[tag + "y"] = Placed{TensorType{last.type.dtype, {MB, MR, CO}}, Y};
  if (n.inputs.size() > 2) t_[tag + "b"] = t_.at(n.inputs[2]);
  shifted_.base = Xq;
  shifted_.image = image;
  shifted_.ci = CI;
  shifted_.prow = prow;
  for (const auto& [idx, shift] : sp.tap_at) shifted_.tap_rows.push_back(idx * pstride / (CI * ex) + shift);
  sync_all();
  // Members from the first with an operand of the conv's shape on run on the NCHW bands.
  const size_t on_bands = first_on_bands(n);
  if (planes_out) out_batch_stride_ = po->second.image;
  else nchw_out_ = NchwOut{t_.at(last.output).addr, OH, OW, Wq, tall ? prow : 0,
                           std::vector<const Node*>(chain.begin() + static_cast<std::ptrdiff_t>(on_bands), chain.end()),
                           on_bands == 0 ? n.output : chain[on_bands - 1]->output};
  conv_matmul(n, tag, tag + "p", tag + "w", {MB, MR, CO}, static_cast<int>(on_bands));
  sync_all();
  if (std::exchange(transposed_stored_, false)) return true;
  if (on_bands < chain.size()) fail(n, "internal: fused members on NCHW bands, not stored so");
  if (!planes_out) {
    move_to_nchw(Y, t_.at(last.output).addr, NB, OH, OW, Wq, CO, CO, 0, last.type.dtype, ystride);
    return true;
  }
  zero_planes_padding(t_.at(last.output).addr, po->second, NB, OH, OW, Wq, CO, last.type.dtype);
  return true;
}

// A conv2d whose patches fit the MXUs' rows in a chunk each (K = KH*KW*Cin <= R a
// chunk per MXU: the 7 x 7 and 3 x 3 stems of 3 channels, whose taps the shifted
// planes do not take) as W x P^T, P its im2col patches (docs/codegen.md, "Stems:
// patches pushed as columns"). Bands of output rows, round robin over the cores, go
// through five stages, each band's a stage or two ahead of the band computing: its
// input rows come into VMEM (one DMA), are laid out as padded NHWC rows (one VMEM
// gather; the padding +0.0), its patches are gathered (one VMEM gather: a run of KW
// taps' channels a pixel and kernel row), the MXUs compute, and its NCHW rows go out
// (one DMA). Per tile of C output pixels, chunk c of the pixels' patches goes into
// MXU c as columns (mpush.t: patch row p is column p) and the LHS is the weights,
// W[co, k] over k = (kh*KW + kw)*Cin + cin in lanes, so each result row is an output
// channel over C pixels, NCHW as it lies. Each output sums the im2col matmul's
// products in its chunk order (mpop, then mpop.add a chunk), so the values are the
// contract's convolution; the bias and the fused members follow as in the matmul's
// epilogue. Against im2col rows in HBM and the move to NCHW this reads the input once
// and writes the output once, and the MXUs run while the next band's patches gather.
bool Emitter::lower_conv_patches(const Node& n) {
  const ConvShape cs = conv_shape(n);
  const auto& [X, Wt, st, pads, dil, G, NB, CIall, H, W, CO, CI, KH, KW, OH, OW] = cs;
  const int64_t R = opt_.target.mxu_rows, C = opt_.target.mxu_cols, mxus = opt_.target.mxus_per_core;
  const int64_t K = KH * KW * CI, chunks = (K + R - 1) / R, nb = (CO + 7) / 8;
  const int64_t fifo_vregs = static_cast<int64_t>(opt_.target.fifo_rows) / 8;
  // A chunk an MXU, two sets of an accumulator register an 8-channel block (v8..v15,
  // v16..v23), two tiles' results in each FIFO (the pops lag a tile behind the mmuls).
  if (G != 1 || dil[0] != 1 || dil[1] != 1 || chunks > mxus || nb > 8 || 2 * nb > fifo_vregs) return false;
  std::vector<DwMember> members = conv_members(n);
  for (const DwMember& x : members)
    if (!x.other.empty() && num_elements(t_.at(x.other).type.shape) != 1) return false;
  const Node& last = chain_of(n).empty() ? n : *chain_of(n).back();
  const DType dt = X.type.dtype, wt = Wt.type.dtype, ot = last.type.dtype;
  const bool has_bias = n.inputs.size() > 2;
  const DType bt = has_bias ? t_.at(n.inputs[2]).type.dtype : DType::kF32;
  const int64_t ex = esz(dt), ew = esz(wt), eb = esz(bt), eo = esz(ot);
  const int64_t Wp = W + pads[1] + pads[3], prow = Wp * CI * ex;  // a padded NHWC row
  const int64_t ztile = kTileElems * ex;                            // one zero store
  const auto rows_in = [&](int64_t rows) { return (rows - 1) * st[0] + KH; };
  const Constant* wc = g_.find_constant(n.inputs[1]);
  const int64_t wbytes = CO * CI * KH * KW * ew, wr_bytes = chunks * nb * kTileElems * ew;
  // Per buffer: the input rows of a band (CI planes of pr rows), its padded NHWC rows,
  // its patches (bpo rows of K; the last chunk's vld reads 128 lanes), its output
  // channels (rows os apart). Once: the weights as chunks x nb 8 x 128 tiles (row
  // co of chunk c holds W[co, c*R ..]), as OIHW first when they come at run time, the
  // bias raw and as a tile a block (row s of block j: bias[8j + s] in every lane).
  struct Layout {
    int64_t pr, ich, bpo, os, in[2], pad[2], patch[2], out[2], wraw, wr, braw, btile, end;
  };
  const auto layout = [&](int64_t rows) {
    Layout l{};
    l.pr = rows_in(rows);
    l.ich = l.pr * W * ex;
    l.bpo = align_up(rows * OW, C);
    l.os = odd_stride((l.bpo - C + 128) * eo, 128 * eo);
    int64_t a = 0;
    const auto take = [&a](int64_t bytes) { return std::exchange(a, a + align_up(bytes, 512)); };
    for (int par = 0; par < 2; ++par) {
      l.in[par] = take(CI * l.ich);
      l.pad[par] = take(align_up(l.pr * prow, ztile) + ztile);  // a zero store runs up to a tile past its rows
      l.patch[par] = take((l.bpo * K + chunks * R + 128) * ex);
      l.out[par] = take(nb * 8 * l.os);
    }
    l.wraw = wc ? 0 : take(wbytes);
    l.wr = take(wr_bytes);
    l.braw = take(CO * eb);
    l.btile = take(nb * kTileElems * eb);
    for (DwMember& x : members)  // a member's operand tile and its one element's staging
      if (!x.other.empty()) x.tile = take(2 * kTileElems * esz(t_.at(x.other).type.dtype));
    l.end = a;
    return l;
  };
  // Band rows: the least estimated time of a core (tiles at ~160 cycles, ~600 a band,
  // the first band's stages before the MXUs start), bands of at most 4096 pixels.
  int64_t rows = 0;
  double best = 0;
  for (int64_t r = 1; r <= OH && (r == 1 || r * OW <= 4096); ++r) {
    if (static_cast<uint64_t>(layout(r).end) > opt_.target.vmem_bytes) break;
    const int64_t units = NB * ((OH + r - 1) / r), per_core = (units + cores_ - 1) / cores_;
    const double cost = static_cast<double>(per_core * (((r * OW + C - 1) / C) * 160 + 600) + 1500 +
                                            r * OW * K * ex / 512);
    if (rows == 0 || cost < best) best = cost, rows = r;
  }
  if (rows == 0) return false;
  const Layout l = layout(rows);

  const std::string id = std::to_string(n.id);
  int64_t Wr = 0;  // constant weights, laid out at compile time as the VMEM tiles
  if (wc) {
    Wr = place_hbm_pinned(wr_bytes);
    check_addr(n, hbm_top_);
    layout_constant(Wr, "#conv" + id + "r", wt, {chunks * nb * 8, 128}, [&](int64_t i) {
      const int64_t row = i / 128, lane = i % 128, c = row / (nb * 8), co = row % (nb * 8), k = c * R + lane;
      if (co >= CO || lane >= R || k >= K) return 0.0f;
      const int64_t t = k / CI, cin = k % CI;
      return wc->f[static_cast<size_t>(((co * CI + cin) * KH + t / KW) * KW + t % KW)];
    });
  }
  struct Unit {
    int64_t b, oh0, oh1;
  };
  std::vector<Unit> units;
  for (int64_t b = 0; b < NB; ++b)
    for (int64_t oh0 = 0; oh0 < OH; oh0 += rows) units.push_back({b, oh0, std::min(OH, oh0 + rows)});
  const int64_t y = t_.at(last.output).addr;
  const auto vr = [](int64_t r) { return "v" + std::to_string(r); };
  // Tile x's chunk c on MXU (x % groups) * chunks + c: with chunks to spare (a
  // single-chunk 3x3 stem on two MXUs) tiles take turns, each group's pushes
  // overlapping the other's.
  const int64_t mgroups = mxus / chunks;
  const auto mx = [&](size_t x, int64_t c) {
    return "mxu" + std::to_string(static_cast<int64_t>(x % static_cast<size_t>(mgroups)) * chunks + c);
  };
  const std::string zst = std::string(this->st(dt)) + " v31, ";
  // The band's padded rows [r0, r1) as +0.0 (v31 holds it).
  const auto zero_rows = [&](int64_t base, int64_t r0, int64_t r1) {
    for (int64_t off = r0 * prow; off < r1 * prow; off += ztile) line(zst + at(base + off));
  };
  // Flags, one a buffer: input rows (f14/f15), padded rows (f8/f9), patches (f10/f11),
  // output (f16/f17).
  constexpr int kRelFlag = 8, kTapFlag = 10;
  // The padded rows band u reads: pr0 .. pr0 + PR; [top, bot) of them are the input's.
  const auto span = [&](const Unit& u, int64_t* pr0, int64_t* top, int64_t* bot) {
    *pr0 = u.oh0 * st[0];
    const int64_t PR = rows_in(u.oh1 - u.oh0);
    *top = std::clamp(pads[0] - *pr0, int64_t{0}, PR);
    *bot = std::clamp(H + pads[0] - *pr0, *top, PR);
    return PR;
  };
  const auto fetch = [&](const Unit& u, int par) {
    int64_t pr0, top, bot;
    span(u, &pr0, &top, &bot);
    if (bot > top)
      dma_on(kStreamInFlag + par, vmem(l.in[par]), hbm(X.addr + (u.b * CI * H + pr0 + top - pads[0]) * W * ex),
             (bot - top) * W * ex, dim(CI, H * W * ex, l.ich));
  };
  // Rows in the top or bottom padding (this buffer's previous band may have had
  // pixels there) zeroed, then the input's rows laid out between the zero columns.
  const auto relayout = [&](const Unit& u, int par) {
    int64_t pr0, top, bot;
    const int64_t PR = span(u, &pr0, &top, &bot);
    zero_rows(l.pad[par], 0, top);
    zero_rows(l.pad[par], bot, PR);
    if (bot > top)
      vmem_copy_on(kRelFlag + par, l.pad[par] + (top * Wp + pads[1]) * CI * ex, l.in[par], ex,
                   dim(W, ex, CI * ex) + dim(CI, l.ich, ex) + dim(bot - top, W * ex, prow));
  };
  // Patch row (r, ow) of the band: kernel row kh's KW * CI elements at padded row
  // r * s0 + kh, pixel ow * s1, one run each.
  const auto taps = [&](const Unit& u, int par) {
    vmem_copy_on(kTapFlag + par, l.patch[par], l.pad[par], KW * CI * ex,
                 dim(OW, st[1] * CI * ex, K * ex) + dim(KH, prow, KW * CI * ex) +
                     dim(u.oh1 - u.oh0, st[0] * prow, OW * K * ex));
  };
  const auto store = [&](const Unit& u, int par) {
    dma_on(kStreamOutFlag + par, hbm(y + (u.b * CO * OH + u.oh0) * OW * eo), vmem(l.out[par]),
           (u.oh1 - u.oh0) * OW * eo, dim(CO, l.os, OH * OW * eo));
  };
  for (int core = 0; core < cores_ && core < static_cast<int>(units.size()); ++core) {
    cur_ = core;
    // The weights, the bias tiles, the members' operands, both padded buffers zeroed.
    if (wc) {
      dma(vmem(l.wr), hbm(Wr), wr_bytes);
    } else {
      dma(vmem(l.wraw), hbm(Wt.addr), wbytes);
      wait_dmas();
      for (int64_t t = 0; t < KH * KW; ++t)
        for (int64_t cin = 0; cin < CI;) {
          const int64_t k = t * CI + cin, cnt = std::min(CI - cin, R - k % R);
          dma(vmem(l.wr + (k / R * nb * kTileElems + k % R) * ew), vmem(l.wraw + (cin * KH * KW + t) * ew), ew,
              dim(cnt, KH * KW * ew, ew) + dim(CO, CI * KH * KW * ew, 128 * ew));
          cin += cnt;
        }
    }
    if (has_bias) {
      dma(vmem(l.braw), hbm(t_.at(n.inputs[2]).addr), CO * eb);
      wait_dmas();
      dma(vmem(l.btile), vmem(l.braw), eb, dim(128, 0, eb) + dim(CO, eb, 128 * eb));
    }
    for (const DwMember& x : members)
      if (x.tile >= 0) replicate_scalar(x.tile, t_.at(x.other).addr, esz(t_.at(x.other).type.dtype));
    line("vbcast v31, " + fimm(0.0f));
    for (int par = 0; par < 2; ++par) zero_rows(l.pad[par], 0, l.pr);
    if (C < 128) line("vmask m1, 8, " + std::to_string(C));
    wait_dmas();

    std::vector<Unit> mine;
    for (size_t u = static_cast<size_t>(core); u < units.size(); u += static_cast<size_t>(cores_))
      mine.push_back(units[u]);
    const int64_t m = static_cast<int64_t>(mine.size());
    struct Tile {
      int64_t k, i, cols, last;  // band k of the core, tile i of T, its pixels; last: i == T - 1
    };
    std::vector<Tile> tiles;
    std::vector<int64_t> ntiles;
    for (int64_t k = 0; k < m; ++k) {
      const int64_t bp = (mine[k].oh1 - mine[k].oh0) * OW, T = (bp + C - 1) / C;
      ntiles.push_back(T);
      for (int64_t i = 0; i < T; ++i) tiles.push_back({k, i, std::min(C, bp - i * C), i == T - 1});
    }
    int64_t pv = 0, wv = 0;  // the next push (v0..v7) and weight (v24..v27) register
    // Group g (8 pixels) of tile x: chunk c's patch lanes into its MXU for c as 8 columns.
    const auto push_group = [&](size_t x, int64_t g) {
      const Tile& t = tiles[x];
      const int64_t base = l.patch[t.k % 2] + (t.i * C + 8 * g) * K * ex;
      for (int64_t c = 0; c < chunks; ++c)
        line(std::string(ld(dt)) + " " + vr((pv + c) % 8) + ", " + at(base + c * R * ex) +
             ", stride=" + std::to_string(K * ex));
      for (int64_t c = 0; c < chunks; ++c) line("mpush.t " + mx(x, c) + ", " + vr((pv + c) % 8));
      pv = (pv + chunks) % 8;
    };
    const auto groups = [](const Tile& t) { return (t.cols + 7) / 8; };
    const auto mmul_block = [&](size_t x, int64_t j) {
      for (int64_t c = 0; c < chunks; ++c) {
        const std::string w = vr(24 + wv++ % 4);
        line(std::string(ld(wt)) + " " + w + ", " + at(l.wr + (c * nb + j) * kTileElems * ew));
        line("mmul " + mx(x, c) + ", " + w);
      }
    };
    // Tile x's results go to accumulator set x % 2 (v8.. or v16..): block j's chunks
    // popped in increasing order, and a step later (the pops long done, so the
    // sequencer never waits on them) the bias, the members and the store of 8 output
    // channels x C pixels as rows of the band's NCHW output; after a band's last
    // tile its output goes out.
    const auto acc = [&](size_t x, int64_t j) { return vr(8 + static_cast<int64_t>(x % 2) * 8 + j); };
    const auto pop_block = [&](size_t x, int64_t j) {
      for (int64_t c = 0; c < chunks; ++c) line((c ? "mpop.add " : "mpop ") + acc(x, j) + ", " + mx(x, c));
    };
    const auto epi_block = [&](size_t x, int64_t j) {
      const Tile& t = tiles[x];
      if (j == 0 && t.i == 0 && t.k >= 2) wait_flag(kStreamOutFlag + static_cast<int>(t.k % 2));  // band k - 2 went out
      const std::string a = acc(x, j);
      if (has_bias) {
        line(std::string(ld(bt)) + " v30, " + at(l.btile + j * kTileElems * eb));
        line("vadd " + a + ", " + a + ", v30");
      }
      apply_dw_members(n, members, static_cast<int>(8 + (x % 2) * 8 + j));
      line(std::string(this->st(ot)) + " " + a + ", " + at(l.out[t.k % 2] + 8 * j * l.os + t.i * C * eo) +
           ", stride=" + std::to_string(l.os) + (C < 128 ? ", mask=m1" : ""));
      if (j == nb - 1 && t.last) store(mine[t.k], static_cast<int>(t.k % 2));
    };
    // Before band k's first push: its patches are in; band k + 2's input comes into the
    // buffer band k's relayout has read.
    const auto band_ready = [&](int64_t k) {
      wait_flag(kTapFlag + static_cast<int>(k % 2));
      if (k + 2 < m) fetch(mine[k + 2], static_cast<int>(k % 2));
    };
    fetch(mine[0], 0);
    if (m > 1) fetch(mine[1], 1);
    wait_flag(kStreamInFlag);
    relayout(mine[0], 0);
    wait_flag(kRelFlag);
    taps(mine[0], 0);
    band_ready(0);
    for (int64_t g = 0; g < groups(tiles[0]); ++g) push_group(0, g);
    for (size_t x = 0; x < tiles.size(); ++x) {
      const Tile& t = tiles[x];
      for (int64_t c = 0; c < chunks; ++c) line("mswap " + mx(x, c) + ", k=" + std::to_string(std::min(R, K - c * R)));
      // Band k + 1's stages: its relayout as band k starts, its patches a third in.
      if (t.k + 1 < m && t.i == 0) {
        wait_flag(kStreamInFlag + static_cast<int>((t.k + 1) % 2));
        relayout(mine[t.k + 1], static_cast<int>((t.k + 1) % 2));
      }
      if (t.k + 1 < m && t.i == ntiles[t.k] / 3) {
        wait_flag(kRelFlag + static_cast<int>((t.k + 1) % 2));
        taps(mine[t.k + 1], static_cast<int>((t.k + 1) % 2));
      }
      // The next tile's pushes go between this one's mmuls and the previous one's pops:
      // the MXU's staging port fills while its LHS and result ports stream (each op
      // waits in queue order for its own port only); the epilogues of the tile before
      // go between them too.
      const Tile* next = x + 1 < tiles.size() ? &tiles[x + 1] : nullptr;
      if (next && next->i == 0) band_ready(next->k);
      const int64_t g1 = next ? groups(*next) : 0, np = x > 0 ? nb : 0, ne = x > 1 ? nb : 0;
      int64_t j = 0, p = 0, q = 0;
      for (int64_t g = 0; g < g1; ++g) {
        push_group(x + 1, g);
        while (j < nb && (j + 1) * g1 <= (g + 1) * nb) mmul_block(x, j++);
        while (p < np && (p + 1) * g1 <= (g + 1) * np) pop_block(x - 1, p++);
        while (q < ne && (q + 1) * g1 <= (g + 1) * ne) epi_block(x - 2, q++);
      }
      while (j < nb) mmul_block(x, j++);
      while (p < np) pop_block(x - 1, p++);
      while (q < ne) epi_block(x - 2, q++);
    }
    const size_t N = tiles.size();
    for (int64_t j = 0; j < nb; ++j) pop_block(N - 1, j);
    for (size_t x = N >= 2 ? N - 2 : 0; x < N; ++x)
      for (int64_t j = 0; j < nb; ++j) epi_block(x, j);
    wait_flag(kStreamOutFlag);
    wait_flag(kStreamOutFlag + 1);
  }
  cur_ = 0;
  return true;
}

// conv2d (each group on its own) as a matmul over im2col rows: P[(n,oh,ow), (kh,kw,cin)] is
// gathered into fresh HBM scratch by one 3-D DMA per (n, kh, kw) (padding taps are
// never written, so they read +0.0), the OIHW weights become W[(kh,kw,cin), o], and
// the tiled matmul's chunk order over k = (kh*KW + kw)*Cin + cin is the contract's
// convolution. Its NHWC result is moved back to NCHW (move_to_nchw). Depthwise,
// pointwise and shifted convolutions take their own lowerings first.
void Emitter::lower_conv(const Node& n) {
  const ConvShape cs = conv_shape(n);
  const auto& [X, Wt, st, pads, dil, G, NB, CIall, H, W, CO, CI, KH, KW, OH, OW] = cs;
  const int64_t COg = CO / G;
  const int64_t K = KH * KW * CI, M = NB * OH * OW;
  // Fused members (unary ops, single-element operands) run in the matmul's epilogue
  // on the NHWC tiles; the chain's end is what goes back to NCHW.
  const std::vector<const Node*>& chain = chain_of(n);
  const Node& last = chain.empty() ? n : *chain.back();
  const int64_t ex = esz(X.type.dtype), ew = esz(Wt.type.dtype), eo = esz(last.type.dtype);
  if (G == CIall && CI == 1 && COg == 1 && lower_depthwise(n)) return;
  if (pointwise(n)) {
    lower_pointwise(n);
    return;
  }
  if (lower_conv_shifted(n)) return;
  if (flipped_weights_.count(n.id)) fail(n, "internal: its flipped weight was planned for the shifted lowering");
  if (lower_conv_patches(n)) return;
  // Each group is its own convolution (the reference's per-group chunking).
  for (int64_t g = 0; g < G; ++g) {
  const std::string tag = "#conv" + std::to_string(n.id) + "g" + std::to_string(g);
  // Constant weights become a .const entry at Wm, which the bundle loads: pinned.
  const bool const_w = g_.find_constant(n.inputs[1]) && (G == 1 || CI >= 8);
  const int64_t P = place_hbm(M * K * ex), Y = place_hbm(M * COg * eo);
  const int64_t Wm = const_w ? place_hbm_pinned(K * COg * ew) : place_hbm(K * COg * ew);
  check_addr(n, hbm_top_);
  const bool any_pad = pads[0] || pads[1] || pads[2] || pads[3];
  const int64_t img = CI * H * W * ex;  // one image's channels of this group
  // Output rows per staged band of im2col rows (0: the image does not fit VMEM).
  int64_t band = OH;
  while (band > 0 && !staging_fits(img, band * OW * K * ex)) band /= 2;
  // Staged bands go round robin over the cores: at least one band a core when the
  // images alone do not give each core one.
  const int64_t per_image = (cores_ + NB - 1) / NB;
  if (band > 0) band = std::min(band, (OH + per_image - 1) / per_image);
  // Ungrouped or channel-rich convs gather through VMEM; depthwise ones (a channel per group)
  // keep the direct HBM gathers, which are as cheap there.
  const bool staged = (CI >= 8 || G == 1) && band > 0;
  // Undilated staged convs lay each band's input rows out first as padded NHWC (one
  // gather, zeros around): a row's KW taps of row kh are then KW * CI contiguous
  // elements both there and in the im2col row, so KH gathers build the rows instead of
  // KH * KW (a VMEM -> VMEM copy costs ~400 cycles before its bytes: resnet's 7 x 7 stem
  // had 49 a band over 4 engines).
  const bool relaid = staged && dil[0] == 1 && dil[1] == 1 && KW > 1;
  const int64_t Wp = W + pads[1] + pads[3];
  int64_t unit = 0;
  if (!staged && any_pad) zero_if_reused(P, M * K * ex, X.type.dtype);  // the direct gathers skip padding taps
  for (int64_t b = 0; b < NB; ++b)
    for (int64_t oh0 = 0; oh0 < OH; oh0 += staged ? band : OH) {
      const int64_t oh1 = staged ? std::min(OH, oh0 + band) : OH;
      const int64_t bp = (oh1 - oh0) * OW;  // the band's output pixels
      std::vector<Gather> gathers;
      // Padded rows [pr0, pr0 + PR) of the image (padded row pr is input row pr - pads[0]);
      // the source in VMEM holds input rows [ya, yb) of each channel, (yb - ya) * W apart.
      const int64_t pr0 = oh0 * st[0], PR = (oh1 - oh0 - 1) * st[0] + KH, prow = Wp * CI * ex;
      const int64_t ya = std::clamp(pr0 - pads[0], int64_t{0}, H), yb = std::clamp(pr0 + PR - pads[0], ya, H);
      if (relaid && yb > ya &&
          staging_fits(CI * (yb - ya) * W * ex, align_up(PR * prow, kAlign) + bp * K * ex)) {
        const int64_t rows = yb - ya;
        Relayout re;
        re.bytes = PR * prow;
        re.gather = Gather{0, ((ya + pads[0] - pr0) * Wp + pads[1]) * CI * ex, ex,
                           dim(W, ex, CI * ex) + dim(CI, rows * W * ex, ex) + dim(rows, W * ex, prow)};
        for (int64_t kh = 0; kh < KH; ++kh)
          gathers.push_back(Gather{kh * prow, kh * KW * CI * ex, KW * CI * ex,
                                   dim(OW, st[1] * CI * ex, K * ex) + dim(oh1 - oh0, st[0] * prow, OW * K * ex), true});
        on_core(unit++);
        staged_gather(X.addr + ((b * CIall + g * CI) * H + ya) * W * ex, CI * rows * W * ex,
                      P + ((b * OH + oh0) * OW) * K * ex, bp * K * ex, gathers, any_pad, 0.0f, X.type.dtype, 1, 0,
                      {CI, H * W * ex}, {1, 0}, &re);
        cur_ = 0;
        continue;
      }
      for (int64_t kh = 0; kh < KH; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw) {
          // Output positions whose tap (kh, kw) lands inside the image.
          int64_t ha, hb, ow0, ow1;
          tap_range(OH, H, st[0], pads[0], kh * dil[0], &ha, &hb);
          tap_range(OW, W, st[1], pads[1], kw * dil[1], &ow0, &ow1);
          ha = std::max(ha, oh0);
          hb = std::min(hb, oh1);
          if (ha >= hb || ow0 >= ow1) continue;
          const int64_t ih = ha * st[0] - pads[0] + kh * dil[0], iw = ow0 * st[1] - pads[1] + kw * dil[1];
          const int64_t soff = (ih * W + iw) * ex;
          const int64_t doff = (((ha - oh0) * OW + ow0) * K + (kh * KW + kw) * CI) * ex;
          const std::string dims =
              dim(ow1 - ow0, st[1] * ex, K * ex) + dim(CI, H * W * ex, ex) + dim(hb - ha, st[0] * W * ex, OW * K * ex);
          if (staged) {
            // Each tap writes its own columns of the rows: no other tap's bytes.
            gathers.push_back(Gather{soff, doff, ex, dims, true});
          } else {
            dma(hbm(P + (b * OH * OW) * K * ex + doff), hbm(X.addr + (b * CIall + g * CI) * H * W * ex + soff), ex, dims);
            wait_dmas();  // the gathers' bounding ranges interleave (race checker)
          }
        }
      if (staged) {
        on_core(unit++);
        staged_gather(X.addr + (b * CIall + g * CI) * H * W * ex, img, P + ((b * OH + oh0) * OW) * K * ex,
                      bp * K * ex, gathers, any_pad, 0.0f, X.type.dtype);
        cur_ = 0;
      }
    }
  conv_weights(n, g, Wm, const_w);
  t_[tag + "p"] = Placed{TensorType{X.type.dtype, {M, K}}, P};
  t_[tag + "w"] = Placed{TensorType{Wt.type.dtype, {K, COg}}, Wm};
  t_[tag + "y"] = Placed{TensorType{last.type.dtype, {M, COg}}, Y};
  if (n.inputs.size() > 2) {
    const Placed& Bi = t_.at(n.inputs[2]);
    t_[tag + "b"] = Placed{TensorType{Bi.type.dtype, {COg}}, Bi.addr + g * COg * esz(Bi.type.dtype)};
  }
  conv_matmul(n, tag, tag + "p", tag + "w", {M, COg});
  sync_all();
  const int64_t y = t_.at(last.output).addr;
  move_to_nchw(Y, y, NB, OH, OW, OW, COg, CO, g, last.type.dtype);
  }
}

// A pointwise conv (1x1, no padding, one group) on NCHW is, per image, the matmul Y[b]
// (CO x H*W) = W (CO x CI) x X[b] (CI x H*W): the OIHW weights are W as they lie, each
// image's channels are the weight rows the MXUs hold, and the result is NCHW already,
// so no im2col rows and no NHWC -> NCHW move. The bias is a value per output row (a
// column-vector operand of the matmul). Each output element sums the same products in
// the same k = cin order as the im2col matmul: the contract's convolution. A strided
// one (resnet's downsamples) first takes its input's every s-th pixel into NCHW
// scratch (through VMEM, where element runs cost per byte: a band of channels of an
// image a unit, round robin over the cores), then is pointwise on that; its tiles
// being NCHW, the residual add after it joins its epilogue (conv_tiles_nchw).
void Emitter::lower_pointwise(const Node& n) {
  Placed X = t_.at(n.inputs[0]);
  const Placed Wt = t_.at(n.inputs[1]);
  const auto& st = n.attr_ints("strides");
  const int64_t NB = X.type.shape[0], CI = X.type.shape[1], HW = n.type.shape[2] * n.type.shape[3];
  const int64_t CO = Wt.type.shape[0];
  if (st[0] > 1 || st[1] > 1) {
    const int64_t H = X.type.shape[2], W = X.type.shape[3], OH = n.type.shape[2], OW = n.type.shape[3];
    const int64_t e = esz(X.type.dtype), Xs = place_hbm(NB * CI * HW * e);
    check_addr(n, hbm_top_);
    // A band of channels of an image is a unit: its input rows that hold taps (every
    // s0-th, W pixels each) come into VMEM, one VMEM -> VMEM DMA takes every s1-th pixel,
    // and the result goes out. Two of each buffer, so a core's next unit loads while
    // this one is gathered and the one before is stored (one after the other, and the
    // whole image read: layer2.0's downsample of resnet50 at v3 batch 8 took 24.7 K of
    // its 55.7 K cycles there).
    auto rows_bytes = [&](int64_t nc) { return align_up(nc * OH * W * e, kAlign); };
    auto out_bytes = [&](int64_t nc) { return align_up(nc * HW * e, kAlign); };
    auto fits = [&](int64_t nc) { return staging_fits(2 * rows_bytes(nc), 2 * out_bytes(nc)); };
    // Channels a band: what the buffers hold, and a band a core at least when images are fewer.
    int64_t cb = CI;
    while (cb > 1 && !fits(cb)) cb = (cb + 1) / 2;
    const int64_t per_image = (cores_ + NB - 1) / NB;
    cb = std::min(cb, (CI + per_image - 1) / per_image);
    if (!fits(1)) {  // not even one channel fits VMEM: element runs in HBM
      dma(hbm(Xs), hbm(X.addr), e,
          dim(OW, st[1] * e, e) + dim(OH, st[0] * W * e, OW * e) + dim(NB * CI, H * W * e, HW * e));
      wait_dmas();
    } else {
      // Unit u: image u / bands, channels from (u % bands) * cb; round robin over the cores.
      const int64_t bands = (CI + cb - 1) / cb, rows_at = 0, out_at = 2 * rows_bytes(cb);
      auto band = [&](int64_t u) { return std::make_pair(u / bands, u % bands * cb); };
      constexpr int kGatherFlag = 10;
      double_buffered(
          NB * bands,
          [&](int64_t u, int64_t par) {
            const auto [b, c0] = band(u);
            dma_on(kStreamInFlag + static_cast<int>(par), vmem(rows_at + par * rows_bytes(cb)),
                   hbm(X.addr + (b * CI + c0) * H * W * e), W * e,
                   dim(OH, st[0] * W * e, W * e) + dim(std::min(cb, CI - c0), H * W * e, OH * W * e));
          },
          [&](int64_t u, int64_t par) {
            const auto [b, c0] = band(u);
            const int64_t nc = std::min(cb, CI - c0);
            dma_on(kGatherFlag, vmem(out_at + par * out_bytes(cb)), vmem(rows_at + par * rows_bytes(cb)), e,
                   dim(OW, st[1] * e, e) + dim(OH, W * e, OW * e) + dim(nc, OH * W * e, HW * e));
            wait_flag(kGatherFlag);
            dma_on(kStreamOutFlag + static_cast<int>(par), hbm(Xs + (b * CI + c0) * HW * e),
                   vmem(out_at + par * out_bytes(cb)), nc * HW * e, "");
          });
    }
    cur_ = 0;
    sync_all();  // the matmul's loads on every core read it
    X = Placed{TensorType{X.type.dtype, {NB, CI, OH, OW}}, Xs};
  }
  const std::vector<const Node*>& chain = chain_of(n);
  const Node& last = chain.empty() ? n : *chain.back();
  const std::string tag = "#pw" + std::to_string(n.id);
  t_[tag + "w"] = Placed{TensorType{Wt.type.dtype, {CO, CI}}, Wt.addr};
  t_[tag + "x"] = Placed{TensorType{X.type.dtype, {NB, CI, HW}}, X.addr};
  t_[tag + "y"] = Placed{TensorType{last.type.dtype, {NB, CO, HW}}, t_.at(last.output).addr};
  if (n.inputs.size() > 2) {
    const Placed& Bi = t_.at(n.inputs[2]);
    t_[tag + "b"] = Placed{TensorType{Bi.type.dtype, {CO, 1}}, Bi.addr};
  }
  // Into the next conv's planes (plan_planes_out): the tiles go there transposed, a
  // pixel's channels together, and the padding is zeroed after.
  const auto po = planes_out_.find(last.output);
  const int64_t OH = n.type.shape[2], OW = n.type.shape[3];
  if (po != planes_out_.end())
    planes_store_ = PlanesStore{t_.at(last.output).addr, po->second.image, po->second.shift, OW, po->second.wq};
  conv_matmul(n, tag, tag + "w", tag + "x", {NB, CO, HW});
  if (po == planes_out_.end()) return;
  if (!std::exchange(transposed_stored_, false)) fail(n, "internal: its result was planned into the next conv's planes");
  sync_all();
  zero_planes_padding(t_.at(last.output).addr, po->second, NB, OH, OW, po->second.wq, CO, last.type.dtype);
}

// Conv n's matmul lhs x rhs (+ tag + "b", n's bias as the caller placed it) into
// tag + "y", with n's fused members in its epilogue.
void Emitter::conv_matmul(const Node& n, const std::string& tag, const std::string& lhs, const std::string& rhs,
                          const Shape& shape, int members) {
  Node mm;
  mm.id = n.id;
  mm.op = OpKind::kMatmul;
  mm.inputs = {lhs, rhs};
  if (n.inputs.size() > 2) mm.inputs.push_back(tag + "b");
  mm.output = tag + "y";
  mm.type = TensorType{n.type.dtype, shape};
  epi_ = chain_of(n);
  if (members >= 0) epi_.resize(static_cast<size_t>(members));
  epi_dst_ = tag + "y";
  epi_src_ = n.output;
  lower_matmul(mm);
}

// matmul / Gemm (docs/codegen.md, "How it lowers"). Work units are (batch element,
// group of Mg rows), round robin over the cores. Within a unit one software pipeline
// runs over every (column-tile group, K pass, 8-row block): a pass puts kk <= kw
// consecutive K chunks of up to cw column tiles on kw x cw MXUs, so one LHS vreg per
// chunk feeds cw MXUs and the chunk sums of a block meet in one register. Block i's
// mmuls issue at step i, its pops D steps later (the MXU latency is covered without
// stalling on registers), its store one step after that. The chunk sums combine in
// increasing chunk order: mpop (first chunk), then mpop.add of each later chunk onto
// the partial sum (kept in VMEM between passes as fp32), exactly the contract's
// acc = s_0; acc = acc + s_1; ... Then alpha, beta * C, the fused members' ops, store.
// The LHS rows of a unit stay in VMEM for every column tile; weights stay resident
// across units when they fit, else stream through a 5-slot ring fetched four passes
// ahead; the next pass's weights are pushed while the current pass computes.
void Emitter::lower_matmul(const Node& n) {
  const std::vector<const Node*> chain = epi_;
  const std::string dst_name = !epi_dst_.empty() ? epi_dst_ : chain.empty() ? n.output : chain.back()->output;
  epi_.clear();
  epi_dst_.clear();
  // The tensor the chain's first member reads: the conv's result for a conv's matmul.
  const std::string chain_src = std::exchange(epi_src_, std::string());
  const ShiftedLhs shifted = std::exchange(shifted_, ShiftedLhs{});
  const int64_t out_bs0 = std::exchange(out_batch_stride_, 0);  // the output's batch stride in bytes
  const NchwOut nchw = std::exchange(nchw_out_, NchwOut{});
  const PlanesStore pst = std::exchange(planes_store_, PlanesStore{});
  Placed A = t_.at(n.inputs[0]);
  Placed B = t_.at(n.inputs[1]);
  bool ta = n.has_attr("trans_a") && n.attr_int("trans_a");
  bool tb = n.has_attr("trans_b") && n.attr_int("trans_b");
  const float alpha = n.has_attr("alpha") ? n.attr_float("alpha") : 1.0f;
  const float beta = n.has_attr("beta") ? n.attr_float("beta") : 1.0f;
  Shape as = A.type.shape;
  Shape bs = B.type.shape;
  const Shape os = n.type.shape;
  const size_t rank = os.size();
  const int64_t M1 = os[rank - 2], N = os[rank - 1];  // M1: one batch element's rows
  const int64_t K = ta ? as[as.size() - 2] : as[as.size() - 1];
  const DType at_ = A.type.dtype, bt = B.type.dtype;
  const Placed Out = t_.at(dst_name);
  const DType ot = Out.type.dtype;
  const int64_t ea = esz(at_), eb = esz(bt), eo = esz(ot);
  const int64_t out_bs = out_bs0 > 0 ? out_bs0 : M1 * N * eo;
  // Operands and result as head views (views_: a transpose folded in), else row-major
  // batches of M x K, K x N and M x N.
  const auto view_of = [&](const std::string& name, bool trans) {
    const auto v = views_.find(name);
    return v == views_.end() || trans ? std::optional<HeadView>() : std::optional<HeadView>(v->second);
  };
  const std::optional<HeadView> a_view = view_of(n.inputs[0], ta), b_view = view_of(n.inputs[1], tb),
                                o_view = view_of(dst_name, false);
  auto view_base = [](const HeadView& v, int64_t b, int64_t e) { return ((b / v.H) * v.S * v.H + b % v.H) * v.D * e; };
  const int64_t arow = a_view ? a_view->H * a_view->D * ea : K * ea;   // bytes between LHS rows
  const int64_t brow = b_view ? b_view->H * b_view->D * eb : N * eb;   // between RHS rows
  const int64_t orow_s = o_view ? o_view->H * o_view->D * eo : N * eo;  // between result rows
  // A transposed operand stored as a batch of r x c matrices (the transposed view of
  // c x r ones) is transposed once through VMEM into HBM scratch where it fits, so
  // the loads read its rows instead of one element a run: B^T (a Gemm's weights,
  // transB=1; attention's K^T), A^T (a weight gradient's im2col(X)^T: the bundled
  // CNN's dW matmuls, v3 batch 8, res3b's 34,887 -> 7,395 cycles).
  auto untranspose = [&](Placed& P, Shape& sh, int64_t r, int64_t c) {
    const int64_t e = esz(P.type.dtype), nb = num_elements(sh) / std::max<int64_t>(1, r * c), bytes = nb * r * c * e;
    if (!staging_fits(bytes, bytes)) return false;
    const int64_t T = place_hbm(bytes);
    check_addr(n, hbm_top_);
    staged_gather(P.addr, bytes, T, bytes,
                  {Gather{0, 0, e,
                          dim(r, c * e, e) + dim(c, e, r * e) + (nb > 1 ? dim(nb, r * c * e, r * c * e) : "")}},
                  false, 0.0f, P.type.dtype);
    sh[sh.size() - 2] = c;
    sh[sh.size() - 1] = r;
    P = Placed{TensorType{P.type.dtype, sh}, T};
    return true;
  };
  // A^T of fewer elements costs its element loads less than the staging's fixed
  // latency (~1.5 K cycles: the MLP's dW at batch 8, 784 x 8, ran 3.8% slower so).
  constexpr int64_t kUntransposeAFrom = 16384;  // elements
  if (ta && K * M1 >= kUntransposeAFrom && untranspose(A, as, K, M1)) ta = false;
  if (const Constant* bc = tb && bs.size() == 2 ? g_.find_constant(n.inputs[1]) : nullptr) {
    // Constant B^T (a Gemm's weights, transB=1) is laid out as B at compile time: the
    // weight loads read rows of B, and no run-time transpose reads and writes it again.
    const int64_t Bt = place_hbm_pinned(K * N * eb);
    check_addr(n, hbm_top_);
    layout_constant(Bt, "#mm" + std::to_string(n.id) + "b", bt, {K, N},
                    [&](int64_t i) { return bc->f[static_cast<size_t>(i % N * K + i / N)]; });
    B = Placed{TensorType{bt, {K, N}}, Bt};
    bs = B.type.shape;
    tb = false;
  } else if (tb && untranspose(B, bs, N, K)) {
    tb = false;
  }
  const int64_t R = opt_.target.mxu_rows, C = opt_.target.mxu_cols;
  const int64_t mxus = opt_.target.mxus_per_core;
  const int64_t chunks = std::max<int64_t>(1, (K + R - 1) / R);
  const int64_t ntiles = (N + C - 1) / C;
  // A batch against one B (numpy broadcast: BERT's [8, 128, 768] x [768, 3072]) whose
  // LHS and result are dense row-major batches is one matmul of all the batch's rows:
  // tiles and units of up to 2048 rows, each weight tile pushed once per tile instead
  // of once per batch element's 128 rows (a pushed weight tile then served 16 mmuls, and
  // the mpush + mmul pairs held the issue at twice the MXU time).
  const int64_t batches1 = num_elements(os) / std::max<int64_t>(M1 * N, 1);
  const bool fold_batches = batches1 > 1 && !ta && num_elements(bs) == K * N &&
                            num_elements(as) == batches1 * M1 * K && !a_view && !b_view && !o_view &&
                            (out_bs0 == 0 || out_bs0 == M1 * N * eo) && shifted.tap_rows.empty() &&
                            nchw.addr < 0 && pst.addr < 0;
  const int64_t M = fold_batches ? batches1 * M1 : M1;
  const int64_t batches = fold_batches ? 1 : batches1;

  // Epilogue operands: the bias C (scaled by beta) and the other operand of each
  // binary member. A row vector (or scalar) is a replicated 8-row tile per column
  // tile, loaded once per core. A column vector (M x 1: a value per output row, the
  // bias of a conv lowered as W x X) is loaded whole once per core and spread into a
  // tile per 8-row block of each unit. Anything else is materialised at the output's
  // shape and streamed per (unit, column-tile group).
  struct Operand {
    bool full = false;
    int64_t addr = 0;
    DType dt = DType::kF32;
    bool scalar = false;
    bool per_row = false;  // a column vector: vbase holds a unit's 8-row tiles (fp32), raw its M values
    int64_t vbase = 0;     // VMEM
    int64_t raw = 0;
  };
  std::vector<Operand> ops;
  auto classify = [&](const std::string& name) {
    const Placed& p = t_.at(name);
    Operand o;
    o.dt = p.type.dtype;
    const Shape& s = p.type.shape;
    bool vec = s.size() <= rank;
    for (size_t d = 0; d + 1 < s.size() && vec; ++d) vec = s[d] == 1;
    bool col = s.size() >= 2 && s.back() == 1 && s[s.size() - 2] == M && M > 1;
    for (size_t d = 0; d + 2 < s.size() && col; ++d) col = s[d] == 1;
    if (vec && (s.empty() || s.back() == 1 || s.back() == N)) {
      o.addr = p.addr;
      o.scalar = s.empty() || s.back() == 1;
    } else if (col) {
      o.addr = p.addr;
      o.per_row = true;
    } else {
      // As many elements as the output: its own layout (a pointwise conv's operand of
      // the conv's NCHW shape against the matmul's (batch, CO, H*W)); else materialised.
      o.full = true;
      o.addr = num_elements(s) == num_elements(os) ? p.addr : broadcast_to(n, name, os);
    }
    ops.push_back(o);
    return static_cast<int>(ops.size()) - 1;
  };
  const int bias_op = n.inputs.size() > 2 ? classify(n.inputs[2]) : -1;
  struct Step {
    const Node* m;
    int operand;      // index into ops, -1 for a unary member
    bool run_first;   // the running value is the member's first operand
  };
  std::vector<Step> steps;
  bool selects = false;  // a member is a relu_grad (emit_op's mask m2)
  {
    std::string run = chain_src.empty() ? n.output : chain_src;
    for (const Node* m : chain) {
      Step s{m, -1, true};
      if (m->inputs.size() == 2) {
        s.run_first = m->inputs[0] == run;
        s.operand = classify(m->inputs[s.run_first ? 1 : 0]);
      }
      steps.push_back(s);
      selects |= m->op == OpKind::kReluGrad;
      run = m->output;
    }
  }

  // The recipe's epilogue on accumulator register a of column tile `tile`: alpha,
  // beta * C, the fused members. Scratch: the operand's register and a temporary (v30,
  // v28 unless given), and v29, v31, which only ever hold broadcast constants. A full
  // operand's tile is at full_at(operand); a replicated one's is loaded once per core.
  struct Scratch {
    int op = 30, t0 = 28;
  };
  auto emit_epilogue = [&](int64_t a, int64_t tile,
                           const std::function<std::pair<int64_t, int64_t>(const Operand&)>& full_at,
                           const Scratch& sc = Scratch{}) {
    const std::string va = "v" + std::to_string(a), vo = "v" + std::to_string(sc.op);
    auto load_operand = [&](int idx, const std::string& into) {
      const Operand& o = ops[static_cast<size_t>(idx)];
      // A full or per-row operand's tile and its row stride; a replicated one's dense tile.
      const auto [addr, stride] = o.full || o.per_row
                                      ? full_at(o)
                                      : std::make_pair(o.vbase + (o.scalar ? 0 : tile * 8 * 128 * esz(o.dt)),
                                                       int64_t{128} * (o.per_row ? 4 : esz(o.dt)));
      const bool dense = stride == 128 * (o.per_row ? 4 : esz(o.dt));
      line(std::string(o.per_row ? "vld" : ld(o.dt)) + " " + into + ", " + at(addr) +
           (dense ? "" : ", stride=" + std::to_string(stride)));
    };
    if (alpha != 1.0f) {
      line("vbcast v31, " + fimm(alpha));
      line("vmul " + va + ", v31, " + va);
    }
    if (bias_op >= 0) {
      load_operand(bias_op, vo);
      if (beta != 1.0f) {
        line("vbcast v31, " + fimm(beta));
        line("vmul " + vo + ", v31, " + vo);
      }
      line("vadd " + va + ", " + va + ", " + vo);
    }
    DType cur_t = n.type.dtype;
    for (const Step& st_ : steps) {
      if (cur_t == DType::kBf16) line("vcvt.bf16 " + va + ", " + va);
      if (st_.operand >= 0) load_operand(st_.operand, vo);
      emit_op(*st_.m, static_cast<int>(a), st_.run_first ? static_cast<int>(a) : sc.op,
              st_.run_first ? sc.op : static_cast<int>(a), sc.t0, 29);
      cur_t = st_.m->type.dtype;
    }
  };

  // The replicated operands (row vectors and scalars as a tile per column tile, column
  // vectors whole), once per core, on f1.
  auto load_replicated = [&]() {
    for (const Operand& o : ops) {
      const int64_t e = esz(o.dt), crow = 128 * e;
      if (o.per_row) {
        dma(vmem(o.raw), hbm(o.addr), M * e);
      } else if (o.scalar) {
        replicate_scalar(o.vbase, o.addr, e);  // its 2 tiles: the operand's and the staging
      } else if (!o.full) {
        // Every whole tile in one DMA (each tile's columns read 8 times, stride 0): one
        // DMA latency instead of one a tile (16 on a 2048-column band).
        const int64_t whole = N / C;
        if (whole > 0)
          dma(vmem(o.vbase), hbm(o.addr), C * e, dim(8, 0, crow) + dim(whole, C * e, 8 * crow));
        if (whole < ntiles)
          dma(vmem(o.vbase + whole * 8 * crow), hbm(o.addr + whole * C * e), (N - whole * C) * e, dim(8, 0, crow));
      }
    }
  };
  // Column-vector operands: before a unit's (or tile's) first epilogue the tile of each
  // 8-row block, every lane of row r holding the value of output row m0 + r: a masked
  // load puts the value in lane 0 (the other lanes read nothing), -inf fills the rest,
  // and the lane max broadcasts it exactly (max(x, -inf) = x for every x, NaN included).
  // Up to 16 blocks at a time in v0..v15 (free between units), so the lane reductions'
  // latency overlaps instead of holding each store. A core whose image already holds
  // rows m0.. (its previous unit had them: another batch element or band) keeps it.
  std::vector<int64_t> spread_m0(static_cast<size_t>(cores_), -1);
  auto spread_per_row = [&](int64_t m0, int64_t mr) {
    if (std::exchange(spread_m0[static_cast<size_t>(cur_)], m0) == m0) return;
    for (const Operand& o : ops) {
      if (!o.per_row) continue;
      const int64_t e = esz(o.dt), nb = (mr + 7) / 8;
      line("vbcast v31, " + fimm(-INFINITY));
      line("vmask m1, 8, 1");
      if (mr % 8) line("vmask m2, " + std::to_string(mr % 8) + ", 1");
      auto mask = [&](int64_t i) { return std::string(i * 8 + 8 > mr ? "m2" : "m1"); };
      for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        const int64_t b1 = std::min(nb, b0 + 16);
        auto v = [&](int64_t i) { return "v" + std::to_string(i - b0); };
        for (int64_t i = b0; i < b1; ++i)
          line(std::string(ld(o.dt)) + " " + v(i) + ", " + at(o.raw + (m0 + i * 8) * e) +
               ", stride=" + std::to_string(e) + ", mask=" + mask(i));
        for (int64_t i = b0; i < b1; ++i) line("vsel " + v(i) + ", " + mask(i) + ", " + v(i) + ", v31");
        for (int64_t i = b0; i < b1; ++i) line("vreduce.lanes.max " + v(i) + ", " + v(i));
        for (int64_t i = b0; i < b1; ++i) line("vst " + v(i) + ", " + at(o.vbase + i * 8 * 512));
      }
    }
  };

  // Batch offsets with numpy broadcasting of the leading dims.
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
  auto a_at = [&](int64_t b) { return A.addr + (a_view ? view_base(*a_view, b, ea) : batch_offset(as, b, ea)); };
  auto b_at = [&](int64_t b) { return B.addr + (b_view ? view_base(*b_view, b, eb) : batch_offset(bs, b, eb)); };
  auto o_at = [&](int64_t b) { return Out.addr + (o_view ? view_base(*o_view, b, eo) : b * out_bs); };

  // kw chunks x cw column tiles per pass: the split whose estimated issue + MXU time
  // is least (one instruction per cycle; one 8-row mmul per MXU per 8 cycles).
  int64_t kw = 1, cw = 1;
  {
    double best = 1e300;
    for (int64_t k = 1; k <= std::min<int64_t>({4, chunks, mxus}); ++k)
      for (int64_t c = 1; c <= std::min<int64_t>({4, ntiles, mxus / k}); ++c) {
        const int64_t passes = (chunks + k - 1) / k, groups = (ntiles + c - 1) / c;
        const double instr = static_cast<double>(k + 2 * k * c + c + (passes > 1 ? c : 0));
        const double per_block = std::max(instr, 8.0 * std::max<int64_t>(1, k * c) / static_cast<double>(k * c));
        const double push = 2.0 * k * c * static_cast<double>(R) / 8.0;
        const double est = static_cast<double>(passes * groups) * (per_block * 64 + push);
        if (est < best - 1e-9) best = est, kw = k, cw = c;
      }
  }
  const int64_t wrow = 128 * eb, lrow = 128 * ea, orow = 128 * eo;
  const int64_t wtile = R * wrow;  // one chunk of one column tile's weights
  // HBM interleaves 4 KiB over all its channels (configs/hbm): DMA runs of at least
  // that keep every channel busy, shorter strided runs hit a few channels only.
  const int64_t kRunBytes = 4096;
  // Pass fetches go kSlots - 1 passes ahead, each slot on its own flag (f8..f12): a
  // slot is refilled only after the wait for its previous contents.
  constexpr int64_t kSlots = 5;
  // With full-width tiles, the output of a band of OB column groups goes out as one
  // DMA with long runs; narrower MXUs store each tile on its own.
  const bool wide_out = C == 128;
  const int64_t OB = wide_out ? std::max<int64_t>(1, kRunBytes / (cw * C * eo)) : 1;
  // A shifted conv's LHS rows read in place (docs/codegen.md, "Plane rows in place"):
  // a unit's LHS is the plane rows its taps reach, loaded once as one DMA per plane,
  // and chunk c of an 8-row block is a vld at its taps' shift, where the im2col image
  // read every row from HBM once a tap. A chunk's K lanes are runs of taps whose rows
  // follow each other (a stride-1 conv's kw): one run is one vld; two (a 64-channel
  // conv's chunk of taps (0, 2) and (1, 0)) are two masked vlds and a vsel.
  const int64_t ci = shifted.ci;
  struct Run {
    int64_t l0, l1, t, e0;  // lanes [l0, l1) of the chunk: tap t's elements from e0 on
  };
  auto tap_row = [&](int64_t t) { return shifted.tap_rows[static_cast<size_t>(t)]; };
  std::vector<std::vector<Run>> runs(static_cast<size_t>(chunks));
  std::vector<std::pair<int64_t, int64_t>> masks;  // lane ranges loaded under m3, m4, ...
  const bool in_place = [&] {
    if (shifted.tap_rows.empty() || ta) return false;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t kr = std::min(R, K - c * R);
      for (int64_t l = 0; l < kr;) {
        const int64_t t = (c * R + l) / ci;
        int64_t tl = t, end = std::min(kr, (t + 1) * ci - c * R);
        while (end < kr && tap_row(tl + 1) == tap_row(tl) + 1) end = std::min(kr, (++tl + 1) * ci - c * R);
        runs[static_cast<size_t>(c)].push_back(Run{l, end, t, c * R + l - t * ci});
        if (l > 0 || end < 128)
          if (std::find(masks.begin(), masks.end(), std::make_pair(l, end)) == masks.end()) masks.push_back({l, end});
        l = end;
      }
      if (runs[static_cast<size_t>(c)].size() > 2) return false;
    }
    return masks.size() <= 5;  // m3..m7
  }();
  // LHS columns are fetched in bands of LB chunks (a multiple of kw); plane rows in
  // place are one band (its taps share their rows).
  const int64_t LB = in_place ? (chunks + kw - 1) / kw * kw
                              : std::max<int64_t>(kw, (kRunBytes / (R * ea) + kw - 1) / kw * kw);

  // Flags: f1 general, f4 output stores (the K-streamed one-pass tiles' two buffers: f4,
  // f5), f6/f7 full epilogue operands (by column-tile group parity), f8..f12 the pass
  // ring's slots (f8..f10 the K-streamed tiles' weight panels), f13 the next unit's LHS
  // band (the K-streamed tiles' band slots: f13, f14, and f15, f16 on one-pass tiles;
  // packs of tiles have a flag a pack: f8..f10 panels, f13..f15 bands, f4/f5 outputs);
  // f2/f3 and f18/f19 the transposed output bands (transpose_out, store_out).
  // Every wait covers every DMA issued on its flag so far (completion order is not
  // issue order).
  constexpr int kOutFlag = 4, kEpiFlag = 6, kSlotFlag = 8;
  const int64_t fifo_vregs = std::max<int64_t>(2, opt_.target.fifo_rows / 8);
  const int64_t D = std::max<int64_t>(1, std::min<int64_t>(18, fifo_vregs - 2));
  const int64_t AS = 16 / cw;  // accumulator register sets (v8..v23)
  const int64_t LS = 8 / kw;   // LHS register sets (v0..v7)
  // Epilogues run in groups, op by op across the group's chains (a block's column tiles,
  // then the group's blocks): the vector unit dispatches in order, so one chain alone
  // waits out each op's latency (gelu's div 8 cycles, erf 7: ~33 cycles a tile, twice
  // the MXU time of BERT's up-projection). A group holds up to G blocks of a pipeline
  // whose accumulators rotate over AS sets and are stored E steps after their pops; its
  // further chains take their temporary and operand register from the sets of blocks
  // not yet popped (with only replicated operands, the chains of a column tile share
  // the first one's operand register). The largest G for which those suffice.
  const bool replicated_ops =
      std::none_of(ops.begin(), ops.end(), [](const Operand& o) { return o.full || o.per_row; });
  // Chains of one-cycle ops (a bias add, relu, clip) too: with two ALUs a chain alone
  // leaves one idle (grouped, v3 bf16 b8 resnet50 1,522,664 -> 1,501,564, mobilenet_v2
  // 751,768 -> 730,651; on a one-wide VPU resnet's convs had moved by +-3%).
  auto epilogue_group = [&](int64_t E_) {
    auto spare_needed = [&](int64_t g) { return g * cw - 1 + (replicated_ops ? cw - 1 : g * cw - 1); };
    int64_t g = 1;
    while (g + E_ < AS && spare_needed(g + 1) <= (AS - E_ - g - 1) * cw) ++g;
    return g;
  };
  struct Held {
    int64_t j;  // the pipeline item
    std::function<void(int64_t w, const Scratch&)> emit;  // column tile w's epilogue and store
    int64_t cwt;
  };
  // At step s of a pipeline whose item j's accumulators are v(8 + (j % AS) * cw + w) and
  // are popped at step j + D: the held epilogues, interleaved, their lines that are the
  // same in every chain (a constant's broadcast) once.
  auto flush_epilogues = [&](std::vector<Held>& held, int64_t s) {
    if (held.empty()) return;
    std::vector<int> spare;  // the accumulators of items not yet popped
    for (int64_t j = s - D + 1; j < held.front().j + AS; ++j)
      for (int64_t w = 0; w < cw; ++w) spare.push_back(static_cast<int>(8 + (j % AS) * cw + w));
    // With only replicated operands (a row vector's tile a column tile, a scalar) the
    // chains of one column tile load the same tile into the same register: its load (a
    // line the same in each chain) is emitted once.
    std::vector<std::vector<std::string>> chains;
    std::vector<int> op_of_tile(static_cast<size_t>(cw), -1);
    size_t next = 0;
    // The gathered chains, op by op (one after the other if their shapes differ, or if
    // a relu_grad's vcmp and vsel share m2: interleaved, the next chain's vcmp would
    // come between them).
    auto emit_chains = [&] {
      bool same_shape = !selects;
      for (const auto& c : chains) same_shape &= c.size() == chains[0].size();
      if (!same_shape) {
        for (const auto& c : chains)
          for (const std::string& l : c) raw_line(l);
      } else {
        for (size_t k = 0; k < (chains.empty() ? 0 : chains[0].size()); ++k) {
          bool shared = true;
          for (const auto& c : chains) shared &= c[k] == chains[0][k];
          for (size_t c = 0; c < (shared ? 1 : chains.size()); ++c) raw_line(chains[c][k]);
        }
      }
      chains.clear();
      next = 0;
      op_of_tile.assign(static_cast<size_t>(cw), -1);
    };
    for (const Held& h : held)
      for (int64_t w = 0; w < h.cwt; ++w) {
        // Where the group holds more chains than there are accumulators not yet popped
        // (the last steps of a pipeline, a pass of fewer column tiles), the chains so
        // far go out first and this one starts the next group with the fixed scratch.
        const size_t need = chains.empty() ? 0 : (replicated_ops && op_of_tile[static_cast<size_t>(w)] >= 0 ? 1 : 2);
        if (next + need > spare.size()) emit_chains();
        Scratch sc;
        if (!chains.empty()) sc.t0 = spare[next++];
        int& shared_op = op_of_tile[static_cast<size_t>(w)];
        if (chains.empty()) sc.op = 30;
        else if (replicated_ops && shared_op >= 0) sc.op = shared_op;
        else sc.op = spare[next++];
        if (shared_op < 0) shared_op = sc.op;
        chains.push_back(captured_lines([&] { h.emit(w, sc); }));
      }
    held.clear();
    emit_chains();
  };
  auto vr = [](int64_t r) { return "v" + std::to_string(r); };
  auto mx = [](int64_t m) { return "mxu" + std::to_string(m); };

  struct Pass {
    int64_t t, p, c0, kk, n0, cwt;
    bool first, last;
  };
  auto kr_of = [&](int64_t c) { return std::min(R, K - c * R); };
  // A pass that fills fewer MXUs than the core has (the last of an odd number of
  // chunks; one chunk of one column tile) runs on `reps` copies of its weights, 8-row
  // block i on copy i % reps: the third chunk of a 32-channel 3x3 conv (K = 288) kept
  // one of v3's two MXUs idle for a third of the conv. Each block's sum is still its
  // chunks' in order on one copy.
  auto reps = [&](const Pass& ps) { return std::max<int64_t>(1, mxus / (ps.kk * ps.cwt)); };
  auto mxu_at = [&](const Pass& ps, int64_t i, int64_t w, int64_t k) {
    return i % reps(ps) * ps.kk * ps.cwt + w * ps.kk + k;
  };
  // Pass ps's weight pushes, (MXU, VMEM address of 8 rows: row_at(w, k, r) for column
  // tile w, chunk k, row r), on every copy; and its swaps. Both plans push through these.
  auto pass_pushes = [&](const Pass& ps, const auto& row_at) {
    std::vector<std::pair<int64_t, int64_t>> l;
    for (int64_t r = 0; r < R; r += 8)
      for (int64_t w = 0; w < ps.cwt; ++w)
        for (int64_t k = 0; k < ps.kk; ++k)
          if (r < kr_of(ps.c0 + k))
            for (int64_t c = 0; c < reps(ps); ++c) l.push_back({mxu_at(ps, c, w, k), row_at(w, k, r)});
    return l;
  };
  auto pass_swaps = [&](const Pass& ps) {
    for (int64_t c = 0; c < reps(ps); ++c)
      for (int64_t w = 0; w < ps.cwt; ++w)
        for (int64_t k = 0; k < ps.kk; ++k)
          line("mswap " + mx(mxu_at(ps, c, w, k)) + ", k=" + std::to_string(kr_of(ps.c0 + k)));
  };

  // VMEM plan. Columns go in bands of BG column groups whose weights stay resident
  // in VMEM (loaded by the first unit of the band on each core, reused by the
  // rest); rows in units of Mg. One band if all of B fits; otherwise narrower bands
  // (the LHS is then read once per band); streaming through a ring of weight tiles
  // only if even one group's weights do not fit.
  const int64_t ngroups = (ntiles + cw - 1) / cw;
  // Plane rows in place: the segment of each plane the taps read, rows [lo, hi + cap)
  // for a unit of `cap` rows (lo, hi the taps' least and greatest shift on it), with 8
  // rows to spare for a ragged last block and a tile before it for a second run's vld
  // address (lanes below its mask are not read); each segment starts on a tile.
  struct Segment {
    int64_t plane, lo, hi;
  };
  std::vector<Segment> segs;
  auto seg_of = [&](int64_t t) {  // the segment holding tap t's rows
    for (size_t s = 0; s < segs.size(); ++s)
      if (segs[s].plane == tap_row(t) / shifted.prow) return static_cast<int64_t>(s);
    return int64_t{-1};
  };
  if (in_place)
    for (int64_t t = 0; t < static_cast<int64_t>(shifted.tap_rows.size()); ++t) {
      const int64_t s = seg_of(t);
      if (s < 0) {
        segs.push_back(Segment{tap_row(t) / shifted.prow, tap_row(t), tap_row(t)});
      } else {
        Segment& g = segs[static_cast<size_t>(s)];
        g.lo = std::min(g.lo, tap_row(t));
        g.hi = std::max(g.hi, tap_row(t));
      }
    }
  // Weights wider than the LHS is tall (a batch-1 classifier or transformer layer, a
  // 7 x 7 conv) are split over the cores by columns, not the rows: each core then
  // reads its part of the larger operand (and pushes its part of it into the MXUs)
  // instead of all of it.
  // A shifted conv's LHS read in place is its planes' rows, CI elements a plane, not K.
  const int64_t lhs_row = in_place ? static_cast<int64_t>(segs.size()) * ci : K;
  const bool cols_over_cores = cores_ > 1 && ngroups >= cores_ && M * batches * lhs_row < N * K;
  const int64_t per_core = align_up(cols_over_cores ? M * batches : (M * batches + cores_ - 1) / cores_, 8);
  // Column groups per band when `row_units` units of rows (or row tiles) leave cores
  // idle: bands enough for a core each (at most one a group), at most `width` groups
  // each, so each core reads only its band's weights instead of every core all of them.
  auto band_width_for_cores = [&](int64_t row_units, int64_t width) {
    if (row_units >= cores_ || ngroups < 2) return width;
    const int64_t bands = std::min(ngroups, (cores_ + row_units - 1) / row_units);
    return std::min(width, (ngroups + bands - 1) / bands);
  };
  int64_t Mg = std::max<int64_t>(8, std::min<int64_t>({2048, align_up(M, 8), per_core}));
  const int64_t Mg0 = Mg;
  const int64_t vmem_cap = static_cast<int64_t>(opt_.target.vmem_bytes);
  // Row-major VMEM images (LHS rows of a unit, resident weights, output bands) have a
  // row stride of an odd number of 8x128-tile rows (odd_stride); DMAs fill them with
  // long contiguous runs.
  // A vld reads 128 lanes from a chunk's (column tile's) start: rows are that wide
  // past the last one, so no read reaches into the next row (which a DMA may be filling).
  // LHS bands of LB chunks are separate row-major images (band-major), so a band's
  // DMA and the vlds of another band touch disjoint byte ranges (race checker).
  const int64_t ls = odd_stride(((std::min(LB, chunks) - 1) * R + 128) * ea, lrow);
  const int64_t lbands = (chunks + LB - 1) / LB;
  const int64_t pix = ci * ea, kLead = 512;
  auto seg_bytes = [&](const Segment& g, int64_t cap) {
    return kLead + align_up((cap + 8 + g.hi - g.lo) * pix + 256, 512);
  };
  auto seg_at = [&](int64_t s, int64_t cap) {
    int64_t off = 0;
    for (int64_t i = 0; i < s; ++i) off += seg_bytes(segs[static_cast<size_t>(i)], cap);
    return off;
  };
  // The bytes of one LHS band of a unit of `cap` rows.
  auto lhs_band_bytes = [&](int64_t cap) {
    return in_place ? seg_at(static_cast<int64_t>(segs.size()), cap) : cap * ls;
  };
  // Chunks of the 8-row block at `row` of a unit of `cap` rows: chunk c of the band at
  // `band` into vv, for each (vv, band, c). Read in place, a chunk of two runs loads
  // its second into v31 and selects it in; that select waits until the next chunk's
  // first load has gone, so it does not hold the in-order vector unit for its load's
  // latency alone (a 32-channel conv's block of two such chunks took 11 cycles, against
  // the MXUs' 8). v31 only: the epilogue's other scratch registers may hold an operand
  // across blocks (v30 as a second scratch broke v5e's resnet18).
  struct LhsChunk {
    int64_t vv, band, c;
  };
  auto lhs_vlds = [&](const std::vector<LhsChunk>& chunks_of_block, int64_t row, int64_t cap) {
    auto mask_of = [&](const Run& r) {
      const auto m = std::find(masks.begin(), masks.end(), std::make_pair(r.l0, r.l1));
      return m == masks.end() ? std::string() : "m" + std::to_string(3 + (m - masks.begin()));
    };
    std::string pending;  // the previous chunk's select
    for (const LhsChunk& lc : chunks_of_block) {
      if (!in_place) {
        line(std::string(ld(at_)) + " " + vr(lc.vv) + ", " + at(lc.band + row * ls + (lc.c % LB) * R * ea) +
             ", stride=" + std::to_string(ls));
        continue;
      }
      const std::vector<Run>& rs = runs[static_cast<size_t>(lc.c)];
      for (size_t j = 0; j < rs.size(); ++j) {
        const Run& r = rs[j];
        const int64_t s = seg_of(r.t);
        const int64_t addr = lc.band + seg_at(s, cap) + kLead +
                             (row + tap_row(r.t) - segs[static_cast<size_t>(s)].lo) * pix + (r.e0 - r.l0) * ea;
        const std::string m = mask_of(r);
        if (j == 1 && !pending.empty()) line(std::exchange(pending, std::string()));
        line(std::string(ld(at_)) + " " + vr(j == 0 ? lc.vv : 31) + ", " + at(addr) +
             ", stride=" + std::to_string(pix) + (m.empty() ? "" : ", mask=" + m));
      }
      if (rs.size() == 2) pending = "vsel " + vr(lc.vv) + ", " + mask_of(rs[1]) + ", v31, " + vr(lc.vv);
    }
    if (!pending.empty()) line(pending);
  };
  // The lane masks of the runs read in place, on each core before its first vld (m2
  // a scratch: the matmul's other masks are set where they are used).
  auto lhs_masks = [&]() {
    for (size_t i = 0; in_place && i < masks.size(); ++i) {
      const std::string m = "m" + std::to_string(3 + i);
      line("vmask " + m + ", 8, " + std::to_string(masks[i].second));
      if (masks[i].first == 0) continue;
      line("vmask m2, 8, " + std::to_string(masks[i].first));
      line("mnot m2, m2");
      line("mand " + m + ", " + m + ", m2");
    }
  };
  // Rows [m0 + r0, m0 + r1) x columns [k0, k0 + lcols) of batch element b's LHS into
  // the VMEM band at dst (a band of cap rows). Shifted LHS rows (a conv's,
  // lower_conv_shifted) come a tap's columns per DMA, taps whose rows follow each other
  // in the plane (the kw of a stride-1 conv) as one run; read in place, one run a
  // segment, a later piece (r0 > 0) only the rows the pieces before did not load.
  // pack: a dim(...) over the tiles of a pack (the tiled plan's packs), outermost.
  auto lhs_dma = [&](int flag, int64_t dst, int64_t b, int64_t m0, int64_t r0, int64_t r1, int64_t k0, int64_t lcols,
                     int64_t cap, const std::string& pack = "") {
    const int64_t row0 = m0 + r0, rows = r1 - r0;
    if (in_place) {
      for (size_t s = 0; s < segs.size(); ++s) {
        const Segment& g = segs[s];
        const int64_t a = r0 == 0 ? 0 : r0 + g.hi - g.lo, e = r1 + g.hi - g.lo;
        dma_on(flag, vmem(dst + seg_at(static_cast<int64_t>(s), cap) + kLead + a * pix),
               hbm(shifted.base + b * shifted.image + (m0 + g.lo + a) * pix), (e - a) * pix, "");
      }
      return;
    }
    dst += r0 * ls;
    if (shifted.tap_rows.empty()) {
      const int64_t a0 = a_at(b);
      if (!ta)
        dma_on(flag, vmem(dst), hbm(a0 + row0 * arow + k0 * ea), lcols * ea, dim(rows, arow, ls) + pack);
      else
        dma_on(flag, vmem(dst), hbm(a0 + (k0 * M + row0) * ea), ea, dim(lcols, M * ea, ea) + dim(rows, ea, ls) + pack);
      return;
    }
    const int64_t taps = static_cast<int64_t>(shifted.tap_rows.size());
    for (int64_t t = k0 / ci; t < taps && t * ci < k0 + lcols;) {
      const int64_t c0 = std::max(k0, t * ci);
      int64_t t1 = t + 1;
      while (t1 < taps && t1 * ci < k0 + lcols && tap_row(t1) == tap_row(t1 - 1) + 1) ++t1;
      const int64_t c1 = std::min(k0 + lcols, t1 * ci);
      const int64_t src = shifted.base + b * shifted.image + ((tap_row(t) + row0) * ci + c0 - t * ci) * ea;
      dma_on(flag, vmem(dst + (c0 - k0) * ea), hbm(src), (c1 - c0) * ea, dim(rows, ci * ea, ls));
      t = t1;
    }
  };
  auto obs_of = [&](int64_t ob) { return wide_out ? odd_stride(ob * cw * C * eo, orow) : cw * orow; };
  auto ws_of = [&](int64_t bg) { return odd_stride((std::min(bg * cw, ntiles) * C - C + 128) * eb, wrow); };
  // A full epilogue operand's buffer of ng column groups: rows fstride_of apart with
  // wide MXUs (one DMA of runs of the groups' columns), else tile by tile (Mt or Mg
  // rows of 128 lanes each). The resident plan fetches sub-bands of up to OB groups,
  // runs of at least 1 KiB (a pointwise conv's residual; a tile's rows were 256 B runs
  // N apart; whole output sub-bands made the first epilogue wait longer on BERT's
  // residuals), two sub-bands in flight, narrower MXUs a group at a time; the
  // K-streamed tiles a tile's columns, a tile ahead.
  auto fstride_of = [&](const Operand& o, int64_t ng) {
    return wide_out ? odd_stride(ng * cw * C * esz(o.dt), 128 * esz(o.dt)) : ng * cw * 128 * esz(o.dt);
  };
  int64_t vec_bytes = 0, col_per_row = 0;
  bool has_full = false;
  for (const Operand& o : ops) {
    if (o.full) has_full = true;
    else if (o.per_row) vec_bytes += align_up(M * esz(o.dt), 512), col_per_row += 512;
    else vec_bytes += (o.scalar ? 2 : ntiles) * 8 * 128 * esz(o.dt);
  }
  auto full_per_row = [&](int64_t ob) {
    int64_t bytes = 0;
    for (const Operand& o : ops)
      if (o.full) bytes += 2 * fstride_of(o, ob);
    return bytes;
  };
  // A conv's NCHW output stored straight (nchw_out_, docs/codegen.md "Shifted
  // convolutions"), or a pointwise conv's into the next conv's planes (planes_store_):
  // each output band (rows x columns) is transposed in VMEM into one of two images (a
  // channel's pixels a row mg elements apart, or a pixel's channels), and goes out from
  // there a band later, so neither DMA is waited for when issued.
  const bool to_planes = pst.addr >= 0 && wide_out;
  const bool transposed = (nchw.addr >= 0 && wide_out) || to_planes;
  // Members on the NCHW bands (nchw.post): their tensor operand's band comes with the
  // transpose, into an image of the same layout beside it.
  const bool post = transposed && !nchw.post.empty();
  int64_t post_operand = -1;
  {
    std::string run = nchw.run;
    for (const Node* m : nchw.post) {
      if (m->inputs.size() == 2) post_operand = t_.at(m->inputs[m->inputs[0] == run ? 1 : 0]).addr;
      run = m->output;
    }
  }
  const int64_t images = post ? 2 : 1;  // transposed images a band: the result's, the operand's
  // A transposed image's channel stride for bands of mg rows: an odd number of 8 x 128
  // tiles' rows, so the members' loads of 8 channels hit 8 VMEM banks, not one.
  auto tstride = [&](int64_t mg) { return odd_stride(mg * eo, 128 * eo); };
  auto band_image_bytes = [&](int64_t mg, int64_t ng) { return transposed ? 2 * images * ng * cw * C * tstride(mg) : 0; };
  // Band k's transposed image and its operand's beside it, from base: bands of up to
  // `cols` columns, a channel every ts bytes, two pairs alternating.
  auto band_images = [&](int64_t base, int64_t k, int64_t cols, int64_t ts) {
    const int64_t tb = base + k % 2 * images * cols * ts;
    return std::make_pair(tb, tb + cols * ts);
  };
  // Rows [m0, m0 + mr) of batch element b as runs of an image's pixels: nrows x npx
  // pixels from (oh, ow) of image img, band row r, transposed pixel j. A run is an
  // output row's pixels (the first and last may be partial); runs of whole rows merge.
  struct PixelRun {
    int64_t img, oh, ow, npx, nrows, r, j;
  };
  auto pixel_runs = [&](int64_t b, int64_t m0, int64_t mr) {
    std::vector<PixelRun> v;
    const int64_t Wq = nchw.Wq, OW = nchw.OW, M1 = nchw.OH * Wq;
    for (int64_t r = 0, j = 0; r < mr;) {
      const int64_t m = m0 + r, img = nchw.prow > 0 ? m / nchw.prow : b;
      const int64_t rr = nchw.prow > 0 ? m % nchw.prow : m;
      if (rr >= M1) {  // the rows between two images of a tall matmul
        r += nchw.prow - rr;
        continue;
      }
      const int64_t oh = rr / Wq, ow = rr % Wq, rows = std::min(Wq - ow, mr - r);
      const int64_t npx = std::max<int64_t>(0, std::min(OW, ow + rows) - ow);
      if (npx > 0) {
        PixelRun* last = v.empty() ? nullptr : &v.back();
        if (last && ow == 0 && npx == OW && last->ow == 0 && last->npx == OW && last->img == img &&
            last->oh + last->nrows == oh)
          ++last->nrows;
        else
          v.push_back(PixelRun{img, oh, ow, npx, 1, r, j});
        j += npx;
      }
      r += rows;
    }
    return v;
  };
  // The runs of each image: its first, and the band's pixels of it in the image.
  auto image_runs = [&](int64_t b, int64_t m0, int64_t mr) {
    std::vector<std::pair<PixelRun, int64_t>> v;
    const std::vector<PixelRun> rs = pixel_runs(b, m0, mr);
    for (size_t a = 0; a < rs.size();) {
      size_t z = a + 1;
      while (z < rs.size() && rs[z].img == rs[a].img) ++z;
      v.push_back({rs[a], rs[z - 1].j + rs[z - 1].npx * rs[z - 1].nrows - rs[a].j});
      a = z;
    }
    return v;
  };
  // Channels [n0, n0 + cols) of an NCHW tensor at `addr`: image f.img's pixels from
  // (f.oh, f.ow) on, a run a channel.
  auto nchw_at = [&](int64_t addr, const PixelRun& f, int64_t n0) {
    return addr + ((f.img * N + n0) * nchw.OH * nchw.OW + f.oh * nchw.OW + f.ow) * eo;
  };
  // An output band (rows `sstride` bytes apart at src, `cols` columns) -> the transposed
  // image at tb (a channel every ts bytes): VMEM -> VMEM, element runs cost their bytes;
  // the NCHW band of the members' operand into rb beside it.
  auto transpose_out = [&](int flag, int64_t b, int64_t m0, int64_t mr, int64_t n0, int64_t cols, int64_t src,
                           int64_t sstride, int64_t tb, int64_t ts, int64_t rb) {
    if (to_planes) {  // rows are channels, columns pixels: a pixel's mr channels together
      dma_on(flag, vmem(tb), vmem(src), eo, dim(mr, sstride, eo) + dim(cols, eo, mr * eo));
      return;
    }
    for (const PixelRun& pr : pixel_runs(b, m0, mr))
      dma_on(flag, vmem(tb + pr.j * eo), vmem(src + pr.r * sstride), eo,
             dim(cols, eo, ts) + dim(pr.npx, sstride, eo) + dim(pr.nrows, nchw.Wq * sstride, nchw.OW * eo));
    if (post_operand >= 0)
      for (const auto& [f, px] : image_runs(b, m0, mr))
        dma_on(flag, vmem(rb + f.j * eo), hbm(nchw_at(post_operand, f, n0)), px * eo,
               dim(cols, nchw.OH * nchw.OW * eo, ts));
  };
  // The members on the NCHW bands, on the transposed image at tb in place (8 channels x
  // 128 pixels a register), their operand's band at rb, as the epilogue would run them
  // (the running value rounded to its dtype before each; the first reads it as
  // stored). With the registers free (`many`: between K-streamed tiles) six blocks at a
  // time in v0..v23 so the loads' and ops' latencies overlap; else one in v28..v31.
  // Lanes past the band's pixels are masked (m1).
  auto run_post = [&](int64_t b, int64_t m0, int64_t mr, int64_t cols, int64_t tb, int64_t ts, int64_t rb, bool many) {
    int64_t J = 0;
    for (const auto& run : image_runs(b, m0, mr)) J += run.second;
    const bool ragged = cols % 8 != 0;  // each masked block sets its own mask
    const int64_t G = many && !ragged ? 6 : 1, base = many && !ragged ? 0 : 28;
    struct Blk {
      int64_t off, rows, lanes;
    };
    std::vector<Blk> blks;
    for (int64_t p0 = 0; p0 < J; p0 += 128)
      for (int64_t c0 = 0; c0 < cols; c0 += 8)
        blks.push_back(Blk{c0 * ts + p0 * eo, std::min<int64_t>(8, cols - c0), std::min<int64_t>(128, J - p0)});
    if (!ragged && J % 128) line("vmask m1, 8, " + std::to_string(J % 128));
    auto v = [&](int64_t g, int k) { return static_cast<int>(base + 4 * g + k); };
    auto vs = [&](int64_t g, int k) { return "v" + std::to_string(v(g, k)); };
    for (size_t i0 = 0; i0 < blks.size(); i0 += static_cast<size_t>(G)) {
      const int64_t n = std::min<int64_t>(G, static_cast<int64_t>(blks.size() - i0));
      auto tail = [&](int64_t g) {
        const Blk& k = blks[i0 + static_cast<size_t>(g)];
        return ", stride=" + std::to_string(ts) + (k.rows < 8 || k.lanes < 128 ? ", mask=m1" : "");
      };
      if (ragged && (blks[i0].rows < 8 || blks[i0].lanes < 128))
        line("vmask m1, " + std::to_string(blks[i0].rows) + ", " + std::to_string(blks[i0].lanes));
      for (int64_t g = 0; g < n; ++g)
        line(std::string(ld(ot)) + " " + vs(g, 0) + ", " + at(tb + blks[i0 + static_cast<size_t>(g)].off) + tail(g));
      if (post_operand >= 0)
        for (int64_t g = 0; g < n; ++g)
          line(std::string(ld(ot)) + " " + vs(g, 1) + ", " + at(rb + blks[i0 + static_cast<size_t>(g)].off) + tail(g));
      std::string run = nchw.run;
      for (size_t k = 0; k < nchw.post.size(); ++k) {
        const Node& m = *nchw.post[k];
        const bool first = m.inputs.size() == 1 || m.inputs[0] == run;
        for (int64_t g = 0; g < n; ++g) {
          if (k > 0 && ot == DType::kBf16) line("vcvt.bf16 " + vs(g, 0) + ", " + vs(g, 0));
          emit_op(m, v(g, 0), first ? v(g, 0) : v(g, 1), first ? v(g, 1) : v(g, 0), v(g, 2), v(g, 3));
        }
        run = m.output;
      }
      for (int64_t g = 0; g < n; ++g)
        line(std::string(st(ot)) + " " + vs(g, 0) + ", " + at(tb + blks[i0 + static_cast<size_t>(g)].off) + tail(g));
    }
  };
  // The transposed image -> channels [n0, n0 + cols) of the NCHW output: per image a run a channel.
  auto store_out = [&](int flag, int64_t b, int64_t m0, int64_t mr, int64_t n0, int64_t cols, int64_t tb,
                       int64_t ts, int64_t rb, bool many) {
    if (to_planes) {
      // Pixels [n0, n0 + cols) of image b, a run an output row or whole rows at once,
      // into the planes' rows of Wq pixels of M channels (one run a row when the band
      // holds every channel).
      const int64_t W = pst.W, Wq = pst.Wq;
      for (int64_t p = n0; p < n0 + cols;) {
        const int64_t oh = p / W, ow = p % W, npx = std::min(W - ow, n0 + cols - p);
        const int64_t nrows = ow == 0 && npx == W ? (n0 + cols - p) / W : 1;
        const int64_t dst = pst.addr + b * pst.image + ((pst.head + oh * Wq + ow) * M + m0) * eo;
        const int64_t src = tb + (p - n0) * mr * eo;
        const std::string rows = nrows > 1 ? dim(nrows, W * mr * eo, Wq * M * eo) : "";
        if (mr == M)
          dma_on(flag, hbm(dst), vmem(src), npx * M * eo, rows);
        else
          dma_on(flag, hbm(dst), vmem(src), mr * eo, dim(npx, mr * eo, M * eo) + rows);
        p += npx * nrows;
      }
      return;
    }
    if (post) run_post(b, m0, mr, cols, tb, ts, rb, many);
    for (const auto& [f, px] : image_runs(b, m0, mr))
      dma_on(flag, hbm(nchw_at(nchw.addr, f, n0)), vmem(tb + f.j * eo), px * eo, dim(cols, ts, nchw.OH * nchw.OW * eo));
  };
  // Transposes f2/f3, NCHW or plane stores f18/f19 (f20 on are collectives' landing flags).
  constexpr int kXposeFlag = 2, kNchwFlag = 18;
  auto need = [&](int64_t mg, bool res, int64_t bg) {
    return (res ? chunks * R * ws_of(bg) + wrow : kSlots * kw * cw * wtile) + lbands * lhs_band_bytes(mg) +
           cw * mg * 512 + 2 * mg * obs_of(std::min(OB, bg)) + vec_bytes +
           mg * (full_per_row(std::min(OB, bg)) + col_per_row) + band_image_bytes(mg, std::min(OB, bg));
  };
  bool resident = true;
  int64_t BG = ngroups;
  const int64_t kMinRows = 256;  // below this the pushes and the pipeline's fill dominate
  while (need(Mg, resident, BG) > vmem_cap) {
    if (Mg > kMinRows) Mg = std::max<int64_t>(kMinRows, align_up(Mg / 2, 8));
    else if (resident && BG > 1) BG = (BG + 1) / 2;
    else if (Mg > 8) Mg = std::max<int64_t>(8, align_up(Mg / 2, 8));
    else if (resident) resident = false, BG = 1, Mg = std::max<int64_t>(8, std::min<int64_t>(2048, per_core));
    else break;
  }
  // K-streamed tiles (docs/codegen.md, "Large GEMMs: K-streamed tiles"). When a unit's
  // LHS rows and a band of weights do not both fit (the plan above had to shrink: short
  // units pay an mswap per few blocks, narrow bands re-read the LHS, and every unit or
  // band starts on an empty image), or a core has 512 rows or more and K two passes or
  // more (or an LHS band and 2048 rows): the resident plan's first unit loads its
  // weights and its LHS before the MXUs start, the tiles' ramped first pass only panel 0
  // and a piece of rows (v3 1024^2 GEMM 65.4% -> 70.5% of the MXU bound, v5e 58.0% ->
  // 66.7%), so the output is cut into tiles of Mt rows x NG
  // column groups whose fp32 partial sums stay in VMEM while K streams past them: per
  // pass (kw chunks) every column group of the tile runs its blocks. A pass's LHS
  // comes from a K band of LB chunks (two band slots, f13/f14), its weights from a
  // panel of its kw*R rows x the tile's columns (3 to 5 slots on the pass ring's
  // flags); both are fetched ahead across the tiles of a core, so only the core's
  // first tile waits on HBM. Each output element still sums its chunks in increasing
  // order (mpop, then mpop.add per chunk, the partial sum in VMEM between passes).
  const bool shrunk = Mg < Mg0 || BG < ngroups || !resident;
  // Batches of matmuls with a B of their own each (attention's per-head products, the
  // images of a pointwise conv as W x X) take the tiles too: their panels and LHS bands
  // are fetched ahead across a core's tiles, where the resident plan's units would each
  // wait for their own weights (and full operands). resnet50's 1 x 1 convs at batch 8
  // on v3 (512 to 1024 rows of W): layer2's conv3 + add ~38 K -> ~26 K cycles each.
  // (With one B for the batch the resident plan keeps it: the cnn training step's
  // batched products ran 0.8% slower as tiles.)
  const bool own_b_batches = batches >= 2 * cores_ && num_elements(bs) > K * N;
  // Columns over the cores with more weight bytes a core than LHS bytes (a batch-1
  // classifier, layer4's convs, BERT's projections) take them too: the resident plan
  // loads a core's whole band before its MXUs start, the tiles' panels arrive while
  // the MXUs push the ones before (resnet50's 1024 -> 2048 downsample 16.8 K -> 12.0 K
  // cycles). With the LHS the larger (layer3's 3x3 convs) the resident plan is faster.
  const bool weight_bound_cols =
      cols_over_cores && K * ((N + cores_ - 1) / cores_) * eb > M * batches * K * ea;
  if ((shrunk || own_b_batches || weight_bound_cols || (per_core >= 512 && chunks >= 2 * kw) ||
       (chunks >= LB && per_core >= 2048)) &&
      !tb) {
    constexpr int kBandFlag = 13;  // f13..f16: the LHS band slots
    const int64_t np = (chunks + kw - 1) / kw;  // passes a tile
    int64_t panels = 3;  // weight panel slots (f8..); up to kMaxPanels when they fit, below
    // One-pass tiles (the attention's per-head products) take less MXU time than a DMA's
    // latency: four LHS band slots instead of two (a band one tile ahead kept each tile
    // waiting for its own), and two output buffers (f4, f5), so a tile's epilogue does
    // not wait for the store of the tile just before it (a multi-pass tile's passes cover
    // that store). BERT's batch-8 attention products on v3 ~32 K -> ~20.6 K cycles each.
    int64_t BS = np == 1 ? 4 : 2, OBUF = np == 1 ? 2 : 1;
    // Packs: P one-pass tiles in a row of a core, each a whole batch element of at most
    // kPackRows rows (the attention's per-head products), whose panels, LHS bands and
    // outputs are equally spaced in HBM move as one DMA each, with a dimension over the
    // tiles, into P slots in a row. Tile by tile, a core's 4 DMA engines, each held ~500
    // cycles by a 16 KiB transfer, took ~375 cycles a tile for its three transfers,
    // against ~130 cycles of mmuls. The rings hold three packs of panels and bands and
    // two of outputs, a flag a pack. BERT's batch-8 attention products on v3 (packs of
    // 6 heads) 21.2 K -> ~10.5 K cycles each, with the runs through the tiles below.
    constexpr int64_t kPackTiles = 8, kPackRows = 128;
    int64_t P = 1;
    // Packs of p tiles (p = 1: none, the rings above).
    auto set_packs = [&, panels1 = panels, BS1 = BS, OBUF1 = OBUF](int64_t p) {
      P = p;
      panels = p > 1 ? 3 * p : panels1;
      BS = p > 1 ? 3 * p : BS1;
      OBUF = p > 1 ? 2 * p : OBUF1;
    };
    if (own_b_batches && np == 1 && chunks <= LB && M <= kPackRows && N <= cw * C && !transposed && !has_full &&
        !in_place && shifted.tap_rows.empty()) {
      // A core's tiles are batch elements c, c + cores, ... (one tile each); the pack of
      // its tiles [t, t + p) is one transfer per operand if each operand's tiles are
      // equally spaced in it (views: a batch's heads are, across batch elements not).
      auto spaced = [&](int64_t p, const auto& addr_of) {
        for (int64_t c = 0; c < cores_; ++c)
          for (int64_t b0 = c; b0 < batches; b0 += p * cores_) {
            const int64_t d = b0 + cores_ < batches ? addr_of(b0 + cores_) - addr_of(b0) : 0;
            if (std::abs(d) > std::numeric_limits<int32_t>::max()) return false;
            for (int64_t b = b0 + cores_; b < std::min(batches, b0 + p * cores_); b += cores_)
              if (addr_of(b) - addr_of(b - cores_) != d) return false;
          }
        return true;
      };
      for (int64_t p = kPackTiles; p > 1 && P == 1; --p)
        if (spaced(p, a_at) && spaced(p, b_at) && spaced(p, o_at)) set_packs(p);
    }
    // Row pieces of the core's first pass (at most kFirstPieceRows rows: their LHS rows
    // arrive about as fast as the MXUs use them) and of its last (kLastPieceRows), at
    // most kMaxPieces each: every piece costs one more step per column group.
    constexpr int64_t kFirstPieceRows = 256, kLastPieceRows = 192, kMaxPieces = 4;
    // Tiles up to Mg0 rows: the core's first pass runs in row pieces (the ramped ends
    // below), so a tall first tile no longer waits for all its rows before the MXUs start,
    // and taller tiles take fewer steps (an mswap each) and re-read the weights less.
    const int64_t Mmax = Mg0;
    // Column groups whose panel rows are kRunBytes long (HBM efficiency), if they fit.
    const int64_t NGr = std::min(ngroups, (kRunBytes + cw * C * eb - 1) / (cw * C * eb));
    auto tile_out_bytes = [&](int64_t mt, int64_t ng) { return wide_out ? mt * obs_of(ng) : ng * cw * mt * orow; };
    // A tile's full epilogue operands: its rows x columns, one buffer a tile parity
    // (f6/f7), fetched a tile ahead.
    auto full_t = [&](int64_t mt, int64_t ng) { return mt * full_per_row(ng); };
    auto need_s = [&](int64_t mt, int64_t ng) {
      return panels * kw * R * ws_of(ng) + wrow + BS * lhs_band_bytes(mt) + ng * cw * mt * 512 +
             OBUF * tile_out_bytes(mt, ng) + vec_bytes + mt * col_per_row + full_t(mt, ng) + band_image_bytes(mt, ng);
    };
    // Rows up to 256 first (an mswap per Mt/8 blocks), then panel rows of kRunBytes,
    // then more rows (fewer weight re-reads), then more columns (fewer LHS re-reads).
    if (P > 1 && need_s(align_up(M, 8), 1) > vmem_cap) set_packs(1);  // packs do not fit
    int64_t Mt = 0, NG = 0;
    auto key = [&](int64_t mt, int64_t ng) {
      return std::make_tuple(std::min<int64_t>(mt, 256), std::min(ng, NGr), mt, ng);
    };
    for (int64_t mt = Mmax;; mt = std::max<int64_t>(8, align_up(mt / 2, 8))) {
      for (int64_t ng = ngroups;; ng = (ng + 1) / 2) {
        if (need_s(mt, ng) <= vmem_cap) {
          if (Mt == 0 || key(mt, ng) > key(Mt, NG)) Mt = mt, NG = ng;
          break;
        }
        if (ng == 1) break;
      }
      if (mt == 8) break;
    }
    const int64_t mtiles = Mt > 0 ? (M + Mt - 1) / Mt : 0;
    if (P > 1 && mtiles != 1) set_packs(1);  // a tile a batch element, or no packs
    const bool split_cols = Mt > 0 && batches * mtiles < cores_ && ngroups > 1;
    if (split_cols) NG = band_width_for_cores(batches * mtiles, NG);
    // A pass whose panel the MXUs push faster than a DMA brings it (few rows: layer4's
    // 3x3 convs push a 128 KB panel in ~400 cycles, its DMA takes ~740) needs more
    // panels in flight than 3: 5 for small panels on a long K (more, and a tile's passes
    // wait for the panels ahead of them: bandwidth-bound panels, attention's one-pass
    // tiles whose LHS bands then queue behind the panels for a DMA engine), where the
    // tile's plan still fits.
    constexpr int64_t kMaxPanels = 5;  // f8..f12
    constexpr int64_t kSmallPanel = 192 << 10;
    if (P == 1 && Mt > 0 && kw * R * ws_of(NG) <= kSmallPanel && chunks >= kMaxPanels * kw) {
      panels = kMaxPanels;
      if (need_s(Mt, NG) > vmem_cap) panels = 3;
    }
    // Every tile on the same weights (one band of columns, one B for the batch) and K in
    // at most kMaxPanels passes: a slot a pass, so the panels are fetched once and stay
    // (fetch_panel below). The cnn step's backward convs of K = 1152 (5 passes) re-read
    // their weights each tile on 3 slots, ~300 cycles a pass waiting for them.
    const bool one_b = !own_b_batches && (batches == 1 || b_at(0) == b_at(batches - 1));
    if (P == 1 && Mt > 0 && one_b && NG >= ngroups && np > panels && np <= kMaxPanels) {
      const int64_t before = panels;
      panels = np;
      if (need_s(Mt, NG) > vmem_cap) panels = before;
    }
    if (Mt > 0) {
      const int64_t wsp = ws_of(NG), panel = kw * R * wsp;
      const int64_t lbase = panels * panel + wrow, abase = lbase + BS * lhs_band_bytes(Mt);
      const int64_t obase = abase + NG * cw * Mt * 512;
      const int64_t tobs = obs_of(NG);
      const int64_t OBs = wide_out ? std::min(NG, OB) : 1;
      int64_t vtop = obase + OBUF * tile_out_bytes(Mt, NG);
      for (Operand& o : ops) {
        o.vbase = vtop;
        if (o.per_row) {
          o.raw = vtop + Mt * 512;
          vtop = o.raw + align_up(M * esz(o.dt), 512);
        } else {
          vtop += o.full ? 2 * Mt * fstride_of(o, NG) : (o.scalar ? 2 : ntiles) * 8 * 128 * esz(o.dt);
        }
      }
      // The transposed images (band_images): a channel every TS bytes.
      const int64_t TS = tstride(Mt);
      auto timage = [&, tbase = vtop](size_t ti) { return band_images(tbase, static_cast<int64_t>(ti), NG * cw * C, TS); };
      auto tile_cols = [&](const auto& tl) { return std::min(NG * cw * C, N - tl.n0); };
      struct Tile {
        int64_t b, m0, mr, n0, ng;
      };
      // A core keeps its rows for every column tile (its LHS band serves them all),
      // unless the row tiles are fewer than the cores: then the tiles' column bands go
      // round robin too, so each core reads only its bands' weights.
      std::vector<std::vector<Tile>> core_tiles(static_cast<size_t>(cores_));
      int64_t next_tile = 0;
      for (int64_t b = 0; b < batches; ++b)
        for (int64_t n0 = 0; n0 < N; n0 += NG * cw * C)
          for (int64_t m0 = 0; m0 < M; m0 += Mt, ++next_tile)
            core_tiles[static_cast<size_t>((split_cols ? next_tile : b * mtiles + m0 / Mt) % cores_)].push_back(
                Tile{b, m0, std::min(Mt, M - m0), n0, std::min(NG, (N - n0 + cw * C - 1) / (cw * C))});
      const int64_t nbands = (chunks + LB - 1) / LB;
      sync_all();
      for (int core = 0; core < cores_; ++core) {
        cur_ = core;
        const std::vector<Tile>& tiles = core_tiles[static_cast<size_t>(core)];
        if (tiles.empty()) continue;
        lhs_masks();
        auto tile_store_out = [&](size_t ti) {
          const Tile& tl = tiles[ti];
          const auto [tb, rb] = timage(ti);
          store_out(kNchwFlag + static_cast<int>(ti % 2), tl.b, tl.m0, tl.mr, tl.n0, tile_cols(tl), tb, TS, rb, true);
        };
        // Passes and LHS bands of all the core's tiles in order: pass z uses panel slot
        // z % panels, band y slot y % BS; with packs (np = nbands = 1: z = y = the tile)
        // the fetch of a pack's first tile brings the pack, and a pack has one flag.
        auto tile_of_pass = [&](int64_t z) { return tiles[static_cast<size_t>(z / np)]; };
        // A tile whose LHS band is the tile before's (one A for the batch: the weights of a
        // pointwise conv's W x X, a tile an image) reads that band where it lies, so the
        // core brings its weights once instead of once an image (resnet50's layer4 1 x 1
        // convs at batch 8: 2 MB of W x 4 images a core). tile_band: each tile's band
        // (of nbands), band_tile: the first tile of each.
        std::vector<int64_t> tile_band, band_tile;
        for (size_t ti = 0; ti < tiles.size(); ++ti) {
          const bool same = ti > 0 && nbands == 1 && P == 1 && shifted.tap_rows.empty() &&
                            tiles[ti].m0 == tiles[ti - 1].m0 && tiles[ti].mr == tiles[ti - 1].mr &&
                            a_at(tiles[ti].b) == a_at(tiles[ti - 1].b);
          if (!same) band_tile.push_back(static_cast<int64_t>(ti));
          tile_band.push_back(static_cast<int64_t>(band_tile.size()) - 1);
        }
        const int64_t Z = static_cast<int64_t>(tiles.size()) * np, Y = static_cast<int64_t>(band_tile.size()) * nbands;
        line("# k-streamed tiles: " + std::to_string(tiles.size()) + " tiles, " + std::to_string(band_tile.size()) +
             " lhs rows");
        auto slot_flag = [&](int64_t z) { return kSlotFlag + static_cast<int>(z % panels / P); };
        auto band_flag = [&](int64_t y) { return kBandFlag + static_cast<int>(y % BS / P); };
        // The pack dimension of the transfer of tile t (its first tile): src / dst strides
        // of addr_of's tiles and of `slot` bytes a tile in VMEM.
        auto pack_dim = [&](int64_t t, const auto& addr_of, int64_t slot, bool to_vmem) {
          const int64_t count = P == 1 ? 1 : std::min(P, static_cast<int64_t>(tiles.size()) - t);
          if (count == 1) return std::string();
          const int64_t d = addr_of(tiles[static_cast<size_t>(t) + 1].b) - addr_of(tiles[static_cast<size_t>(t)].b);
          return to_vmem ? dim(count, d, slot) : dim(count, slot, d);
        };
        // What each panel slot holds (B's address, first column, pass): a tile whose
        // pass finds its panel already in the slot (the same weights for every tile, np
        // passes on np slots: a conv's K of 3 to 5 passes) does not fetch it again; its
        // wait then covers the DMA that brought it. The cnn step's l3 conv re-read its
        // 295 KB of weights for each of 8 tiles, waiting ~300 cycles a pass.
        std::vector<std::array<int64_t, 3>> slot_holds(static_cast<size_t>(panels), {-1, -1, -1});
        auto fetch_panel = [&](int64_t z) {
          if (z % P) return;  // its pack came with the pack's first
          const Tile tl = tile_of_pass(z);
          const int64_t k0 = (z % np) * kw * R, kcols = std::min(K, k0 + kw * R) - k0;
          if (P == 1) {
            const std::array<int64_t, 3> holds{b_at(tl.b), tl.n0, z % np};
            if (std::exchange(slot_holds[static_cast<size_t>(z % panels)], holds) == holds) return;
          }
          dma_on(slot_flag(z), vmem((z % panels) * panel), hbm(b_at(tl.b) + k0 * brow + tl.n0 * eb),
                 std::min(NG * cw * C, N - tl.n0) * eb, dim(kcols, brow, wsp) + pack_dim(z, b_at, panel, true));
        };
        // Rows [r0, r1) of the tile (all of them by default).
        auto fetch_band = [&](int64_t y, int64_t r0 = 0, int64_t r1 = -1) {
          if (y % P) return;
          const Tile tl = tiles[static_cast<size_t>(band_tile[static_cast<size_t>(y / nbands)])];
          if (r1 < 0) r1 = tl.mr;
          const int64_t k0 = (y % nbands) * LB * R, lcols = std::min(K, k0 + LB * R) - k0;
          lhs_dma(band_flag(y), lbase + (y % BS) * lhs_band_bytes(Mt), tl.b, tl.m0, r0, r1, k0, lcols, Mt,
                  pack_dim(y, a_at, lhs_band_bytes(Mt), true));
        };
        // Ramped ends (docs/codegen.md, "Large GEMMs"): the core's first pass runs in row
        // pieces whose LHS rows come as separate DMAs, so the MXUs start after panel 0 and
        // the first piece's rows instead of the whole band; its last pass runs in row
        // pieces whose output goes out as each finishes, so only the last piece's store is
        // left with nothing to hide it. A piece repeats the pass's pushes (one more step
        // per column group), so pieces keep at least kMinPieceBlocks blocks.
        const int64_t kMinPieceBlocks = 16;
        auto pieces_of = [&](const Tile& tl, int64_t rows) {
          return std::max<int64_t>(1, std::min({kMaxPieces, (tl.mr + rows - 1) / rows, (tl.mr + 7) / 8 / kMinPieceBlocks}));
        };
        const int64_t HF = pieces_of(tiles.front(), kFirstPieceRows), HL = pieces_of(tiles.back(), kLastPieceRows);
        auto piece_rows = [&](const Tile& tl, int64_t h, int64_t H) {  // rows [r0, r1) of piece h, whole blocks
          const int64_t nb = (tl.mr + 7) / 8;
          return std::make_pair(std::min(tl.mr, nb * h / H * 8), std::min(tl.mr, nb * (h + 1) / H * 8));
        };
        // Only what the first piece needs before the MXUs can start; the rest of the ring
        // fills while it runs.
        fetch_panel(0);
        fetch_band(0, 0, piece_rows(tiles.front(), 0, HF).second);
        int64_t bands_fetched = 1;  // bands after the first go BS - 1 ahead of the one in use
        if (vec_bytes > 0) {  // behind the first panel and rows, so their latencies overlap
          load_replicated();
          wait_dmas();
        }
        // Tile ti's full operands into buffer ti % 2 (f6/f7).
        auto fetch_full = [&](size_t ti) {
          const Tile& tl = tiles[ti];
          const int64_t par = static_cast<int64_t>(ti % 2), cols = std::min(NG * cw * C, N - tl.n0);
          for (const Operand& o : ops) {
            if (!o.full) continue;
            const int64_t e = esz(o.dt), fs = fstride_of(o, NG);
            const int64_t src = o.addr + tl.b * M * N * e + (tl.m0 * N + tl.n0) * e;
            if (wide_out) {
              dma_on(kEpiFlag + static_cast<int>(par), vmem(o.vbase + par * Mt * fs), hbm(src), cols * e,
                     dim(tl.mr, N * e, fs));
              continue;
            }
            for (int64_t c0 = 0; c0 < cols; c0 += C)
              dma_on(kEpiFlag + static_cast<int>(par), vmem(o.vbase + par * Mt * fs + c0 / C * Mt * 128 * e),
                     hbm(src + c0 * e), std::min(C, cols - c0) * e, dim(tl.mr, N * e, 128 * e));
          }
        };
        if (has_full) fetch_full(0);
        int64_t out_dmas[2] = {0, 0};
        // Runs of tiles whose software pipeline goes through from one tile to the next:
        // the next tile's weights are pushed while this one's last blocks are multiplied,
        // and its first blocks multiplied while this one's results are popped and stored.
        // Tile by tile, each drained the MXU pipeline (a pop latency and the epilogues)
        // and filled it again (the weight pushes): BERT's batch-8 attention products, 48
        // one-pass tiles a core, spent ~390 cycles a tile on ~128 cycles of mmuls. A tile
        // whose buffers are handed over between tiles outside the pipeline (a transposed
        // output, full epilogue operands fetched a tile ahead, per-row operands of other
        // rows spread in v0..v15) is a run of its own.
        const bool per_row_ops = std::any_of(ops.begin(), ops.end(), [](const Operand& o) { return o.per_row; });
        const bool run_through = !transposed && !has_full &&
                                 std::all_of(tiles.begin(), tiles.end(), [&](const Tile& t) {
                                   return !per_row_ops || t.m0 == tiles.front().m0;
                                 });
        std::vector<bool> out_waited(tiles.size(), false), full_waited(tiles.size(), false);
        for (size_t t0 = 0; t0 < tiles.size();) {
          const size_t t1 = run_through ? tiles.size() : t0 + 1;
          if (has_full && t0 + 1 < tiles.size()) fetch_full(t0 + 1);  // its buffer's last reader was tile t0 - 1
          // Steps: one pass's column group over blocks [b0, b1) of a tile; the core's
          // first pass and its last are cut into row pieces (the ramped ends above).
          struct KStep {
            Pass ps;
            int64_t h, b0, b1;
            bool pass_start;  // the pass's first step
            size_t ti;        // its tile
          };
          std::vector<KStep> seq;
          for (size_t ti = t0; ti < t1; ++ti) {
            const Tile& tl = tiles[ti];
            const bool first_tile = ti == 0, last_tile = ti + 1 == tiles.size();
            for (int64_t p = 0; p < np; ++p) {
              const int64_t H = p == 0 && first_tile ? HF : p == np - 1 && last_tile ? HL : 1;
              for (int64_t h = 0; h < H; ++h) {
                const auto rows = piece_rows(tl, h, H);
                for (int64_t g = 0; g < tl.ng; ++g) {
                  const int64_t n0 = tl.n0 + g * cw * C;
                  seq.push_back(KStep{Pass{g, p, p * kw, std::min(kw, chunks - p * kw), n0,
                                           std::min(cw, (N - n0 + C - 1) / C), p == 0, p == np - 1},
                                      h, rows.first / 8, (rows.second + 7) / 8, h == 0 && g == 0, ti});
                }
              }
            }
          }
          const int64_t Q = static_cast<int64_t>(seq.size());
          std::vector<std::pair<int64_t, int64_t>> item_at;  // (step, block) of each pipeline item
          int64_t min_blocks = std::numeric_limits<int64_t>::max();
          for (int64_t q = 0; q < Q; ++q) {
            const KStep& ks = seq[static_cast<size_t>(q)];
            min_blocks = std::min(min_blocks, ks.b1 - ks.b0);
            for (int64_t i = ks.b0; i < ks.b1; ++i) item_at.push_back({q, i});
          }
          // Pass z of the core (panel slot z % panels) and LHS band y (slot y % BS).
          auto z_of = [&](const KStep& ks) { return static_cast<int64_t>(ks.ti) * np + ks.ps.p; };
          auto y_of = [&](const KStep& ks) { return tile_band[ks.ti] * nbands + ks.ps.c0 / LB; };
          auto w_at = [&](int64_t q, int64_t w, int64_t k, int64_t r) {
            const KStep& ks = seq[static_cast<size_t>(q)];
            return (z_of(ks) % panels) * panel + (k * R + r) * wsp + (ks.ps.t * cw + w) * C * eb;
          };
          auto acc_at = [&](const Pass& ps, int64_t w, int64_t i) {
            return abase + ((ps.t * cw + w) * Mt + i * 8) * 512;
          };
          spread_per_row(tiles[t0].m0, tiles[t0].mr);  // every tile of a run with per-row operands has these rows
          wait_flag(slot_flag(z_of(seq.front())));
          wait_flag(band_flag(y_of(seq.front())));
          int64_t wreg = 0;
          auto push_list = [&](int64_t q) {
            if (q >= Q) return std::vector<std::pair<int64_t, int64_t>>{};
            return pass_pushes(seq[static_cast<size_t>(q)].ps,
                               [&](int64_t w, int64_t k, int64_t r) { return w_at(q, w, k, r); });
          };
          auto emit_push = [&](const std::pair<int64_t, int64_t>& pw) {
            const int64_t v = 24 + (wreg++ % 4);
            line(std::string(ld(bt)) + " " + vr(v) + ", " + at(pw.second) + ", stride=" + std::to_string(wsp));
            line("mpush " + mx(pw.first) + ", " + vr(v));
          };
          auto emit_swaps = [&](int64_t q) { pass_swaps(seq[static_cast<size_t>(q)].ps); };
          for (const auto& pw : push_list(0)) emit_push(pw);
          emit_swaps(0);
          const int64_t E = std::max<int64_t>(0, std::min<int64_t>({kw + 1, AS - 2, min_blocks - 1}));
          const int64_t G = epilogue_group(E);
          std::vector<Held> held;
          // Tile ti's output buffer, and its flag (kOutFlag + ob_of, one a pack).
          auto ob_of = [&](size_t ti) { return static_cast<int>(static_cast<int64_t>(ti) % OBUF / P); };
          auto obuf_of = [&](size_t ti) { return obase + static_cast<int64_t>(ti) % OBUF * tile_out_bytes(Mt, NG); };
          // Block i's column tile w in the last pass of tile ti: the epilogue, and the
          // store into the output buffer.
          auto last_block = [&](size_t ti, int64_t i, int64_t j2, const Pass& ps, int64_t w, const Scratch& sc) {
            const Tile& tl = tiles[ti];
            const int64_t obuf = obuf_of(ti);
            const int64_t a = 8 + (j2 % AS) * cw + w;
            emit_epilogue(
                a, ps.n0 / C + w,
                [&](const Operand& o) {
                  if (o.per_row) return std::make_pair(o.vbase + i * 8 * 512, int64_t{512});
                  const int64_t e = esz(o.dt), fs = fstride_of(o, NG), c0 = ps.n0 - tl.n0 + w * C;
                  const int64_t buf = o.vbase + static_cast<int64_t>(ti % 2) * Mt * fs;
                  if (wide_out) return std::make_pair(buf + i * 8 * fs + c0 * e, fs);
                  return std::make_pair(buf + (c0 / C * Mt + i * 8) * 128 * e, 128 * e);
                },
                sc);
            if (wide_out)
              line(std::string(st(ot)) + " " + vr(a) + ", " + at(obuf + i * 8 * tobs + (ps.t * cw + w) * orow) +
                   ", stride=" + std::to_string(tobs));
            else
              line(std::string(st(ot)) + " " + vr(a) + ", " + at(obuf + ((ps.t * cw + w) * Mt + i * 8) * orow));
          };
          const int64_t items = static_cast<int64_t>(item_at.size());
          std::vector<std::pair<int64_t, int64_t>> pending;
          size_t next_push = 0;
          int64_t per_item = 0;
          for (int64_t s = 0; s < items + D + E; ++s) {
            if (s < items) {
              const int64_t q = item_at[static_cast<size_t>(s)].first, i = item_at[static_cast<size_t>(s)].second;
              const KStep& ks = seq[static_cast<size_t>(q)];
              const Pass& ps = ks.ps;
              const Tile& tl = tiles[ks.ti];
              const bool first_tile = ks.ti == 0;
              const int64_t z = z_of(ks), y = y_of(ks);
              if (i == ks.b0) {
                // The first pass in pieces: piece h waits for its rows (the only DMA left on
                // its band flag) and fetches the next piece's; panel 1 comes with piece 1's
                // rows, the rest of the ring and the next band with the last piece's.
                const bool ramp = first_tile && ps.p == 0 && HF > 1 && ps.t == 0;
                if (ramp && ks.h > 0) wait_flag(band_flag(y));
                if (ramp && ks.h + 1 < HF) {
                  const auto rows = piece_rows(tl, ks.h + 1, HF);
                  fetch_band(y, rows.first, rows.second);
                }
                if (ks.pass_start && z == 0 && HF > 1 && Z > 1) fetch_panel(1);
                const bool ring = HF > 1 && first_tile && ps.p == 0 ? ramp && ks.h == HF - 1 : ks.pass_start;
                if (ring) {  // a new pass: its panel slot's previous contents (a pack's) are pushed
                  for (int64_t zz = z == 0 ? (HF > 1 ? 2 : 1) : z + panels - P; zz <= std::min(z + panels - P, Z - 1);
                       ++zz)
                    fetch_panel(zz);
                  if (ps.c0 % LB == 0) {  // a new band: the slot of the band before it (a pack's) is read
                    for (; bands_fetched < std::min(Y, y + BS - P + 1); ++bands_fetched) fetch_band(bands_fetched);
                    if (q > 0 && !ramp && y % P == 0) wait_flag(band_flag(y));
                  }
                }
                if (q + 1 < Q && seq[static_cast<size_t>(q + 1)].pass_start && (z + 1) % P == 0)
                  wait_flag(slot_flag(z + 1));
                pending = push_list(q + 1);
                next_push = 0;
                per_item = (static_cast<int64_t>(pending.size()) + (ks.b1 - ks.b0) - 1) / (ks.b1 - ks.b0);
              }
              const int64_t lset = (s % LS) * kw;
              std::vector<LhsChunk> lcs;
              for (int64_t k = 0; k < ps.kk; ++k)
                lcs.push_back(LhsChunk{lset + k, lbase + (y % BS) * lhs_band_bytes(Mt), ps.c0 + k});
              lhs_vlds(lcs, i * 8, Mt);
              for (int64_t w = 0; w < ps.cwt; ++w)
                for (int64_t k = 0; k < ps.kk; ++k) line("mmul " + mx(mxu_at(ps, i, w, k)) + ", " + vr(lset + k));
              for (int64_t x = 0; x < per_item && next_push < pending.size(); ++x) emit_push(pending[next_push++]);
              if (i == ks.b1 - 1 && q + 1 < Q) {
                while (next_push < pending.size()) emit_push(pending[next_push++]);
                emit_swaps(q + 1);
              }
            }
            const int64_t j = s - D;
            if (j >= 0 && j < items) {
              const int64_t i = item_at[static_cast<size_t>(j)].second;
              const Pass& ps = seq[static_cast<size_t>(item_at[static_cast<size_t>(j)].first)].ps;
              for (int64_t w = 0; w < ps.cwt; ++w) {
                const int64_t a = 8 + (j % AS) * cw + w;
                if (!ps.first) line("vld " + vr(a) + ", " + at(acc_at(ps, w, i)));
                for (int64_t k = 0; k < ps.kk; ++k)
                  line(std::string(k == 0 && ps.first ? "mpop " : "mpop.add ") + vr(a) + ", " +
                       mx(mxu_at(ps, i, w, k)));
              }
            }
            const int64_t j2 = s - D - E;
            if (j2 >= 0 && j2 < items) {
              const int64_t i = item_at[static_cast<size_t>(j2)].second;
              const KStep& ks = seq[static_cast<size_t>(item_at[static_cast<size_t>(j2)].first)];
              const Pass& ps = ks.ps;
              const size_t ti = ks.ti;
              const Tile& tl = tiles[ti];
              const int ob = ob_of(ti);
              // The output buffer (a pack's: waited for by its first tile) is free.
              if (ps.last && !out_waited[ti] && static_cast<int64_t>(ti) % P == 0 && out_dmas[ob] > 0)
                wait_flag((transposed ? kXposeFlag : kOutFlag) + ob);
              if (ps.last) out_waited[ti] = true;
              if (ps.last && has_full && !full_waited[ti]) {
                wait_flag(kEpiFlag + static_cast<int>(ti % 2));
                full_waited[ti] = true;
              }
              if (!ps.last)
                for (int64_t w = 0; w < ps.cwt; ++w) line("vst " + vr(8 + (j2 % AS) * cw + w) + ", " + at(acc_at(ps, w, i)));
              else
                held.push_back(Held{
                    j2, [&, ti, i, j2, ps](int64_t w, const Scratch& sc) { last_block(ti, i, j2, ps, w, sc); }, ps.cwt});
              if (ps.last && (static_cast<int64_t>(held.size()) == G || i == ks.b1 - 1))
                flush_epilogues(held, s);
              // In the last pass each sub-band of OBs column groups (runs of kRunBytes) of a
              // piece's rows goes out once its last block is stored, so only the last one is
              // left at the end. A pack's tiles go out together, after its last.
              const size_t tp = ti - ti % static_cast<size_t>(P);  // the pack's first tile
              if (!transposed && ps.last && i == ks.b1 - 1 && ((ps.t + 1) % OBs == 0 || ps.t == tl.ng - 1) &&
                  (static_cast<int64_t>(ti) % P == P - 1 || ti + 1 == tiles.size())) {
                const int64_t o0 = o_at(tiles[tp].b), g0 = ps.t / OBs * OBs, obuf = obuf_of(tp);
                const int64_t c0 = tl.n0 + g0 * cw * C, cols = std::min((ps.t + 1 - g0) * cw * C, N - c0);
                const int64_t r0 = ks.b0 * 8, nr = std::min(tl.mr, ks.b1 * 8) - r0;
                const std::string pack = pack_dim(static_cast<int64_t>(tp), o_at, tile_out_bytes(Mt, NG), false);
                if (wide_out)
                  dma_on(kOutFlag + ob, hbm(o0 + (tl.m0 + r0) * orow_s + c0 * eo),
                         vmem(obuf + r0 * tobs + g0 * cw * orow), cols * eo, dim(nr, tobs, orow_s) + pack);
                else
                  for (int64_t tt = 0; tt * C < cols; ++tt)
                    dma_on(kOutFlag + ob, hbm(o0 + (tl.m0 + r0) * orow_s + (c0 + tt * C) * eo),
                           vmem(obuf + ((g0 * cw + tt) * Mt + r0) * orow), std::min(C, cols - tt * C) * eo,
                           dim(nr, orow, orow_s) + pack);
                ++out_dmas[ob];
              }
            }
          }
          if (transposed) {  // a run of one tile
            // The tile before this one is transposed by now (a tile's passes ago): out it
            // goes, and this tile's band takes the transposed image it left two tiles ago.
            const size_t ti = t0;
            const Tile& tl = tiles[ti];
            const int ob = ob_of(ti);
            if (ti > 0) {
              wait_flag(kXposeFlag + static_cast<int>(static_cast<int64_t>(ti - 1) % OBUF));
              tile_store_out(ti - 1);
            }
            if (ti >= 2) wait_flag(kNchwFlag + static_cast<int>(ti % 2));
            const auto [tb, rb] = timage(ti);
            transpose_out(kXposeFlag + ob, tl.b, tl.m0, tl.mr, tl.n0, tile_cols(tl), obuf_of(ti), tobs, tb, TS, rb);
            ++out_dmas[ob];
          }
          t0 = t1;
        }
        if (transposed) {
          const size_t last = tiles.size() - 1;
          wait_flag(kXposeFlag + static_cast<int>(static_cast<int64_t>(last) % OBUF));
          tile_store_out(last);
          wait_flag(kNchwFlag);
          if (last > 0) wait_flag(kNchwFlag + 1);
        } else {
          wait_flag(kOutFlag);
          if (OBUF > 1) wait_flag(kOutFlag + 1);
        }
      }
      transposed_stored_ = transposed;
      return;
    }
  }
  if (need(Mg, resident, BG) > vmem_cap)
    fail(n, "needs " + std::to_string(need(Mg, resident, BG)) + " bytes of VMEM, the target has " +
                std::to_string(vmem_cap));
  // Fewer row units than cores (a batch-1 classifier, a 7 x 7 conv): bands of columns
  // go to the cores too.
  const int64_t row_units = batches * ((M + Mg - 1) / Mg);
  if (resident) BG = band_width_for_cores(row_units, BG);
  const int64_t ws = ws_of(BG);
  const int64_t wres_bytes = resident ? chunks * R * ws + wrow : kSlots * kw * cw * wtile;
  const int64_t lhs_base = wres_bytes;
  // With one LHS band and more units than cores, two LHS images alternate over a core's
  // units and the next unit's rows are fetched (f13) as soon as a unit starts, so the
  // MXUs do not wait for them between units.
  const int64_t col_bands = (ngroups + BG - 1) / BG;
  const bool lhs_double =
      lbands == 1 && row_units * col_bands > cores_ && need(Mg, resident, BG) + lhs_band_bytes(Mg) <= vmem_cap;
  const int64_t acc_base = lhs_base + (lbands + lhs_double) * lhs_band_bytes(Mg);
  const int64_t out_base = acc_base + cw * Mg * 512;
  const int64_t OBb = std::min(OB, BG);
  const int64_t obs = obs_of(OBb);  // output band buffer row stride
  int64_t top = out_base + 2 * Mg * obs;
  for (Operand& o : ops) {
    o.vbase = top;
    if (o.per_row) {
      o.raw = top + Mg * 512;
      top = o.raw + align_up(M * esz(o.dt), 512);
    } else {
      top += o.full ? 2 * Mg * fstride_of(o, OBb) : (o.scalar ? 2 : ntiles) * 8 * 128 * esz(o.dt);
    }
  }
  // Straight to NCHW: per core, the output sub-band transposed last (its NCHW store
  // waits for the next one) and how many were, whose parity picks the image.
  struct SubBand {
    int64_t b, m0, mr, n0, cols;
  };
  const int64_t TS = tstride(Mg);
  auto timage = [&, tbase = top](int64_t k) { return band_images(tbase, k, OBb * cw * C, TS); };
  std::vector<std::optional<SubBand>> nchw_pending(static_cast<size_t>(cores_));
  std::vector<int64_t> nchw_bands(static_cast<size_t>(cores_), 0);
  auto flush_nchw = [&]() {  // the pending sub-band's store, once its transpose is done
    std::optional<SubBand>& p = nchw_pending[static_cast<size_t>(cur_)];
    if (!p) return;
    const int64_t k = nchw_bands[static_cast<size_t>(cur_)] - 1;
    wait_flag(kXposeFlag);
    const auto [tb, rb] = timage(k);
    store_out(kNchwFlag + static_cast<int>(k % 2), p->b, p->m0, p->mr, p->n0, p->cols, tb, TS, rb, false);
    p.reset();
  };

  std::vector<std::vector<Pass>> band_passes(static_cast<size_t>(col_bands));
  for (int64_t t = 0, n0 = 0; n0 < N; ++t, n0 += cw * C) {
    const int64_t cwt = std::min(cw, (N - n0 + C - 1) / C);
    const int64_t np = (chunks + kw - 1) / kw;
    for (int64_t p = 0; p < np; ++p)
      band_passes[static_cast<size_t>(t / BG)].push_back(
          Pass{t, p, p * kw, std::min(kw, chunks - p * kw), n0, cwt, p == 0, p == np - 1});
  }
  auto ncols = [&](const Pass& ps, int64_t w) { return std::min(C, N - (ps.n0 + w * C)); };

  sync_all();
  std::vector<std::map<int64_t, bool>> w_loaded(static_cast<size_t>(cores_));
  std::vector<bool> vec_loaded(static_cast<size_t>(cores_), false);
  int64_t unit = 0;
  // A unit's first LHS band, fetched during the previous unit of its core once that
  // unit's last column group has moved on to the next band (f13), so a unit does not
  // start on an empty LHS image: per core, the key of the unit it was fetched for.
  constexpr int kLhsPrefetchFlag = 13;
  std::vector<int64_t> lhs_prefetched(static_cast<size_t>(cores_), -1);
  std::vector<int64_t> core_units(static_cast<size_t>(cores_), 0);
  // Output buffers: a core's out DMAs (f4) in flight one at a time, each waited for
  // before the next is issued, across units too; a unit starts on the buffer its core's
  // last out DMA does not read, so it does not wait for that store (resnet's 7 x 7
  // stem, one column group a unit: ~1,000 cycles between units, the MXUs idle).
  std::vector<int64_t> out_issued(static_cast<size_t>(cores_), 0), out_last(static_cast<size_t>(cores_), 1);
  auto lhs_image = [&](int64_t k) {  // a core's unit k
    return lhs_base + (lhs_double ? k % 2 * lhs_band_bytes(Mg) : 0);
  };
  for (size_t band = 0; band < band_passes.size(); ++band) {
  const std::vector<Pass>& passes = band_passes[band];
  const int64_t Q = static_cast<int64_t>(passes.size());
  const int64_t t_first = passes.front().t, t_end = passes.back().t + 1;  // the band's column groups
  const int64_t bn0 = passes.front().n0, bn1 = std::min(N, bn0 + BG * cw * C);
  for (int64_t b = 0; b < batches; ++b) {
    const int64_t b0 = b_at(b);
    const int64_t o0 = o_at(b);
    for (int64_t m0 = 0; m0 < M; m0 += Mg) {
      on_core(unit++);
      lhs_masks();
      const int64_t mr = std::min(Mg, M - m0);
      const int64_t blocks = (mr + 7) / 8;
      // Batches that share B (a conv's images, a batched product's one weight matrix)
      // share its resident band: keyed by where the batch's B is.
      const int64_t wkey = (b0 - B.addr) * static_cast<int64_t>(band_passes.size()) + static_cast<int64_t>(band);
      const bool load_w = !resident || !w_loaded[static_cast<size_t>(cur_)][wkey];
      auto unit_key = [&](int64_t bb, int64_t row0) { return (static_cast<int64_t>(band) * batches + bb) * M + row0; };
      const bool lhs0_ready = lhs_prefetched[static_cast<size_t>(cur_)] == unit_key(b, m0);
      const int64_t lbase = lhs_image(core_units[static_cast<size_t>(cur_)]++);
      // The core's next unit of this band, cores_ units on: later rows of this batch
      // element or the first of a later one (a conv's next image, whose rows were
      // fetched only when its unit began: ~700 cycles an image on the cnn step's
      // backward convs).
      const int64_t upb = (M + Mg - 1) / Mg, next_unit = b * upb + m0 / Mg + cores_;
      const bool has_next = next_unit < batches * upb;
      const int64_t next_b = next_unit / upb, next_m0 = next_unit % upb * Mg;
      // The first LHS band (chunks [0, LB)) of the core's next unit.
      auto lhs_band0 = [&](int flag) {
        lhs_dma(flag, lhs_image(core_units[static_cast<size_t>(cur_)]), next_b, next_m0, 0,
                std::min(Mg, M - next_m0), 0, std::min(K, LB * R), Mg);
      };
      w_loaded[static_cast<size_t>(cur_)][wkey] = true;
      // Weight tile (chunk c, column tile starting at col) in VMEM.
      // Row r of the weight tile (pass q, column tile w, chunk c0 + k) in VMEM.
      auto w_addr = [&](int64_t q, int64_t w, int64_t k, int64_t r) {
        const Pass& ps = passes[static_cast<size_t>(q)];
        if (resident) return ((ps.c0 + k) * R + r) * ws + (ps.n0 - bn0 + w * C) * eb;
        return ((q % kSlots) * kw * cw + w * kw + k) * wtile + r * wrow;
      };
      auto fetch = [&](int64_t q) {
        const Pass& ps = passes[static_cast<size_t>(q)];
        const int flag = kSlotFlag + static_cast<int>(q % kSlots);
        bool any = false;
        const int64_t k0 = ps.c0 * R, kcols = std::min(K, (ps.c0 + ps.kk) * R) - k0;
        if (load_w && resident) {
          // The pass's rows of B for a band of column groups at least kRunBytes wide
          // (long DMA runs keep HBM efficient), loaded by the band's first group, so
          // loading spreads over the first unit instead of crowding its first group.
          const int64_t wb = std::max<int64_t>(1, kRunBytes / (cw * C * eb));
          if ((ps.t - t_first) % wb == 0) {
            const int64_t gcols = std::min(wb * cw * C, bn1 - ps.n0);
            if (!tb)
              dma_on(flag, vmem(k0 * ws + (ps.n0 - bn0) * eb), hbm(b0 + k0 * brow + ps.n0 * eb), gcols * eb,
                     dim(kcols, brow, ws));
            else
              dma_on(flag, vmem(k0 * ws + (ps.n0 - bn0) * eb), hbm(b0 + (ps.n0 * K + k0) * eb), eb,
                     dim(gcols, K * eb, eb) + dim(kcols, eb, ws));
            any = true;
          }
        } else if (load_w) {
          for (int64_t w = 0; w < ps.cwt; ++w)
            for (int64_t k = 0; k < ps.kk; ++k) {
              const int64_t c = ps.c0 + k, kc = c * R, kr = kr_of(c), col = ps.n0 + w * C;
              if (!tb)
                dma_on(flag, vmem(w_addr(q, w, k, 0)), hbm(b0 + kc * brow + col * eb), ncols(ps, w) * eb,
                       dim(kr, brow, wrow));
              else
                dma_on(flag, vmem(w_addr(q, w, k, 0)), hbm(b0 + (col * K + kc) * eb), eb,
                       dim(ncols(ps, w), K * eb, eb) + dim(kr, eb, wrow));
              any = true;
            }
        }
        if (ps.t == t_first && ps.c0 % LB == 0 && !(ps.c0 == 0 && lhs0_ready)) {  // the unit's LHS rows, a band of LB chunks' columns
          lhs_dma(flag, lbase + ps.c0 / LB * lhs_band_bytes(Mg), b, m0, 0, mr, k0, std::min(K, (ps.c0 + LB) * R) - k0,
                  Mg);
          any = true;
        }
        return any;
      };
      std::vector<bool> fetched(static_cast<size_t>(Q), false);
      auto wait_pass = [&](int64_t q) {
        if (q < Q && fetched[static_cast<size_t>(q)]) wait_flag(kSlotFlag + static_cast<int>(q % kSlots));
      };
      // Full operands of sub-band x (column groups t_first + x * FB ..), into buffer x % 2.
      const int64_t FB = wide_out ? std::min(OBb, std::max<int64_t>(1, 1024 / (cw * C * eo))) : 1;
      const int64_t nsub = (t_end - t_first + FB - 1) / FB;
      auto epi_fetch = [&](int64_t x) {
        const int64_t sn0 = bn0 + x * FB * cw * C, cols = std::min(FB * cw * C, bn1 - sn0);
        for (const Operand& o : ops) {
          if (!o.full) continue;
          const int64_t e = esz(o.dt), fs = fstride_of(o, OBb);
          if (wide_out) {
            dma_on(kEpiFlag + static_cast<int>(x % 2), vmem(o.vbase + (x % 2) * Mg * fs),
                   hbm(o.addr + b * M * N * e + (m0 * N + sn0) * e), cols * e, dim(mr, N * e, fs));
            continue;
          }
          for (int64_t w = 0; w * C < cols; ++w)
            dma_on(kEpiFlag + static_cast<int>(x % 2), vmem(o.vbase + ((x % 2) * cw + w) * Mg * 128 * e),
                   hbm(o.addr + b * M * N * e + (m0 * N + sn0 + w * C) * e), std::min(C, cols - w * C) * e,
                   dim(mr, N * e, 128 * e));
        }
      };
      const bool any_full = has_full;

      // Prologue: replicated operand tiles, passes 0 and 1, pass 0's weights.
      if (any_full) {
        epi_fetch(0);
        if (nsub > 1) epi_fetch(1);
      }
      // The replicated operands go behind pass 0's fetches, ahead of the later passes':
      // behind all of them a bias tile waited for a DMA engine while the MXUs had pass
      // 0's weights and rows (v3 bf16 batch 1: resnet50 344,380 -> 336,019 cycles,
      // resnet18 157,524 -> 153,863).
      const bool load_vec = !vec_loaded[static_cast<size_t>(cur_)] && vec_bytes > 0;
      for (int64_t q = 0; q < std::min<int64_t>(kSlots - 1, Q); ++q) {
        fetched[static_cast<size_t>(q)] = fetch(q);
        if (q == 0 && load_vec) load_replicated();
      }
      if (load_vec) wait_dmas();
      vec_loaded[static_cast<size_t>(cur_)] = true;
      spread_per_row(m0, mr);
      wait_pass(0);
      if (lhs0_ready) wait_flag(kLhsPrefetchFlag);
      int64_t wreg = 0;
      auto push_list = [&](int64_t q) {
        if (q >= Q) return std::vector<std::pair<int64_t, int64_t>>{};
        return pass_pushes(passes[static_cast<size_t>(q)],
                           [&](int64_t w, int64_t k, int64_t r) { return w_addr(q, w, k, r); });
      };
      auto emit_push = [&](const std::pair<int64_t, int64_t>& pw) {
        const int64_t v = 24 + (wreg++ % 4);
        line(std::string(ld(bt)) + " " + vr(v) + ", " + at(pw.second) + ", stride=" + std::to_string(resident ? ws : wrow));
        line("mpush " + mx(pw.first) + ", " + vr(v));
      };
      auto emit_swaps = [&](int64_t q) { pass_swaps(passes[static_cast<size_t>(q)]); };
      for (const auto& pw : push_list(0)) emit_push(pw);
      emit_swaps(0);

      // Store lag: a block's partial sum passes through kk pops of 8 cycles each after its
      // load; storing E steps later keeps the in-order vector unit from waiting on it.
      // E < blocks keeps a store ahead of the next pass's load of the same rows.
      const int64_t E = std::max<int64_t>(0, std::min<int64_t>({kw + 1, AS - 2, blocks - 1}));
      const int64_t G = epilogue_group(E);
      std::vector<Held> held;
      const int64_t items = Q * blocks;
      std::vector<std::pair<int64_t, int64_t>> pending;  // pushes of the next pass
      size_t next_push = 0;
      int64_t per_item = 0;
      std::vector<bool> epi_waited(static_cast<size_t>(std::max<int64_t>(nsub, 1)), false);
      // Buffer of output group (or wide sub-band) x: the first is the one the core's
      // last out DMA does not read.
      const int64_t op0 = (((1 - out_last[static_cast<size_t>(cur_)] - (wide_out ? 0 : t_first)) % 2) + 2) % 2;
      auto obuf = [&](int64_t x) { return (x + op0) % 2; };
      // Block i's column tile w in the last pass (sub_f: its full operands' sub-band): the
      // epilogue, and the store into the output buffer.
      auto last_block = [&](int64_t i, int64_t j2, int64_t sub_f, const Pass& ps, int64_t w, const Scratch& sc) {
        const int64_t a = 8 + (j2 % AS) * cw + w;
        emit_epilogue(
            a, ps.n0 / C + w,
            [&](const Operand& o) {
              if (o.per_row) return std::make_pair(o.vbase + i * 8 * 512, int64_t{512});
              const int64_t fs = fstride_of(o, OBb);
              if (wide_out)
                return std::make_pair(
                    o.vbase + (sub_f % 2) * Mg * fs + i * 8 * fs + (((ps.t - t_first) % FB) * cw + w) * C * esz(o.dt), fs);
              return std::make_pair(o.vbase + (((sub_f % 2) * cw + w) * Mg + i * 8) * 128 * esz(o.dt), 128 * esz(o.dt));
            },
            sc);
        if (wide_out)
          line(std::string(st(ot)) + " " + vr(a) + ", " +
               at(out_base + obuf((ps.t - t_first) / OBb) * Mg * obs + i * 8 * obs +
                  (((ps.t - t_first) % OBb) * cw + w) * orow) +
               ", stride=" + std::to_string(obs));
        else
          line(std::string(st(ot)) + " " + vr(a) + ", " + at(out_base + (obuf(ps.t) * cw + w) * Mg * orow + i * 8 * orow));
      };
      for (int64_t s = 0; s < items + D + E; ++s) {
        // mmuls of item s
        if (s < items) {
          const int64_t q = s / blocks, i = s % blocks;
          const Pass& ps = passes[static_cast<size_t>(q)];
          if (i == 0) {
            // The last column group's first pass past LHS band 0: every read of band 0
            // is behind (in program order), so the next unit of this core may fill it;
            // with two images, the unit's start (the other image's reads are behind).
            if ((lhs_double ? s == 0 : ps.t == t_end - 1 && ps.c0 == LB) && has_next) {
              lhs_band0(kLhsPrefetchFlag);
              lhs_prefetched[static_cast<size_t>(cur_)] = unit_key(next_b, next_m0);
            }
            if (q + 1 < Q) wait_pass(q + 1);
            if (q + kSlots - 1 < Q) fetched[static_cast<size_t>(q + kSlots - 1)] = fetch(q + kSlots - 1);
            pending = push_list(q + 1);
            next_push = 0;
            per_item = (static_cast<int64_t>(pending.size()) + blocks - 1) / blocks;
          }
          const int64_t lset = (s % LS) * kw;
          std::vector<LhsChunk> lcs;
          for (int64_t k = 0; k < ps.kk; ++k)
            lcs.push_back(LhsChunk{lset + k, lbase + (ps.c0 + k) / LB * lhs_band_bytes(Mg), ps.c0 + k});
          lhs_vlds(lcs, i * 8, Mg);
          for (int64_t w = 0; w < ps.cwt; ++w)
            for (int64_t k = 0; k < ps.kk; ++k) line("mmul " + mx(mxu_at(ps, i, w, k)) + ", " + vr(lset + k));
          for (int64_t x = 0; x < per_item && next_push < pending.size(); ++x) emit_push(pending[next_push++]);
          if (i == blocks - 1 && q + 1 < Q) {
            while (next_push < pending.size()) emit_push(pending[next_push++]);
            emit_swaps(q + 1);
          }
        }
        // pops of item s - D
        const int64_t j = s - D;
        if (j >= 0 && j < items) {
          const int64_t q = j / blocks, i = j % blocks;
          const Pass& ps = passes[static_cast<size_t>(q)];
          for (int64_t w = 0; w < ps.cwt; ++w) {
            const int64_t a = 8 + (j % AS) * cw + w;
            if (!ps.first) line("vld " + vr(a) + ", " + at(acc_base + (w * Mg + i * 8) * 512));
            for (int64_t k = 0; k < ps.kk; ++k)
              line(std::string(k == 0 && ps.first ? "mpop " : "mpop.add ") + vr(a) + ", " + mx(mxu_at(ps, i, w, k)));
          }
        }
        // partial-sum store or epilogue of item s - D - E
        const int64_t j2 = s - D - E;
        if (j2 >= 0 && j2 < items) {
          const int64_t q = j2 / blocks, i = j2 % blocks;
          const Pass& ps = passes[static_cast<size_t>(q)];
          const int64_t sub_f = (ps.t - t_first) / FB;  // the group's full-operand sub-band
          if (ps.last && any_full && !epi_waited[static_cast<size_t>(sub_f)]) {
            wait_flag(kEpiFlag + static_cast<int>(sub_f % 2));
            epi_waited[static_cast<size_t>(sub_f)] = true;
          }
          if (!ps.last)
            for (int64_t w = 0; w < ps.cwt; ++w)
              line("vst " + vr(8 + (j2 % AS) * cw + w) + ", " + at(acc_base + (w * Mg + i * 8) * 512));
          else
            held.push_back(
                Held{j2, [&, i, j2, sub_f, ps](int64_t w, const Scratch& sc) { last_block(i, j2, sub_f, ps, w, sc); },
                     ps.cwt});
          if (ps.last && (static_cast<int64_t>(held.size()) == G || i == blocks - 1)) flush_epilogues(held, s);
          if (ps.last && i == blocks - 1) {
            // The group's rows go out; the race checker sees a strided DMA's bounding
            // range, and neighbouring groups interleave, so the previous one is waited on.
            if (wide_out) {
              const int64_t sub = (ps.t - t_first) / OBb;  // output sub-band of the column band
              if ((ps.t - t_first) % OBb == OBb - 1 || ps.t == t_end - 1) {
                const int64_t sn0 = bn0 + sub * OBb * cw * C, cols = std::min(OBb * cw * C, bn1 - sn0);
                out_last[static_cast<size_t>(cur_)] = obuf(sub);
                if (transposed) {
                  // The sub-band before it goes out, and this one takes the image that one
                  // two before left (its store issued a sub-band ago).
                  flush_nchw();
                  int64_t& k = nchw_bands[static_cast<size_t>(cur_)];
                  if (k >= 2) wait_flag(kNchwFlag + static_cast<int>(k % 2));
                  const auto [tb, rb] = timage(k);
                  transpose_out(kXposeFlag, b, m0, mr, sn0, cols, out_base + obuf(sub) * Mg * obs, obs, tb, TS, rb);
                  nchw_pending[static_cast<size_t>(cur_)] = SubBand{b, m0, mr, sn0, cols};
                  ++k;
                } else {
                  if (out_issued[static_cast<size_t>(cur_)]++) wait_flag(kOutFlag);
                  dma_on(kOutFlag, hbm(o0 + m0 * orow_s + sn0 * eo), vmem(out_base + obuf(sub) * Mg * obs), cols * eo,
                         dim(mr, obs, orow_s));
                }
              }
            } else {
              for (int64_t w = 0; w < ps.cwt; ++w) {
                if (out_issued[static_cast<size_t>(cur_)]++) wait_flag(kOutFlag);
                out_last[static_cast<size_t>(cur_)] = obuf(ps.t);
                dma_on(kOutFlag, hbm(o0 + m0 * orow_s + (ps.n0 + w * C) * eo),
                       vmem(out_base + (obuf(ps.t) * cw + w) * Mg * orow), ncols(ps, w) * eo, dim(mr, orow, orow_s));
              }
            }
            if (any_full && ((ps.t - t_first) % FB == FB - 1 || ps.t == t_end - 1) && sub_f + 2 < nsub)
              epi_fetch(sub_f + 2);
          }
        }
      }
    }
  }
  }
  for (cur_ = 0; cur_ < cores_; ++cur_) {
    if (out_issued[static_cast<size_t>(cur_)] > 0) wait_flag(kOutFlag);
    flush_nchw();
    for (int64_t k = 0; k < std::min<int64_t>(2, nchw_bands[static_cast<size_t>(cur_)]); ++k)
      wait_flag(kNchwFlag + static_cast<int>(k));
  }
  cur_ = 0;
  transposed_stored_ = transposed;
}

}  // namespace tpusim::compiler::lowering
