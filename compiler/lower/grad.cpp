// Lowerings of the ops the training graphs' backward pass adds (compiler/train,
// docs/training.md): maxpool_grad, reverse and im2col (relu_grad is an elementwise
// stream, lower_elementwise). Each reproduces its recipe in compiler/ref/evaluate.cpp
// bit for bit.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "compiler/lower/emitter.h"

namespace tpusim::compiler::lowering {

// reverse: DMAs with negative strides on the reversed axes. Adjacent axes reversed
// alike merge into one (a conv weight's (kh, kw) is one reversed axis of KH x KW);
// a transpose folded in only changes the source's strides.
// The innermost axis is one contiguous run when it is not reversed, else element
// runs; up to three axes are a DMA's dims, the outer ones one DMA each (disjoint
// destination blocks). Element runs go through VMEM where the tensor fits (an HBM
// request each otherwise: the bundled CNN's flipped 3x3 weights, v3 batch 8,
// 22,979 -> 3,903 cycles for res3b's).
void Emitter::lower_reverse(const Node& n) {
  // The source: the operand, or, with a transpose folded in (folded_transpose_), the
  // transpose's operand read through its perm: y's axis d is the source's perm[d].
  const auto ft = folded_transpose_.find(n.id);
  const Node* tr = ft == folded_transpose_.end() ? nullptr : ft->second;
  const Placed& X = t_.at(tr ? tr->inputs[0] : n.inputs[0]);
  const size_t r0 = n.type.shape.size();
  std::vector<int64_t> src_of(r0);  // the source's element stride of each axis of y
  {
    std::vector<int64_t> xs(r0);
    for (int64_t d = static_cast<int64_t>(r0) - 1, so = 1; d >= 0; --d) {
      xs[static_cast<size_t>(d)] = so;
      so *= X.type.shape[static_cast<size_t>(d)];
    }
    for (size_t d = 0; d < r0; ++d) src_of[d] = xs[static_cast<size_t>(tr ? tr->attr_ints("perm")[d] : d)];
  }
  // Adjacent axes reversed alike and contiguous in the source merge into one.
  Shape s;
  std::vector<bool> rev;
  std::vector<int64_t> sstride;  // bytes between source elements of each merged axis
  const int64_t e = esz(n.type.dtype);
  {
    std::vector<bool> r(r0, false);
    for (int64_t a : n.attr_ints("axes")) r[static_cast<size_t>(a)] = true;
    for (size_t d = 0; d < r0; ++d) {
      if (!s.empty() && rev.back() == r[d] && src_of[d - 1] == src_of[d] * n.type.shape[d]) {
        s.back() *= n.type.shape[d];
        sstride.back() = src_of[d] * e;
        continue;
      }
      s.push_back(n.type.shape[d]);
      rev.push_back(r[d]);
      sstride.push_back(src_of[d] * e);
    }
  }
  const size_t rank = s.size();
  std::vector<int64_t> stride(rank);  // y's
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
  // Axes handled by the run: the innermost one when it is not reversed (and contiguous
  // in the source).
  const bool run_inner = !rev[rank - 1] && sstride[rank - 1] == e;
  const int64_t run = run_inner ? s[rank - 1] * e : e;
  const size_t first_dim = run_inner ? 1 : 0;  // axes counted from the innermost
  const size_t ndims = std::min<size_t>(3, rank - first_dim);
  std::string dims;
  for (size_t k = 0; k < ndims; ++k) {
    const size_t d = rank - 1 - first_dim - k;
    const int64_t src_stride = rev[d] ? -sstride[d] : sstride[d];
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
      src += (rev[d] ? s[d] - 1 - i : i) * sstride[d];
      dst += i * stride[d];
    }
    // The DMA's first element reads the last index of each reversed dim axis.
    for (size_t k = 0; k < ndims; ++k) {
      const size_t d = rank - 1 - first_dim - k;
      if (rev[d]) src += (s[d] - 1) * sstride[d];
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
// never happen. Each tap (kh, kw) of every window is gathered into its own row
// X_k[(n,c,oh,ow)] (in VMEM, a band of planes at a time, or in HBM where no band
// fits); then per 8x128 tile, in tap order, hit_k = (X_k == y) and no earlier tap
// hit, D_k = hit_k ? dy : +0.0; D_k is scattered back to its input positions.
// Positions no window covers read +0.0.
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
  const DType ot = n.type.dtype;
  const int64_t eo = esz(ot);
  const bool covered = st[0] == k[0] && st[1] == k[1] && OH * k[0] == H && OW * k[1] == W;
  // The fused relu_grad(dx, x) (relu_grad_of_pool): x_k is in a register at the select,
  // so D_k = hit_k && +0.0 < x_k ? dy : +0.0, the relu's own compare; dx is then
  // stored as the member's result. Positions no window covers are +0.0 either way.
  const bool relu = !chain_of(n).empty();
  const int64_t dx_addr = t_.at(relu ? chain_of(n).back()->output : n.output).addr;
  // Per 8x128 tile of windows: in tap order hit_k = (x_k == y) and no earlier tap
  // hit; D_k = hit_k ? dy : +0.0 (the taps at vx, KK slots `slot` apart; D_k to vd).
  auto select_taps = [&](int64_t cnt, int64_t vdy, int64_t vy, int64_t vx, int64_t vd, int64_t slot) {
    const int64_t te = kTileElems * e;  // one tile's bytes at the tensor's dtype
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
        if (relu) {
          line("vcmp.lt m4, v3, v2");
          line("mand m2, m2, m4");
        }
        line("vsel v4, m2, v0, v3");
        line(std::string(this->st(ot)) + " v4, " + at(vd + t * slot + i * te));
      }
    }
  };
  // Bands of planes in VMEM, in two buffers a core: a band's x, dy and y come in
  // while the band before is computed; its taps are gathered into KK planes of
  // windows, D_k computed there and scattered into the band's dx (+0.0 first where
  // no window covers), which goes out while the next band computes. Nothing goes
  // through HBM scratch: the taps and D_k went out and came back (the bundled CNN's
  // l1 pool gradient, v3 batch 8: 20,558 -> 10,858 cycles).
  {
    struct Layout {
      int64_t xs, dys, ys, xk, dk, dxs, slot, end;
    };
    auto layout = [&](int64_t pc) {
      Layout l{};
      const int64_t wins = align_up(pc * OH * OW, kTileElems);  // a tile's loads read whole tiles
      l.slot = align_up(wins * e, kAlign);
      l.xs = 0;
      l.dys = align_up(pc * H * W * e, kAlign);
      l.ys = l.dys + l.slot;
      l.xk = l.ys + l.slot;
      l.dk = l.xk + KK * l.slot;
      l.dxs = l.dk + KK * l.slot;
      l.end = l.dxs + align_up(pc * H * W * e, kAlign);
      return l;
    };
    int64_t pc = std::min<int64_t>({planes, 65535, (planes + 4 * cores_ - 1) / (4 * cores_)});
    while (pc > 0 && static_cast<uint64_t>(kRingSlots * layout(pc).end) > opt_.target.vmem_bytes) pc /= 2;
    if (pc > 0 && eo == e) {
      const Layout l = layout(pc);
      const int64_t nbands = (planes + pc - 1) / pc;
      auto band_planes = [&](int64_t b) { return std::min(pc, planes - b * pc); };
      // Tap (kh, kw) of window (p, oh, ow) of a band: x at ((p*H + oh*sh + kh)*W + ow*sw + kw),
      // plane t's window (p*OH + oh)*OW + ow; the scatter is the gather reversed.
      auto taps = [&](int64_t bp, bool gather) {
        std::vector<Gather> g;
        for (int64_t kh = 0; kh < k[0]; ++kh)
          for (int64_t kw = 0; kw < k[1]; ++kw) {
            const int64_t xoff = (kh * W + kw) * e, poff = (kh * k[1] + kw) * l.slot;
            if (gather)
              g.push_back(Gather{xoff, poff, e,
                                 dim(OW, st[1] * e, e) + dim(OH, st[0] * W * e, OW * e) + dim(bp, H * W * e, OH * OW * e),
                                 true});
            else  // windows do not overlap: the taps write disjoint bytes of dx
              g.push_back(Gather{poff, xoff, e,
                                 dim(OW, e, st[1] * e) + dim(OH, OW * e, st[0] * W * e) + dim(bp, OH * OW * e, H * W * e),
                                 true});
          }
        return g;
      };
      sync_all();
      // A ring of three: a band's taps are gathered while the band before is selected,
      // scattered and stored and the next two load.
      gathered_stream(
          nbands,
          [&](int64_t b, int64_t slot, int f) {
            const int64_t bp = band_planes(b), base = slot * l.end;
            dma_on(f, vmem(base + l.xs), hbm(X.addr + b * pc * H * W * e), bp * H * W * e, "");
            dma_on(f, vmem(base + l.dys), hbm(DY.addr + b * pc * OH * OW * e), bp * OH * OW * e, "");
            dma_on(f, vmem(base + l.ys), hbm(Y.addr + b * pc * OH * OW * e), bp * OH * OW * e, "");
          },
          [&](int64_t b, int64_t slot, int f) {
            const int64_t base = slot * l.end;
            run_gathers(base + l.xs, base + l.xk, taps(band_planes(b), true), f);
          },
          [&](int64_t b, int64_t slot, int f) {
            const int64_t bp = band_planes(b), base = slot * l.end;
            line("vbcast v3, 0.0");
            select_taps(bp * OH * OW, base + l.dys, base + l.ys, base + l.xk, base + l.dk, l.slot);
            if (!covered) fill_vmem(base + l.dxs, bp * H * W * e, 0.0f, ot);
            run_gathers(base + l.dk, base + l.dxs, taps(bp, false));
            dma_on(f, hbm(dx_addr + b * pc * H * W * e), vmem(base + l.dxs), bp * H * W * e, "");
          });
      sync_all();
      return;
    }
  }
  const int64_t row = align_up(T * e, kAlign);
  const int64_t XK = place_hbm(KK * row), DK = place_hbm(KK * row);
  check_addr(n, hbm_top_);
  const int64_t dx = dx_addr;
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
  for (cur_ = 0; cur_ < cores_; ++cur_) line("vbcast v3, 0.0");
  cur_ = 0;
  for (int64_t base = 0; base < T; base += chunk) {
    on_core(base / chunk);
    const int64_t cnt = std::min(chunk, T - base);
    dma(vmem(vdy), hbm(DY.addr + base * e), cnt * e);
    dma(vmem(vy), hbm(Y.addr + base * e), cnt * e);
    for (int64_t t = 0; t < KK; ++t) dma(vmem(vx + t * slot), hbm(XK + t * row + base * e), cnt * e);
    wait_dmas();
    select_taps(cnt, vdy, vy, vx, vd, slot);
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

namespace {

// Bytes of VMEM one core's share of a weight gradient needs with `nb` images a load
// (lower_conv_wgrad's layout): the masks, x's channels (8 rows a group) with a guard
// either side for the taps' displacements, dy's channels, the accumulators.
struct WGradVmem {
  int64_t masks, guard, x, x_rows, dy, acc, total;
};
WGradVmem wgrad_vmem(int64_t nb, int64_t HW, int64_t W, int64_t CI, int64_t CO, int64_t KH, int64_t KW, int64_t ex,
                     int64_t eg, int64_t phases, int64_t cores, int64_t R) {
  WGradVmem v{};
  const int64_t cig = (CI + 7) / 8, mine = (cig + cores - 1) / cores;
  v.masks = align_up(phases * KH * KW * R * 4, kAlign);
  v.guard = align_up((KH * W + KW + R) * ex, kAlign);
  v.x_rows = nb * HW * ex;
  v.x = align_up(mine * 8 * v.x_rows, kAlign) + 2 * v.guard;
  v.dy = align_up(((CO + 7) / 8 * 8 * nb * HW + R) * eg, kAlign);
  v.acc = KH * KW * mine * kTileElems * 4;
  v.total = v.masks + v.x + v.dy + 2 * v.acc + v.acc / 2;  // the bf16 result's tiles, the OIHW result
  return v;
}

}  // namespace

// The weight gradient of a stride-1 conv whose output is its input's size (the
// training recipe's dW = matmul(im2col(x, KHxKW, pads), im2col(dy, 1x1), trans_a=1),
// docs/training.md) is lowered as one kernel when the patches are read by that
// matmul alone: LHS row (kh, kw, ci) over pixel p is x's channel ci at p + (kh - pt)
// * W + (kw - pl), +0.0 where the tap falls in the padding, so each chunk of R
// pixels is one masked vld per 8 channels of x in VMEM, and the chunk's dy columns
// (mpush.t of dy's own NCHW rows) are the weights. The patches never exist: each
// was written to HBM, read back, transposed element by element and read again.
// Likewise a conv's flipped weight, reverse(transpose(W)), gathers from W at once.
void Emitter::plan_read_past(const std::map<std::string, size_t>& producer, const std::map<std::string, int>& readers,
                             const std::set<std::string>& kept) {
  const int64_t R = opt_.target.mxu_rows;
  if (R != 128 || opt_.target.mxu_cols < 8 || opt_.target.fifo_rows < 8) return;
  auto only_reader = [&](const std::string& t) { return readers.count(t) && readers.at(t) == 1 && !kept.count(t); };
  auto made_by = [&](const std::string& t) -> const Node* {
    const auto p = producer.find(t);
    return p == producer.end() ? nullptr : &g_.nodes[p->second];
  };
  auto ints_are = [](const Node& n, const char* k, int64_t v) {
    for (int64_t x : n.attr_ints(k))
      if (x != v) return false;
    return true;
  };
  for (const Node& m : g_.nodes) {
    if (m.op != OpKind::kMatmul || m.inputs.size() != 2 || fused_away(m) || !chain_of(m).empty() ||
        m.type.shape.size() != 2 || !(m.has_attr("trans_a") && m.attr_int("trans_a")) ||
        (m.has_attr("trans_b") && m.attr_int("trans_b")) || (m.has_attr("alpha") && m.attr_float("alpha") != 1.0f) ||
        (m.has_attr("beta") && m.attr_float("beta") != 1.0f) || m.inputs[0] == m.inputs[1])
      continue;
    const Node* I = made_by(m.inputs[0]);
    const Node* J = made_by(m.inputs[1]);
    if (!I || !J || I->op != OpKind::kIm2col || J->op != OpKind::kIm2col || !only_reader(I->output)) continue;
    if (!ints_are(*I, "strides", 1) || !ints_are(*I, "dilations", 1) || !ints_are(*J, "strides", 1) ||
        !ints_are(*J, "dilations", 1) || !ints_are(*J, "pads", 0) || !ints_are(*J, "kernel", 1))
      continue;
    const TensorType& xt = t_.at(I->inputs[0]).type;
    const TensorType& gt = t_.at(J->inputs[0]).type;
    const auto& k = I->attr_ints("kernel");
    const auto& pads = I->attr_ints("pads");
    if (xt.shape.size() != 4 || gt.shape.size() != 4 || k.size() != 2 || pads.size() != 4) continue;
    const int64_t N = xt.shape[0], CI = xt.shape[1], H = xt.shape[2], W = xt.shape[3], CO = gt.shape[1];
    const int64_t KH = k[0], KW = k[1];
    // The output is the input's size: a tap is one displacement of the flat pixel index.
    if (pads[0] + pads[2] != KH - 1 || pads[1] + pads[3] != KW - 1 || gt.shape[0] != N || gt.shape[2] != H ||
        gt.shape[3] != W || m.type.shape[0] != KH * KW * CI || m.type.shape[1] != CO)
      continue;
    const int64_t HW = H * W, ex = esz(xt.dtype), eg = esz(gt.dtype);
    const int64_t phases = HW / std::gcd(HW, R);
    if (phases * KH * KW * R * 4 > (int64_t{1} << 20)) continue;  // the tap masks of every chunk phase
    int64_t nb = 0;
    for (int64_t b = N; b >= 1 && !nb; --b)
      if ((b == N || (b * HW) % R == 0) &&
          static_cast<uint64_t>(wgrad_vmem(b, HW, W, CI, CO, KH, KW, ex, eg, phases, cores_, R).total) <=
              opt_.target.vmem_bytes)
        nb = b;
    if (!nb) continue;
    wgrads_[m.id] = WGrad{I->inputs[0], J->inputs[0], KH, KW, pads[0], pads[1], nb};
    read_past_.insert(I->id);
    if (only_reader(J->output)) read_past_.insert(J->id);
  }
  for (const Node& r : g_.nodes) {
    if (r.op != OpKind::kReverse || r.type.shape.size() != 4 || r.attr_ints("axes") != std::vector<int64_t>{2, 3})
      continue;
    const Node* t = made_by(r.inputs[0]);
    if (t && t->op == OpKind::kTranspose && t->attr_ints("perm") == std::vector<int64_t>{1, 0, 2, 3} &&
        only_reader(t->output)) {
      folded_transpose_[r.id] = t;
      read_past_.insert(t->id);
    }
  }
  // Such a reverse read only as a stride-1 shifted conv's weight: that conv's weight
  // layout reads the reverse's source itself (conv_weights), so the reverse is not
  // lowered. The cnn step's backward convs wrote the flipped OIHW weights to HBM and
  // then gathered them again through VMEM into the im2col layout, each pass a load, a
  // gather and a store.
  for (const Node& c : g_.nodes) {
    if (c.op != OpKind::kConv2d || c.inputs.size() < 2 || fused_away(c)) continue;
    const Node* r = made_by(c.inputs[1]);
    ShiftPlanes sp;
    if (r && r->op == OpKind::kReverse && r->type.shape.size() == 4 &&
        r->attr_ints("axes") == std::vector<int64_t>{2, 3} && only_reader(r->output) && ints_are(c, "strides", 1) &&
        ints_are(c, "dilations", 1) && (!c.has_attr("groups") || c.attr_int("groups") == 1) && shift_planes(c, &sp)) {
      flipped_weights_[c.id] = r;
      read_past_.insert(r->id);
    }
  }
}

void Emitter::lower_conv_wgrad(const Node& m) {
  const WGrad& w = wgrads_.at(m.id);
  const Placed X = t_.at(w.x), DY = t_.at(w.dy);
  const int64_t N = X.type.shape[0], CI = X.type.shape[1], H = X.type.shape[2], W = X.type.shape[3];
  const int64_t CO = DY.type.shape[1], HW = H * W, P = N * HW, KK = w.KH * w.KW;
  const int64_t R = opt_.target.mxu_rows, C = opt_.target.mxu_cols;
  const int64_t mxus = std::max<int64_t>(1, opt_.target.mxus_per_core);
  const int64_t lag = std::max<int64_t>(1, std::min<int64_t>(16, opt_.target.fifo_rows / 8) - 2);  // mmuls in flight
  const DType xt = X.type.dtype, gt = DY.type.dtype;
  const int64_t ex = esz(xt), eg = esz(gt);
  const int64_t phases = HW / std::gcd(HW, R), cig = (CI + 7) / 8, nct = (CO + C - 1) / C;
  const WGradVmem v = wgrad_vmem(w.nb, HW, W, CI, CO, w.KH, w.KW, ex, eg, phases, cores_, R);
  const int64_t vm_mask = 0, vm_x = v.masks + v.guard, vm_dy = v.masks + v.x, vm_acc = vm_dy + v.dy;
  const int64_t dw = t_.at(m.output).addr;
  const DType ot = m.type.dtype;
  const int64_t eo = esz(ot);
  // Tap t of a chunk whose first pixel is pixel `phase` of an image: lane l is valid
  // where the tap lands inside the image (the padding reads +0.0, the masked load's).
  auto valid = [&](int64_t phase, int64_t t, int64_t l) {
    const int64_t q = (phase + l) % HW, oh = q / W, ow = q % W;
    const int64_t ih = oh + t / w.KW - w.pt, iw = ow + t % w.KW - w.pl;
    return ih >= 0 && ih < H && iw >= 0 && iw < W;
  };
  std::vector<bool> full(static_cast<size_t>(phases * KK), true);  // a tap valid over a whole chunk: no mask
  for (int64_t ph = 0; ph < phases; ++ph)
    for (int64_t t = 0; t < KK; ++t)
      for (int64_t l = 0; l < R; ++l)
        if (!valid(ph * R % HW, t, l)) full[static_cast<size_t>(ph * KK + t)] = false;
  const int64_t masks = place_hbm_pinned(phases * KK * R * 4);
  check_addr(m, hbm_top_);
  layout_constant(masks, "#wgrad" + std::to_string(m.id) + "m", DType::kF32, {phases * KK, R}, [&](int64_t i) {
    return valid(i / R / KK * R % HW, i / R % KK, i % R) ? 1.0f : 0.0f;
  });
  sync_all();
  for (int core = 0; core < cores_; ++core) {
    cur_ = core;
    const int64_t g0 = cig * core / cores_, g1 = cig * (core + 1) / cores_;
    if (g0 == g1) continue;
    const int64_t c0 = 8 * g0, cn = std::min(CI, 8 * g1) - c0;
    dma(vmem(vm_mask), hbm(masks), phases * KK * R * 4);
    line("vbcast v21, 0.0");
    std::vector<std::pair<int64_t, int64_t>> groups;  // (tap, channel group), this core's accumulators in order
    for (int64_t t = 0; t < KK; ++t)
      for (int64_t g = g0; g < g1; ++g) groups.emplace_back(t, g);
    for (int64_t ct = 0; ct < nct; ++ct) {
      const int64_t col0 = ct * C, cols = std::min(C, CO - col0);
      for (int64_t n0 = 0; n0 < N; n0 += w.nb) {
        const int64_t nbg = std::min(w.nb, N - n0), Pg = w.nb * HW, pn = nbg * HW;
        // x's channels and dy's as [channel][image][pixel] rows of the group's pixels.
        dma(vmem(vm_x), hbm(X.addr + (n0 * CI + c0) * HW * ex), HW * ex,
            dim(nbg, CI * HW * ex, HW * ex) + dim(cn, HW * ex, Pg * ex));
        dma(vmem(vm_dy), hbm(DY.addr + (n0 * CO + col0) * HW * eg), HW * eg,
            dim(nbg, CO * HW * eg, HW * eg) + dim(cols, HW * eg, Pg * eg));
        wait_dmas();
        // A software pipeline over rounds of `mxus` chunks: chunk c runs on MXU c % mxus
        // with its own weights, and a round's chunks take turns mmul by mmul, so every
        // MXU multiplies while the others do (a chunk at a time, each MXU alternated
        // between its mmuls and its pops). Each LHS (v0..v7) is loaded two mmuls ahead;
        // an accumulator's round is popped into one register, its chunks in increasing c
        // (the contract's order), while at most `lag` rounds' results wait in the MXUs.
        struct Op {
          std::vector<std::string> pre, load;  // the chunk's weights (its first op), the LHS
          std::string mmul;
          int64_t mxu;
        };
        struct PopUnit {  // group i of a round: its chunks' results added into one register
          int64_t acc, last_op;
          std::vector<int64_t> mxu;
          bool first;  // the round holds the first chunk: its first pop starts the sum
        };
        std::vector<Op> ops;
        std::vector<PopUnit> units;
        const int64_t nchunks = (pn + R - 1) / R;  // chunk c starts at pixel c * R of the group
        int64_t mask_key = -1;                     // the (phase, tap) whose mask m1 holds, in op order
        for (int64_t r0 = 0; r0 < nchunks; r0 += mxus) {
          const int64_t r1 = std::min(nchunks, r0 + mxus);
          std::vector<std::vector<std::string>> pres;
          for (int64_t c = r0; c < r1; ++c) {
            const int64_t pl = c * R, p = n0 * HW + pl, kc = std::min(R, P - p);
            const std::string mx = "mxu" + std::to_string((p / R) % mxus);
            std::vector<std::string> pre;  // the chunk's dy columns are its MXU's weights (rows >= kc: none)
            for (int64_t j = 0; j * 8 < cols; ++j) {
              const std::string vg = "v" + std::to_string(30 + j % 2);
              pre.push_back(std::string(ld(gt)) + " " + vg + ", " + at(vm_dy + (j * 8 * Pg + pl) * eg) +
                            ", stride=" + std::to_string(Pg * eg));
              pre.push_back("mpush.t " + mx + ", " + vg);
            }
            pre.push_back("mswap " + mx + (kc < R ? ", k=" + std::to_string(kc) : ""));
            pres.push_back(std::move(pre));
          }
          for (size_t i = 0; i < groups.size(); ++i) {
            const int64_t t = groups[i].first, g = groups[i].second;
            PopUnit pu{vm_acc + static_cast<int64_t>(i) * kTileElems * 4, 0, {}, n0 == 0 && r0 == 0};
            for (int64_t c = r0; c < r1; ++c) {
              const int64_t pl = c * R, p = n0 * HW + pl;
              const int64_t phase_idx = (p / R) % phases;  // the chunk starts at pixel phase_idx * R % HW of an image
              const int64_t u = (p / R) % mxus;
              const bool all = full[static_cast<size_t>(phase_idx * KK + t)];
              Op op{i == 0 ? pres[static_cast<size_t>(c - r0)] : std::vector<std::string>{}, {}, "", u};
              // Tap t's mask for this chunk's phase into m1, unless the op before left it there.
              const int64_t key = phase_idx * KK + t;
              if (!all && mask_key != key) {
                op.load.push_back("vld v20, " + at(vm_mask + key * R * 4) + ", stride=0");
                op.load.push_back("vcmp.gt m1, v20, v21");
              }
              mask_key = all ? -1 : key;
              const int64_t d = (t / w.KW - w.pt) * W + (t % w.KW - w.pl);
              const std::string vl = "v" + std::to_string(ops.size() % 8);
              op.load.push_back(std::string(ld(xt)) + " " + vl + ", " + at(vm_x + ((g - g0) * 8 * Pg + pl + d) * ex) +
                                ", stride=" + std::to_string(Pg * ex) + (all ? "" : ", mask=m1"));
              op.mmul = "mmul mxu" + std::to_string(u) + ", " + vl;
              pu.mxu.push_back(u);
              pu.last_op = static_cast<int64_t>(ops.size());
              ops.push_back(std::move(op));
            }
            units.push_back(std::move(pu));
          }
        }
        // Stores of popped units, deferred so that no instruction waits on the pop before
        // it; a unit's store goes before the next load of its accumulator (VMEM accesses
        // keep program order, the scoreboard sees registers only).
        std::vector<std::pair<int64_t, std::string>> stores;  // (accumulator, vst)
        auto store_through = [&](int64_t acc) {  // the pending stores up to acc's
          const auto it = std::find_if(stores.begin(), stores.end(), [&](const auto& st) { return st.first == acc; });
          if (it == stores.end()) return;
          for (auto k = stores.begin(); k <= it; ++k) line(k->second);
          stores.erase(stores.begin(), it + 1);
        };
        size_t head = 0;
        // A batch of units' pops, chunk by chunk across the batch: a unit's later pops
        // wait for its first (one register), and an MXU's queue is in order, so one
        // unit's pops back to back held each MXU's next mmuls behind the other's pop.
        // At most kBatch units and no two of one accumulator (a round's units are the
        // groups, each once). Registers: v8..v19, v22..v29, twenty units in turn, at most
        // 3 batches' stores pending.
        const size_t kBatch = std::min<size_t>(4, groups.size());
        auto reg = [](size_t u) {
          const size_t r = u % 20;
          return "v" + std::to_string(r < 12 ? 8 + r : 22 + (r - 12));
        };
        auto pop_batch = [&](size_t n) {
          size_t most = 0;
          for (size_t b = head; b < head + n; ++b) {
            store_through(units[b].acc);
            if (!units[b].first) line("vld " + reg(b) + ", " + at(units[b].acc));
            most = std::max(most, units[b].mxu.size());
          }
          for (size_t k = 0; k < most; ++k)
            for (size_t b = head; b < head + n; ++b)
              if (k < units[b].mxu.size())
                line((units[b].first && k == 0 ? "mpop " : "mpop.add ") + reg(b) + ", mxu" +
                     std::to_string(units[b].mxu[k]));
          for (size_t b = head; b < head + n; ++b)
            stores.emplace_back(units[b].acc, "vst " + reg(b) + ", " + at(units[b].acc));
          while (stores.size() > 3 * kBatch) {
            line(stores.front().second);
            stores.erase(stores.begin());
          }
          head += n;
        };
        // Units whose mmuls have all issued by mmul j, not yet popped: an MXU holds one
        // result of each (and one of the unit in progress), `lag` at most.
        auto issued = [&](size_t j) {
          size_t n = 0;
          while (head + n < units.size() && units[head + n].last_op <= static_cast<int64_t>(j)) ++n;
          return n;
        };
        constexpr size_t kAhead = 2;
        for (size_t j = 0; j < ops.size(); ++j) {
          if (j == 0)
            for (size_t a = 0; a < std::min(kAhead, ops.size()); ++a)
              for (const std::string& l : ops[a].load) line(l);
          for (const std::string& l : ops[j].pre) line(l);
          if (j + kAhead < ops.size())
            for (const std::string& l : ops[j + kAhead].load) line(l);
          line(ops[j].mmul);
          for (size_t n = issued(j); n >= static_cast<size_t>(lag); n = issued(j)) pop_batch(std::min(kBatch, n));
        }
        while (head < units.size()) pop_batch(std::min(kBatch, units.size() - head));
        for (const auto& st : stores) line(st.second);
      }
      // Rows (t, c0 .. c0 + cn) of the result: tap t's accumulators are contiguous
      // rows; a bf16 result is rounded once, from the finished sums (vst.bf16).
      int64_t src = vm_acc, row = 4 * R;
      if (ot == DType::kBf16) {
        src = vm_acc + v.acc, row = 2 * R;
        for (size_t i = 0; i < groups.size(); ++i) {
          const std::string va = "v" + std::to_string(22 + i % 8);
          line("vld " + va + ", " + at(vm_acc + static_cast<int64_t>(i) * kTileElems * 4));
          line("vst.bf16 " + va + ", " + at(src + static_cast<int64_t>(i) * kTileElems * 2));
        }
      }
      if (w.oihw) {
        // dW[co][ci][t]: the accumulators transposed by one VMEM -> VMEM gather of
        // elements, then this core's channels of each output channel as one run.
        const int64_t stage = vm_acc + v.acc + v.acc / 2;
        dma(vmem(stage), vmem(src), eo,
            dim(KK, (g1 - g0) * 8 * row, eo) + dim(cn, row, KK * eo) + dim(cols, eo, cn * KK * eo));
        wait_dmas();
        dma(hbm(dw + (col0 * CI + c0) * KK * eo), vmem(stage), cn * KK * eo, dim(cols, cn * KK * eo, CI * KK * eo));
      } else {
        for (int64_t t = 0; t < KK; ++t)
          dma(hbm(dw + ((t * CI + c0) * CO + col0) * eo), vmem(src + t * (g1 - g0) * 8 * row), cols * eo,
              dim(cn, row, CO * eo));
      }
      wait_dmas();
    }
  }
  cur_ = 0;
}

}  // namespace tpusim::compiler::lowering
