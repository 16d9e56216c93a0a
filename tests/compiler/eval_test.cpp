// The graph reference against independent formulations of the contract: the MXU
// chunk order written out by hand, closed forms, signed-zero and NaN rules, the
// bf16 policy as "round the default result", and input errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "compiler/compiler.h"
#include "isa/numerics/bf16.h"
#include "isa/numerics/vpu.h"

namespace tpusim::compiler {
namespace {

using num::PrecisionPolicy;

HostTensor tensor(const Shape& s, std::vector<float> v) {
  HostTensor t;
  t.shape = s;
  t.f = std::move(v);
  return t;
}

std::vector<float> random_values(size_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::string hex_list(const std::vector<float>& v) {
  std::string s = "[";
  for (size_t k = 0; k < v.size(); ++k) {
    uint32_t u;
    std::memcpy(&u, &v[k], 4);
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", u);
    s += (k ? ", " : "") + std::string(buf);
  }
  return s + "]";
}

// out[i][j] per shared/spec/numerics.md "MXU", written independently of isa/:
// bf16 operands, chunks of R in increasing k from +0.0, chunk sums combined in order.
float mxu_dot(const std::vector<float>& a, const std::vector<float>& w, int i, int j, int k, int n, int rows) {
  float acc = 0.0f;
  for (int c = 0; c * rows < k; ++c) {
    float s = 0.0f;
    for (int kk = c * rows; kk < std::min(k, (c + 1) * rows); ++kk) {
      const volatile float p = num::round_to_bf16(a[i * k + kk]) * num::round_to_bf16(w[kk * n + j]);
      s = s + p;
    }
    acc = c == 0 ? s : acc + s;
  }
  return acc;
}

TEST(GraphReference, MatmulFollowsTheChunkOrder) {
  const int m = 5, k = 300, n = 7;
  const auto a = random_values(m * k, 11), w = random_values(k * n, 12);
  const std::string text = "graph mm {\n  input %a : f32[5,300]\n  const %w : f32[300,7] = " + hex_list(w) +
                           "\n  %y = matmul(%a, %w) : f32[5,7] #0\n  output %y\n}\n";
  const Graph g = parse_graph(text);
  for (int rows : {128, 4, 300}) {
    EvalOptions opt;
    opt.mxu_rows = rows;
    const auto y = evaluate(g, {{"a", tensor({m, k}, a)}}, PrecisionPolicy::kDefault, opt).at("y").f;
    int differs_from_128 = 0;
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        EXPECT_EQ(y[i * n + j], mxu_dot(a, w, i, j, k, n, rows)) << "rows " << rows << " at " << i << "," << j;
        differs_from_128 += y[i * n + j] != mxu_dot(a, w, i, j, k, n, 128);
      }
    if (rows != 128) {
      EXPECT_GT(differs_from_128, 0) << "R=" << rows << " should change some sums";
    }
  }
}

TEST(GraphReference, GemmAlphaBetaBiasOrder) {
  // (alpha * acc) + (beta * C), bias added last: alpha * (acc + beta * C) would give 25165836.
  const char* text = R"(graph g {
  input %a : f32[1,2]
  const %b : f32[2,1] = [0x3f800000, 0x3f800000]
  const %c : f32[1] = [0x4b800001]
  %y = matmul(%a, %b, %c) {alpha=3.0, beta=0.5} : f32[1,1] #0
  output %y
}
)";
  // acc = 1 + 2 = 3 (bf16-exact); alpha*acc = 9; beta*C = 0.5 * 16777218 = 8388609; sum = 8388618.
  const auto y = evaluate(parse_graph(text), {{"a", tensor({1, 2}, {1.0f, 2.0f})}}, PrecisionPolicy::kDefault).at("y").f;
  EXPECT_EQ(y[0], 8388618.0f);
}

