// Lowerings of the ops the training graphs' backward pass adds (compiler/train,
// docs/training.md): relu_grad, maxpool_grad, reverse and im2col. Each reproduces
// its recipe in compiler/ref/evaluate.cpp bit for bit.
#include <algorithm>
#include <cmath>

#include "compiler/lower/emitter.h"

namespace tpusim::compiler::lowering {

// relu_grad(dy, x) = x > +0.0 ? dy : +0.0: chunks of up to 16 8x128 tiles are
// DMA'd in (one DMA per operand, so the transfer latency is paid once per chunk),
// each tile `vcmp.lt` + `vsel`, and the chunk DMA'd out. vsel moves dy's stored
// bits unchanged, so the store rounding of an already stored value is exact under
// both policies. A ragged last tile computes on stale VMEM lanes that are never
// stored back.
void Emitter::lower_relu_grad(const Node& n) {
  const Placed& DY = t_.at(n.inputs[0]);
  const Placed& X = t_.at(n.inputs[1]);
  const int64_t total = num_elements(n.type.shape);
  const DType dt = DY.type.dtype, xt = X.type.dtype, ot = n.type.dtype;
  const int64_t dst = t_.at(n.output).addr;
  constexpr int64_t kTiles = 16, kChunk = kTiles * kTileElems, kTileBytes = kTileElems * 4;
  constexpr int64_t kDy = 0, kX = kTiles * kTileBytes, kOut = 2 * kTiles * kTileBytes;
  sync_all();
  for (cur_ = 0; cur_ < cores_; ++cur_) line("vbcast v3, 0.0");
  cur_ = 0;
  for (int64_t base = 0; base < total; base += kChunk) {
    on_core(base / kChunk);
    const int64_t cnt = std::min(kChunk, total - base);
    // Tiles are dense in VMEM at their dtype's size (vld/vst.bf16 read 2-byte lanes).
    dma(vmem(kDy), hbm(DY.addr + base * esz(dt)), cnt * esz(dt));
    dma(vmem(kX), hbm(X.addr + base * esz(xt)), cnt * esz(xt));
    wait_dmas();
    for (int64_t t = 0; t * kTileElems < cnt; ++t) {
      line(std::string(ld(dt)) + " v0, " + at(kDy + t * kTileElems * esz(dt)));
      line(std::string(ld(xt)) + " v1, " + at(kX + t * kTileElems * esz(xt)));
      line("vcmp.lt m1, v3, v1");
      line("vsel v2, m1, v0, v3");
      line(std::string(st(ot)) + " v2, " + at(kOut + t * kTileElems * esz(ot)));
    }
    dma(hbm(dst + base * esz(ot)), vmem(kOut), cnt * esz(ot));
    wait_dmas();
  }
}

// reverse: DMAs with negative strides on the reversed axes. Adjacent axes reversed
// alike merge into one (a conv weight's (kh, kw) is one reversed axis of KH x KW).
// The innermost axis is one contiguous run when it is not reversed, else element
// runs; up to three axes are a DMA's dims, the outer ones one DMA each (disjoint
// destination blocks). Element runs go through VMEM where the tensor fits (an HBM
// request each otherwise: the bundled CNN's flipped 3x3 weights, v3 batch 8,
// 22,979 -> 3,903 cycles for res3b's).
void Emitter::lower_reverse(const Node& n) {
  const Placed& X = t_.at(n.inputs[0]);
  Shape s;
  std::vector<bool> rev;
  {
    std::vector<bool> r(n.type.shape.size(), false);
    for (int64_t a : n.attr_ints("axes")) r[static_cast<size_t>(a)] = true;
    for (size_t d = 0; d < r.size(); ++d) {
      if (!s.empty() && rev.back() == r[d]) {
        s.back() *= n.type.shape[d];
        continue;
      }
      s.push_back(n.type.shape[d]);
      rev.push_back(r[d]);
    }
  }
  const int64_t e = esz(n.type.dtype);
  const size_t rank = s.size();
  std::vector<int64_t> stride(rank);
  for (int64_t d = static_cast<int64_t>(rank) - 1, so = e; d >= 0; --d) {
    stride[static_cast<size_t>(d)] = so;
    so *= s[static_cast<size_t>(d)];
  }
  const int64_t y = t_.at(n.output).addr;
  if (rank == 0 || num_elements(s) == 0) {
    dma(hbm(y), hbm(X.addr), e);
    wait_dmas();
    return;
  }
  // Axes handled by the run: the innermost one when it is not reversed.
  const bool run_inner = !rev[rank - 1];
  const int64_t run = run_inner ? s[rank - 1] * e : e;
  const size_t first_dim = run_inner ? 1 : 0;  // axes counted from the innermost
  const size_t ndims = std::min<size_t>(3, rank - first_dim);
  std::string dims;
  for (size_t k = 0; k < ndims; ++k) {
    const size_t d = rank - 1 - first_dim - k;
    const int64_t src_stride = rev[d] ? -stride[d] : stride[d];
    if (s[d] > 65535) fail(n, "an axis longer than 65535 is not lowered for reverse");
    dims += dim(s[d], src_stride, stride[d]);
  }
  const size_t outer_axes = rank - first_dim - ndims;
  const int64_t outer = num_elements(Shape(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(outer_axes)));
  const int64_t bytes = num_elements(s) * e;
  constexpr int64_t kMaxGathers = 16;  // VMEM -> VMEM copies of ~400 cycles each
  const bool staged = run < kStagedRunsBelow && outer <= kMaxGathers && staging_fits(bytes, bytes);
  std::vector<Gather> gathers;
  for (int64_t o = 0; o < outer; ++o) {
    int64_t rem = o, src = X.addr, dst = y;
    for (size_t d = outer_axes; d-- > 0;) {
      const int64_t i = rem % s[d];
      rem /= s[d];
      src += (rev[d] ? s[d] - 1 - i : i) * stride[d];
      dst += i * stride[d];
    }
    // The DMA's first element reads the last index of each reversed dim axis.
    for (size_t k = 0; k < ndims; ++k) {
      const size_t d = rank - 1 - first_dim - k;
      if (rev[d]) src += (s[d] - 1) * stride[d];
    }
    if (staged) gathers.push_back(Gather{src - X.addr, dst - y, run, dims});
    else dma(hbm(dst), hbm(src), run, dims);
  }
  if (staged) staged_gather(X.addr, bytes, y, bytes, gathers, false, 0.0f, n.type.dtype);
  else wait_dmas();
}

// im2col: x is first staged in NHWC order (one DMA per image, element runs), so
// that every tap (kh, kw) is then one 3-D DMA over (ow, oh, n) whose runs are a
// pixel's C channels, instead of single elements; with a 1x1 window, stride 1 and
// no padding the staged NHWC tensor is the result itself. Padding taps are never
// written, so they read +0.0 from the result, zero-filled first if its HBM is reused.
void Emitter::lower_im2col(const Node& n) {
  const Placed X = t_.at(n.inputs[0]);
  const auto& k = n.attr_ints("kernel");
  const auto& st = n.attr_ints("strides");
  const auto& pads = n.attr_ints("pads");
  const auto& dil = n.attr_ints("dilations");
  const int64_t NB = X.type.shape[0], CI = X.type.shape[1], H = X.type.shape[2], W = X.type.shape[3];
  const int64_t OH = (H + pads[0] + pads[2] - dil[0] * (k[0] - 1) - 1) / st[0] + 1;
  const int64_t OW = (W + pads[1] + pads[3] - dil[1] * (k[1] - 1) - 1) / st[1] + 1;
  const int64_t K = k[0] * k[1] * CI;
  const int64_t ex = esz(X.type.dtype);
  const int64_t P = t_.at(n.output).addr;
  if (OW > 65535 || OH > 65535 || CI > 65535 || H > 65535 || W > 65535 || NB > 65535)
    fail(n, "an extent beyond 65535 is not lowered for im2col");
  const bool pointwise = k[0] == 1 && k[1] == 1 && st[0] == 1 && st[1] == 1 && !pads[0] && !pads[1] && !pads[2] && !pads[3];
  const int64_t S = pointwise ? P : place_hbm(NB * H * W * CI * ex);
  check_addr(n, hbm_top_);
  // The taps' runs are a pixel's CI channels: short ones (the 3-channel input's 12
  // bytes) go through VMEM where the NHWC image and the rows fit, each tap a gather
  // of its own columns (they run at once), the padding +0.0 from the fill (the
  // bundled CNN's patches at v3 batch 8: the input's 15,465 -> 5,797 cycles).
  const bool any_pad = pads[0] || pads[1] || pads[2] || pads[3];
  const int64_t sbytes = NB * H * W * CI * ex, pbytes = NB * OH * OW * K * ex;
  const bool staged_taps = !pointwise && CI * ex < kStagedRunsBelow && staging_fits(sbytes, pbytes);
  if (any_pad && !staged_taps) zero_if_reused(P, pbytes, X.type.dtype);
  // NCHW -> NHWC: runs of one element, which in HBM cost a memory request each, so
  // through VMEM (a VMEM -> VMEM gather costs per byte) in blocks of whole images
  // where they fit (the bundled CNN's step, v3, batch 8: the gradient's 1x1 rows of
  // l1 447,120 -> 4,606 cycles, prep's 3x3 patches 178,627 -> 24,958).
  const int64_t img = CI * H * W * ex;
  const std::string nhwc = dim(CI, H * W * ex, ex) + dim(W, ex, CI * ex) + dim(H, W * ex, W * CI * ex);
  int64_t per = NB;
  while (per > 0 && !staging_fits(per * img, per * img)) per /= 2;
  if (per > 0 && CI > 1) {
    for (int64_t b0 = 0; b0 < NB; b0 += per) {
      const int64_t nb = std::min(per, NB - b0);
      std::vector<Gather> images;  // one each: a DMA takes at most 3 dims
      for (int64_t b = 0; b < nb; ++b) images.push_back(Gather{b * img, b * img, ex, nhwc});
      staged_gather(X.addr + b0 * img, nb * img, S + b0 * img, nb * img, images, false, 0.0f, X.type.dtype);
    }
  } else {
    for (int64_t b = 0; b < NB; ++b) dma(hbm(S + b * img), hbm(X.addr + b * img), ex, nhwc);
    wait_dmas();
  }
  if (pointwise) return;
  std::vector<Gather> taps;
  for (int64_t kh = 0; kh < k[0]; ++kh)
    for (int64_t kw = 0; kw < k[1]; ++kw) {
      int64_t oh0, oh1, ow0, ow1;
      tap_range(OH, H, st[0], pads[0], kh * dil[0], &oh0, &oh1);
      tap_range(OW, W, st[1], pads[1], kw * dil[1], &ow0, &ow1);
      if (oh0 >= oh1 || ow0 >= ow1) continue;
      const int64_t ih = oh0 * st[0] - pads[0] + kh * dil[0], iw = ow0 * st[1] - pads[1] + kw * dil[1];
      const int64_t src = S + (ih * W + iw) * CI * ex;
      const int64_t dst = P + ((oh0 * OW + ow0) * K + (kh * k[1] + kw) * CI) * ex;
      const std::string dims = dim(ow1 - ow0, st[1] * CI * ex, K * ex) +
                               dim(oh1 - oh0, st[0] * W * CI * ex, OW * K * ex) +
                               dim(NB, H * W * CI * ex, OH * OW * K * ex);
      if (staged_taps) {
        taps.push_back(Gather{src - S, dst - P, CI * ex, dims, true});
        continue;
      }
      dma(hbm(dst), hbm(src), CI * ex, dims);
      wait_dmas();  // the taps' bounding ranges interleave (race checker)
    }
  if (staged_taps) staged_gather(S, sbytes, P, pbytes, taps, any_pad, 0.0f, X.type.dtype);
}

// maxpool_grad(dy, x, y) for windows that do not overlap (stride >= kernel) and no
// padding, so every input position is in at most one window and the recipe's adds
// never happen. Each tap (kh, kw) of every window is gathered into its own HBM row
// X_k[(n,c,oh,ow)]; then per 8x128 tile, in tap order, hit_k = (X_k == y) and no
// earlier tap hit, D_k = hit_k ? dy : +0.0; D_k is scattered back to its input
// positions. Positions no window covers are never written: +0.0.
void Emitter::lower_maxpool_grad(const Node& n) {
  const Placed DY = t_.at(n.inputs[0]);
  const Placed X = t_.at(n.inputs[1]);
  const Placed Y = t_.at(n.inputs[2]);
  const auto& k = n.attr_ints("kernel");
  const auto& st = n.attr_ints("strides");
  const auto& pads = n.attr_ints("pads");
  if (pads[0] || pads[1] || pads[2] || pads[3] || st[0] < k[0] || st[1] < k[1])
    fail(n, "maxpool_grad is lowered for non-overlapping windows without padding only");
  const int64_t planes = X.type.shape[0] * X.type.shape[1], H = X.type.shape[2], W = X.type.shape[3];
  const int64_t OH = DY.type.shape[2], OW = DY.type.shape[3], KK = k[0] * k[1];
  const int64_t T = planes * OH * OW;
  const DType dt = X.type.dtype;
  const int64_t e = esz(dt);
  if (OH > 65535 || OW > 65535) fail(n, "an extent beyond 65535 is not lowered for maxpool_grad");
  if (static_cast<uint64_t>((2 + 2 * KK) * kTileElems * 4) > opt_.target.vmem_bytes) fail(n, "window too large for VMEM");
  const int64_t row = align_up(T * e, kAlign);
  const int64_t XK = place_hbm(KK * row), DK = place_hbm(KK * row);
  check_addr(n, hbm_top_);
  const int64_t dx = t_.at(n.output).addr;
  if (st[0] != k[0] || st[1] != k[1] || OH * k[0] != H || OW * k[1] != W)
    zero_if_reused(dx, planes * H * W * esz(n.type.dtype), n.type.dtype);  // positions no window covers
  // Tap (kh, kw) of window (p, oh, ow) <-> X_k[(p*OH + oh)*OW + ow], planes [p0, p0 +
  // pc): the gather's runs from x (offsets in x) to the tap rows (offsets in XK), or
  // the scatter's from the tap rows (DK) back to dx's geometry (x's).
  auto tap = [&](bool gather, int64_t kh, int64_t kw, int64_t p0, int64_t pc) {
    const int64_t xoff = ((p0 * H + kh) * W + kw) * e, roff = (kh * k[1] + kw) * row + p0 * OH * OW * e;
    if (gather)
      return Gather{xoff, roff, e,
                    dim(OW, st[1] * e, e) + dim(OH, st[0] * W * e, OW * e) + dim(pc, H * W * e, OH * OW * e)};
    return Gather{roff, xoff, e,
                  dim(OW, e, st[1] * e) + dim(OH, OW * e, st[0] * W * e) + dim(pc, OH * OW * e, H * W * e)};
  };
  // In HBM: planes in groups of at most 65535 (a DMA dim's count).
  auto tap_dmas = [&](bool gather, int64_t kh, int64_t kw) {
    for (int64_t p0 = 0; p0 < planes; p0 += 65535) {
      const Gather g = tap(gather, kh, kw, p0, std::min<int64_t>(65535, planes - p0));
      if (gather) dma(hbm(XK + g.dst_off), hbm(X.addr + g.src_off), e, g.dims);
      else dma(hbm(dx + g.dst_off), hbm(DK + g.src_off), e, g.dims);
      wait_dmas();  // bounding ranges of neighbouring taps interleave (race checker)
    }
  };
  // The taps' runs are one element: where x and the taps fit, through VMEM, whose
  // gathers cost per byte (the bundled CNN's l1 pool: 79,970 -> 21,006 cycles), the scatter
  // onto a +0.0-filled image (positions no window covers).
  const int64_t xbytes = planes * H * W * e;
  const bool staged = planes <= 65535 && staging_fits(xbytes, KK * row) && staging_fits(KK * row, xbytes);
  auto tap_gathers = [&](bool gather) {
    std::vector<Gather> g;
    for (int64_t kh = 0; kh < k[0]; ++kh)
      for (int64_t kw = 0; kw < k[1]; ++kw) g.push_back(tap(gather, kh, kw, 0, planes));
    return g;
  };
  if (staged) {
    staged_gather(X.addr, xbytes, XK, KK * row, tap_gathers(true), false, 0.0f, dt);
  } else {
    for (int64_t kh = 0; kh < k[0]; ++kh)
      for (int64_t kw = 0; kw < k[1]; ++kw) tap_dmas(true, kh, kw);
  }
  sync_all();
  // Chunks of up to 16 tiles per DMA (the transfer latency once per chunk); VMEM
  // slots of a chunk per operand: dy, y, the KK taps in, the KK results out.
  const int64_t tiles = std::max<int64_t>(1, std::min<int64_t>(16, static_cast<int64_t>(opt_.target.vmem_bytes) /
                                                                       ((2 + 2 * KK) * kTileElems * 4)));
  const int64_t chunk = tiles * kTileElems, slot = chunk * 4;
  const int64_t vdy = 0, vy = slot, vx = 2 * slot, vd = vx + KK * slot;
  const int64_t te = kTileElems * e;  // one tile's bytes at the tensor's dtype
  for (cur_ = 0; cur_ < cores_; ++cur_) line("vbcast v3, 0.0");
  cur_ = 0;
  for (int64_t base = 0; base < T; base += chunk) {
    on_core(base / chunk);
    const int64_t cnt = std::min(chunk, T - base);
    dma(vmem(vdy), hbm(DY.addr + base * e), cnt * e);
    dma(vmem(vy), hbm(Y.addr + base * e), cnt * e);
    for (int64_t t = 0; t < KK; ++t) dma(vmem(vx + t * slot), hbm(XK + t * row + base * e), cnt * e);
    wait_dmas();
    for (int64_t i = 0; i * kTileElems < cnt; ++i) {
      line(std::string(ld(dt)) + " v0, " + at(vdy + i * te));
      line(std::string(ld(dt)) + " v1, " + at(vy + i * te));
      line("vmask m1, 0, 0");  // taps already hit: none
      for (int64_t t = 0; t < KK; ++t) {
        line(std::string(ld(dt)) + " v2, " + at(vx + t * slot + i * te));
        line("vcmp.eq m2, v2, v1");
        line("mnot m3, m1");
        line("mand m2, m2, m3");
        line("mor m1, m1, m2");
        line("vsel v4, m2, v0, v3");
        line(std::string(this->st(n.type.dtype)) + " v4, " + at(vd + t * slot + i * te));
      }
    }
    for (int64_t t = 0; t < KK; ++t) dma(hbm(DK + t * row + base * e), vmem(vd + t * slot), cnt * e);
    wait_dmas();
  }
  sync_all();
  if (staged) {
    staged_gather(DK, KK * row, dx, planes * H * W * esz(n.type.dtype), tap_gathers(false), true, 0.0f, n.type.dtype);
    return;
  }
  for (int64_t kh = 0; kh < k[0]; ++kh)
    for (int64_t kw = 0; kw < k[1]; ++kw) tap_dmas(false, kh, kw);
}

}  // namespace tpusim::compiler::lowering
