// MXU lowerings: matmul / Gemm, and conv2d as a matmul over im2col rows.
#include "compiler/lower/emitter.h"

#include <algorithm>
#include <cmath>

namespace tpusim::compiler::lowering {

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

}  // namespace tpusim::compiler::lowering