TEST(GraphReference, DepthwiseConvDirectSum) {
  const char* text = R"(graph c {
  input %x : f32[1,2,4,5]
  input %w : f32[2,1,3,3]
  %y = conv2d(%x, %w) {dilations=[1,2], groups=2, pads=[1,2,0,1], strides=[2,1]} : f32[1,2,2,4] #0
  output %y
}
)";
  std::vector<float> x(40), w(18);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
  const auto y = evaluate(parse_graph(text), {{"x", tensor({1, 2, 4, 5}, x)}, {"w", tensor({2, 1, 3, 3}, w)}}, PrecisionPolicy::kDefault).at("y").f;
  for (int c = 0; c < 2; ++c)
    for (int oh = 0; oh < 2; ++oh)
      for (int ow = 0; ow < 4; ++ow) {
        float s = 0;
        for (int i = 0; i < 3; ++i)
          for (int j = 0; j < 3; ++j) {
            const int h = oh * 2 - 1 + i, ww = ow - 2 + 2 * j;
            if (h >= 0 && h < 4 && ww >= 0 && ww < 5) s += x[(c * 4 + h) * 5 + ww] * w[(c * 3 + i) * 3 + j];
          }
        EXPECT_EQ(y[(c * 2 + oh) * 4 + ow], s) << c << "," << oh << "," << ow;
      }
}

TEST(GraphReference, SignedZeroAndNaNRules) {
  const char* text = R"(graph z {
  input %x : f32[4]
  %r = relu(%x) : f32[4] #0
  %n = neg(%x) : f32[4] #1
  %c = clip(%x) {max=1.0, min=-1.0} : f32[4] #2
  output %r
  output %n
  output %c
}
)";
  const float nan = std::nanf("");
  const auto out = evaluate(parse_graph(text), {{"x", tensor({4}, {-0.0f, -2.0f, nan, 1e-40f})}}, PrecisionPolicy::kDefault);
  const auto bits = [](float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; };
  EXPECT_EQ(bits(out.at("r").f[0]), 0u);           // max(-0, +0) = +0
  EXPECT_EQ(bits(out.at("r").f[2]), 0x7FC00000u);  // NaN in, canonical NaN out
  EXPECT_EQ(bits(out.at("r").f[3]), 0u);           // subnormal input read as zero
  EXPECT_EQ(bits(out.at("n").f[0]), 0u);           // -(-0) = +0
  EXPECT_EQ(bits(out.at("n").f[3]), 0x80000000u);  // -(+0 after DAZ) = -0
  EXPECT_EQ(out.at("c").f[1], -1.0f);
  EXPECT_EQ(bits(out.at("c").f[2]), 0x7FC00000u);
}

TEST(GraphReference, Bf16PolicyRoundsEveryStoredTensor) {
  const char* text = R"(graph p {
  input %a : f32[3,40]
  input %b : f32[40,6]
  %y = matmul(%a, %b) : f32[3,6] #0
  %s = sigmoid(%y) : f32[3,6] #1
  output %y
  output %s
}
)";
  auto a = random_values(120, 5), b = random_values(240, 6);
  for (float& v : a) v = num::round_to_bf16(v);
  for (float& v : b) v = num::round_to_bf16(v);
  const Graph g = parse_graph(text);
  const std::map<std::string, HostTensor> in = {{"a", tensor({3, 40}, a)}, {"b", tensor({40, 6}, b)}};
  const auto d = evaluate(g, in, PrecisionPolicy::kDefault), h = evaluate(g, in, PrecisionPolicy::kBf16);
  EXPECT_EQ(h.at("y").dtype, DType::kBf16);
  for (size_t k = 0; k < 18; ++k) {
    // The MXU sees the same bf16 operands under both policies; only the store differs.
    EXPECT_EQ(h.at("y").f[k], num::round_to_bf16(d.at("y").f[k]));
    // sigmoid reads the bf16-stored y under `bf16`.
    const float yb = h.at("y").f[k];
    EXPECT_EQ(h.at("s").f[k], num::round_to_bf16(num::div(1.0f, num::add(1.0f, num::exp(num::neg(yb))))));
  }
}

TEST(GraphReference, SoftmaxAndMeansClosedForms) {
  const char* text = R"(graph s {
  input %x : f32[2,300]
  %sm = softmax(%x) {axis=1} : f32[2,300] #0
  %mean = reduce_mean(%x) {axes=[1], keepdims=0} : f32[2] #1
  %mx = reduce_max(%x) {axes=[0], keepdims=1} : f32[1,300] #2
  output %sm
  output %mean
  output %mx
}
)";
  std::vector<float> x(600);
  for (int i = 0; i < 300; ++i) {
    x[i] = 1.5f;                                   // uniform row: softmax is exactly 1/300 after rounding
    x[300 + i] = static_cast<float>(i % 3) - 1.0f; // mean 0 exactly
  }
  const auto out = evaluate(parse_graph(text), {{"x", tensor({2, 300}, x)}}, PrecisionPolicy::kDefault);
  for (int i = 0; i < 300; ++i) EXPECT_EQ(out.at("sm").f[i], 1.0f / 300.0f);
  double sum = 0;
  for (int i = 300; i < 600; ++i) sum += out.at("sm").f[i];
  EXPECT_NEAR(sum, 1.0, 1e-6);
  EXPECT_EQ(out.at("mean").f[0], 1.5f);
  EXPECT_EQ(out.at("mean").f[1], 0.0f);
  for (int i = 0; i < 300; ++i) EXPECT_EQ(out.at("mx").f[i], std::max(1.5f, x[300 + i]));
}

