// Convolution: conv2d_reference against an independent naive convolution that
// walks (kh, kw, cin) directly and rounds with test_util.h's integer routine; the
// fast conv2d against the reference; the precision-policy helpers.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "isa/numerics/conv.h"
#include "isa/numerics/precision.h"
#include "test_util.h"

namespace tpusim::num {
namespace {

using test::bits_of;
using test::float_of;

double val(uint32_t f) { return test::is_nan_bits(f) ? NAN : test::daz_to_double(f); }
uint32_t rnd(double x) { return x != x ? 0x7FC00000u : test::round_double_to_fp32_contract(x); }
uint32_t add_bits(uint32_t a, uint32_t b) { return rnd(val(a) + val(b)); }
double bf(uint16_t h) { return val(static_cast<uint32_t>(h) << 16); }

// Direct convolution: for each output, the taps in (ky, kx, ci) order, padding
// taps as +0.0 activations, chunks of R with all R rows of the last chunk.
std::vector<uint32_t> naive_conv(const Conv2dShape& s, const std::vector<uint16_t>& x, const std::vector<uint16_t>& w,
                                 const std::vector<float>& y0, const std::vector<float>* bias, int rows, bool acc) {
  const int oh = (s.h + s.pad_top + s.pad_bottom - s.dilation_h * (s.kh - 1) - 1) / s.stride_h + 1;
  const int ow = (s.w + s.pad_left + s.pad_right - s.dilation_w * (s.kw - 1) - 1) / s.stride_w + 1;
  const int cig = s.cin / s.groups, cog = s.cout / s.groups;
  std::vector<uint32_t> out(y0.size());
  for (int b = 0; b < s.n; ++b)
    for (int oy = 0; oy < oh; ++oy)
      for (int ox = 0; ox < ow; ++ox)
        for (int o = 0; o < s.cout; ++o) {
          const int g = o / cog;
          std::vector<uint32_t> products;
          for (int ky = 0; ky < s.kh; ++ky)
            for (int kx = 0; kx < s.kw; ++kx)
              for (int ci = 0; ci < cig; ++ci) {
                const int iy = oy * s.stride_h + ky * s.dilation_h - s.pad_top;
                const int ix = ox * s.stride_w + kx * s.dilation_w - s.pad_left;
                uint16_t xa = 0x0000;
                if (iy >= 0 && iy < s.h && ix >= 0 && ix < s.w)
                  xa = x[((static_cast<size_t>(b) * s.h + iy) * s.w + ix) * s.cin + g * cig + ci];
                const uint16_t wv = w[((static_cast<size_t>(ky) * s.kw + kx) * cig + ci) * s.cout + o];
                products.push_back(rnd(bf(xa) * bf(wv)));
              }
          const size_t idx = ((static_cast<size_t>(b) * oh + oy) * ow + ox) * s.cout + o;
          uint32_t result = acc ? rnd(val(bits_of(y0[idx]))) : 0u;
          const size_t chunks = (products.size() + rows - 1) / rows;
          for (size_t c = 0; c < chunks; ++c) {
            uint32_t sum = 0;
            for (int r = 0; r < rows; ++r) {
              const size_t k = c * rows + r;
              sum = add_bits(sum, k < products.size() ? products[k] : 0u);
            }
            result = (c == 0 && !acc) ? sum : add_bits(acc && c == 0 ? bits_of(y0[idx]) : result, sum);
          }
          if (bias) result = add_bits(result, bits_of((*bias)[o]));
          out[idx] = result;
        }
  return out;
}

struct Case {
  Conv2dShape s;
  int rows;
};

uint16_t rand_bf16(std::mt19937_64& rng, bool specials) {
  const uint64_t r = rng();
  if (specials && r % 23 == 0) {
    static const uint16_t v[] = {0x0000, 0x8000, 0x7F80, 0x0001, 0x7FC1, 0xFF80, 0x7F7F, 0x0080};
    return v[(r >> 8) % 8];
  }
  return static_cast<uint16_t>((r & 0x8000) | ((120 + r % 12) << 7) | ((r >> 16) & 0x7F));
}

class Conv : public ::testing::TestWithParam<bool> {};  // param: with special values

TEST_P(Conv, ReferenceAndFastMatchNaiveConvolution) {
  const Case cases[] = {
      {{1, 5, 5, 3, 3, 3, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 8},   // same padding
      {{2, 7, 6, 4, 3, 2, 6, 2, 1, 0, 1, 2, 0, 1, 1, 1}, 8},   // strides, asymmetric padding
      {{1, 9, 9, 2, 3, 3, 2, 1, 2, 2, 2, 2, 2, 2, 2, 1}, 4},   // dilation
      {{1, 6, 6, 8, 3, 3, 4, 1, 1, 1, 1, 1, 1, 1, 1, 2}, 8},   // groups
      {{1, 5, 5, 6, 3, 3, 6, 1, 1, 1, 1, 1, 1, 1, 1, 6}, 128}, // depthwise
      {{1, 4, 4, 40, 2, 2, 5, 2, 2, 0, 0, 0, 0, 1, 1, 1}, 32}, // K = 160 = 5 chunks of 32
      {{1, 3, 3, 1, 3, 3, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1}, 5},   // mostly padding
  };
  std::mt19937_64 rng(GetParam() ? 5 : 6);
  int index = 0;
  for (const Case& c : cases)
    for (bool acc : {false, true})
      for (bool with_bias : {false, true}) {
        const Conv2dShape& s = c.s;
        const int oh = conv2d_out_h(s), ow = conv2d_out_w(s);
        std::vector<uint16_t> x(static_cast<size_t>(s.n) * s.h * s.w * s.cin);
        std::vector<uint16_t> w(static_cast<size_t>(s.kh) * s.kw * (s.cin / s.groups) * s.cout);
        std::vector<float> y0(static_cast<size_t>(s.n) * oh * ow * s.cout), bias(s.cout);
        for (auto& v : x) v = rand_bf16(rng, GetParam());
        for (auto& v : w) v = rand_bf16(rng, GetParam());
        for (auto& v : y0) v = static_cast<float>(static_cast<int>(rng() % 200) - 100) * 0.125f;
        for (auto& v : bias) v = static_cast<float>(static_cast<int>(rng() % 50) - 25) * 0.5f;
        const auto want = naive_conv(s, x, w, y0, with_bias ? &bias : nullptr, c.rows, acc);
        for (bool fast : {false, true}) {
          std::vector<float> y = y0;
          Conv2dArgs args;
          args.shape = s;
          args.x = x.data();
          args.w = w.data();
          args.y = y.data();
          args.bias = with_bias ? bias.data() : nullptr;
          args.rows = c.rows;
          args.accumulate = acc;
          if (fast)
            conv2d(args);
          else
            conv2d_reference(args);
          for (size_t i = 0; i < y.size(); ++i)
            ASSERT_EQ(bits_of(y[i]), want[i]) << "case " << index << (fast ? " fast" : " reference") << " acc=" << acc
                                              << " bias=" << with_bias << " element " << i;
        }
        ++index;
      }
}

INSTANTIATE_TEST_SUITE_P(Data, Conv, ::testing::Bool());

TEST(Conv, PaddingTapIsAProductWithTheWeightsSign) {
  // One output over taps x0, x1 and one right-padding tap, R = K = 3 (no short
  // chunk): s = ((0 + -1.5*2^-126) + 2^-126) = -2^-127 -> flushed to -0.0; then the
  // padding product +0.0 * w2 is -0.0 when w2 < 0 (sum stays -0.0) and +0.0 when
  // w2 > 0 (sum becomes +0.0). Skipping the tap would give -0.0 for both.
  Conv2dShape s;
  s.h = 1;
  s.w = 2;
  s.kw = 3;
  s.pad_right = 1;
  const uint16_t x[2] = {0xBFC0, 0x3F80};
  for (uint16_t w2 : {uint16_t{0xBF80}, uint16_t{0x3F80}}) {
    const uint16_t w[3] = {0x0080, 0x0080, w2};
    float y = 3.0f;
    Conv2dArgs args;
    args.shape = s;
    args.x = x;
    args.w = w;
    args.y = &y;
    args.rows = 3;
    conv2d_reference(args);
    EXPECT_EQ(bits_of(y), w2 == 0xBF80 ? 0x80000000u : 0u);
    y = 3.0f;
    conv2d(args);
    EXPECT_EQ(bits_of(y), w2 == 0xBF80 ? 0x80000000u : 0u);
  }
}

TEST(ConvShape, ReductionIndexIsCinFastest) {
  Conv2dShape s;
  s.kh = 3;
  s.kw = 2;
  s.cin = 8;
  s.groups = 2;
  EXPECT_EQ(conv2d_reduction_length(s), 3 * 2 * 4);
  EXPECT_EQ(conv2d_reduction_index(s, 0, 0, 1), 1);
  EXPECT_EQ(conv2d_reduction_index(s, 0, 1, 0), 4);
  EXPECT_EQ(conv2d_reduction_index(s, 2, 1, 3), (2 * 2 + 1) * 4 + 3);
}

TEST(ConvShape, RejectsBadShapesWithTheFieldName) {
  auto message = [](Conv2dShape s) {
    try {
      conv2d_validate(s);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Conv2dShape s;
  s.cin = 6;
  s.groups = 4;
  EXPECT_NE(message(s).find("groups"), std::string::npos) << message(s);
  s = Conv2dShape{};
  s.stride_w = 0;
  EXPECT_NE(message(s).find("stride_w"), std::string::npos) << message(s);
  s = Conv2dShape{};
  s.kh = 5;  // 1-high input, no padding
  EXPECT_NE(message(s).find("output height"), std::string::npos) << message(s);
  s = Conv2dShape{};
  s.pad_left = -1;
  EXPECT_NE(message(s).find("pad_left"), std::string::npos) << message(s);
}

TEST(Precision, PolicyHelpers) {
  EXPECT_EQ(parse_precision_policy("default"), PrecisionPolicy::kDefault);
  EXPECT_EQ(parse_precision_policy("bf16"), PrecisionPolicy::kBf16);
  EXPECT_FALSE(parse_precision_policy("fp16").has_value());
  EXPECT_STREQ(precision_policy_name(PrecisionPolicy::kBf16), "bf16");
  EXPECT_STREQ(precision_policy_name(PrecisionPolicy::kDefault), "default");
  EXPECT_EQ(tensor_storage_bytes(PrecisionPolicy::kDefault), 4);
  EXPECT_EQ(tensor_storage_bytes(PrecisionPolicy::kBf16), 2);
  // 1 + 2^-8 + 2^-19: just above the bf16 halfway point, rounds up under bf16.
  const float x = float_of(0x3F808010u);
  EXPECT_EQ(bits_of(stored_value(PrecisionPolicy::kDefault, x)), 0x3F808010u);
  EXPECT_EQ(bits_of(stored_value(PrecisionPolicy::kBf16, x)), 0x3F810000u);
  EXPECT_EQ(stored_bits(PrecisionPolicy::kBf16, x), 0x3F81u);
  EXPECT_EQ(stored_bits(PrecisionPolicy::kDefault, float_of(0x80000001u)), 0x80000000u);  // FTZ on store
  EXPECT_EQ(bits_of(stored_value(PrecisionPolicy::kBf16, float_of(0xFFC00001u))), 0x7FC00000u);
  for (PrecisionPolicy p : {PrecisionPolicy::kDefault, PrecisionPolicy::kBf16})
    for (uint32_t u : {0x3F808010u, 0x80000001u, 0xFFC00001u, 0x7F7FFFFFu, 0xC0490FDBu})
      EXPECT_EQ(bits_of(loaded_value(p, stored_bits(p, float_of(u)))), bits_of(stored_value(p, float_of(u))))
          << precision_policy_name(p) << " " << std::hex << u;
  EXPECT_EQ(bits_of(loaded_value(PrecisionPolicy::kBf16, 0x7F7Fu)), 0x7F7F0000u);
  EXPECT_EQ(mxu_operand(x), 0x3F81u);
  EXPECT_EQ(mxu_operand(stored_value(PrecisionPolicy::kBf16, x)), 0x3F81u);  // exact once stored as bf16
}

}  // namespace
}  // namespace tpusim::num
