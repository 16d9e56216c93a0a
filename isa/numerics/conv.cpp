#include <stdexcept>
#include <string>
#include <vector>

#include "isa/numerics/conv.h"

namespace tpusim::num {

namespace {

[[noreturn]] void bad_shape(const std::string& what) { throw std::invalid_argument("conv2d: " + what); }

int out_extent(int in, int pad_lo, int pad_hi, int k, int dilation, int stride) {
  const long long span = static_cast<long long>(in) + pad_lo + pad_hi - static_cast<long long>(dilation) * (k - 1) - 1;
  return span < 0 ? 0 : static_cast<int>(span / stride + 1);
}

using MatmulFn = void (*)(const MatmulArgs&);

void conv2d_with(const Conv2dArgs& p, MatmulFn matmul) {
  const Conv2dShape& s = p.shape;
  conv2d_validate(s);
  if (p.x == nullptr || p.w == nullptr || p.y == nullptr) bad_shape("null x, w or y");
  const int oh = conv2d_out_h(s), ow = conv2d_out_w(s);
  const int cin_g = s.cin / s.groups, cout_g = s.cout / s.groups;
  const int kdim = conv2d_reduction_length(s);
  const int m = s.n * oh * ow;
  // im2col of one group: row = output pixel, column = reduction index k.
  std::vector<uint16_t> cols(static_cast<size_t>(m) * kdim);
  for (int g = 0; g < s.groups; ++g) {
    for (int b = 0; b < s.n; ++b)
      for (int oy = 0; oy < oh; ++oy)
        for (int ox = 0; ox < ow; ++ox) {
          uint16_t* row = cols.data() + (static_cast<size_t>(b * oh + oy) * ow + ox) * kdim;
          for (int ky = 0; ky < s.kh; ++ky)
            for (int kx = 0; kx < s.kw; ++kx) {
              const int iy = oy * s.stride_h - s.pad_top + ky * s.dilation_h;
              const int ix = ox * s.stride_w - s.pad_left + kx * s.dilation_w;
              const bool inside = iy >= 0 && iy < s.h && ix >= 0 && ix < s.w;
              uint16_t* dst = row + conv2d_reduction_index(s, ky, kx, 0);
              const uint16_t* src =
                  inside ? p.x + ((static_cast<size_t>(b) * s.h + iy) * s.w + ix) * s.cin + g * cin_g : nullptr;
              for (int ci = 0; ci < cin_g; ++ci) dst[ci] = inside ? src[ci] : uint16_t{0x0000};  // padding: +0.0
            }
        }
    MatmulArgs mm;
    mm.a = cols.data();
    mm.lda = kdim;
    mm.w = p.w + static_cast<size_t>(g) * cout_g;  // HWIO rows are k, columns the output channels
    mm.ldw = s.cout;
    mm.c = p.y + static_cast<size_t>(g) * cout_g;
    mm.ldc = s.cout;
    mm.m = m;
    mm.k = kdim;
    mm.n = cout_g;
    mm.rows = p.rows;
    mm.accumulate = p.accumulate;
    matmul(mm);
  }
  if (p.bias != nullptr)
    for (int i = 0; i < m; ++i)
      for (int o = 0; o < s.cout; ++o) {
        float& y = p.y[static_cast<size_t>(i) * s.cout + o];
        y = add(y, p.bias[o]);
      }
}

}  // namespace

int conv2d_out_h(const Conv2dShape& s) {
  return out_extent(s.h, s.pad_top, s.pad_bottom, s.kh, s.dilation_h, s.stride_h);
}
int conv2d_out_w(const Conv2dShape& s) {
  return out_extent(s.w, s.pad_left, s.pad_right, s.kw, s.dilation_w, s.stride_w);
}

void conv2d_validate(const Conv2dShape& s) {
  auto need = [](bool ok, const char* field, int v, const char* rule) {
    if (!ok) bad_shape(std::string(field) + "=" + std::to_string(v) + " " + rule);
  };
  need(s.n >= 1, "n", s.n, "must be at least 1");
  need(s.h >= 1, "h", s.h, "must be at least 1");
  need(s.w >= 1, "w", s.w, "must be at least 1");
  need(s.cin >= 1, "cin", s.cin, "must be at least 1");
  need(s.kh >= 1, "kh", s.kh, "must be at least 1");
  need(s.kw >= 1, "kw", s.kw, "must be at least 1");
  need(s.cout >= 1, "cout", s.cout, "must be at least 1");
  need(s.stride_h >= 1, "stride_h", s.stride_h, "must be at least 1");
  need(s.stride_w >= 1, "stride_w", s.stride_w, "must be at least 1");
  need(s.dilation_h >= 1, "dilation_h", s.dilation_h, "must be at least 1");
  need(s.dilation_w >= 1, "dilation_w", s.dilation_w, "must be at least 1");
  need(s.pad_top >= 0, "pad_top", s.pad_top, "must not be negative");
  need(s.pad_left >= 0, "pad_left", s.pad_left, "must not be negative");
  need(s.pad_bottom >= 0, "pad_bottom", s.pad_bottom, "must not be negative");
  need(s.pad_right >= 0, "pad_right", s.pad_right, "must not be negative");
  need(s.groups >= 1, "groups", s.groups, "must be at least 1");
  need(s.cin % s.groups == 0, "cin", s.cin, "is not divisible by groups");
  need(s.cout % s.groups == 0, "cout", s.cout, "is not divisible by groups");
  need(conv2d_out_h(s) >= 1, "output height", conv2d_out_h(s), "must be at least 1 (kernel larger than padded input)");
  need(conv2d_out_w(s) >= 1, "output width", conv2d_out_w(s), "must be at least 1 (kernel larger than padded input)");
}

void conv2d_reference(const Conv2dArgs& args) { conv2d_with(args, &mxu_matmul_reference); }
void conv2d(const Conv2dArgs& args) { conv2d_with(args, &mxu_matmul); }

}  // namespace tpusim::num