TEST(GraphReference, AveragePoolPaddingCount) {
  const char* text = R"(graph a {
  input %x : f32[1,1,2,2]
  %e = avgpool(%x) {count_include_pad=0, kernel=[3,3], pads=[1,1,1,1], strides=[1,1]} : f32[1,1,2,2] #0
  %i = avgpool(%x) {count_include_pad=1, kernel=[3,3], pads=[1,1,1,1], strides=[1,1]} : f32[1,1,2,2] #1
  %m = maxpool(%x) {kernel=[3,3], pads=[1,1,1,1], strides=[1,1]} : f32[1,1,2,2] #2
  output %e
  output %i
  output %m
}
)";
  const auto out = evaluate(parse_graph(text), {{"x", tensor({1, 1, 2, 2}, {-1.0f, -2.0f, -3.0f, -6.0f})}}, PrecisionPolicy::kDefault);
  EXPECT_EQ(out.at("e").f[0], -3.0f);            // 4 valid taps
  EXPECT_EQ(out.at("i").f[0], -12.0f / 9.0f);    // 9 taps, 5 of them padding
  EXPECT_EQ(out.at("m").f[0], -1.0f);            // padding never wins a max
}

TEST(GraphReference, DataMovement) {
  const char* text = R"(graph d {
  input %x : f32[2,3]
  input %i : i64[2]
  %t = transpose(%x) {perm=[1,0]} : f32[3,2] #0
  %s = slice(%x) {ends=[2,3], starts=[0,1], steps=[1,2]} : f32[2,1] #1
  %p = pad(%x) {pads=[0,1,1,0], value=9.0} : f32[3,4] #2
  %c = concat(%x, %x) {axis=1} : f32[2,6] #3
  %g = gather(%x, %i) {axis=1} : f32[2,2] #4
  output %t
  output %s
  output %p
  output %c
  output %g
}
)";
  HostTensor idx;
  idx.dtype = DType::kI64;
  idx.shape = {2};
  idx.i = {2, -3};
  const auto out = evaluate(parse_graph(text), {{"x", tensor({2, 3}, {1, 2, 3, 4, 5, 6})}, {"i", idx}}, PrecisionPolicy::kDefault);
  EXPECT_EQ(out.at("t").f, (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(out.at("s").f, (std::vector<float>{2, 5}));
  EXPECT_EQ(out.at("p").f, (std::vector<float>{9, 1, 2, 3, 9, 4, 5, 6, 9, 9, 9, 9}));
  EXPECT_EQ(out.at("c").f, (std::vector<float>{1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6}));
  EXPECT_EQ(out.at("g").f, (std::vector<float>{3, 1, 6, 4}));
  idx.i = {3, 0};
  try {
    evaluate(parse_graph(text), {{"x", tensor({2, 3}, {1, 2, 3, 4, 5, 6})}, {"i", idx}}, PrecisionPolicy::kDefault);
    FAIL();
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("index 3 out of range [0,3)"), std::string::npos) << e.what();
  }
}

TEST(GraphReference, InputErrors) {
  const Graph g = parse_graph("graph e {\n  input %x : f32[2,3]\n  %y = relu(%x) : f32[2,3] #0\n  output %y\n}\n");
  try {
    evaluate(g, {}, PrecisionPolicy::kDefault);
    FAIL();
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("input 'x' (f32[2,3]) is missing"), std::string::npos) << e.what();
  }
  try {
    evaluate(g, {{"x", tensor({3, 2}, std::vector<float>(6))}}, PrecisionPolicy::kDefault);
    FAIL();
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("has shape [3,2], the graph expects [2,3]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tpusim::compiler
