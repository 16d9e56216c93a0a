// Vector unit: division/sqrt/reciprocal must be correctly rounded; each
// transcendental's error against a long double evaluation stays within the bound
// docs/numerics.md states; reductions follow the documented order, re-derived here
// independently (bit-reversed recursion instead of the halving loop).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "isa/numerics/vpu.h"
#include "test_util.h"

namespace tpusim::num {
namespace {

using test::bits_of;
using test::float_of;

// Error of y in units of the fp32 ulp at the true value r (normal range only).
long double ulp_error(float y, long double r) {
  int e;
  std::frexp(static_cast<double>(r), &e);  // r in [2^(e-1), 2^e)
  const long double ulp = std::ldexp(1.0L, e - 1 - 23);
  return std::fabs(static_cast<long double>(y) - r) / ulp;
}

struct UlpSweep {
  long double max_ulp = 0;
  uint32_t worst_input = 0;
  uint64_t checked = 0, bad_specials = 0, not_correctly_rounded = 0;
};

// Every stride-th fp32 pattern plus a dense sweep of [lo, hi]. Only finite,
// normal inputs whose true result is a normal fp32 enter the ulp statistics;
// results out of range must be the contract's Inf / signed zero.
UlpSweep sweep(const std::function<float(float)>& f, const std::function<long double(long double)>& ref, float lo,
               float hi) {
  UlpSweep s;
  auto one = [&](uint32_t u) {
    const float x = float_of(u);
    if (!std::isfinite(x) || (u & 0x7F800000u) == 0) return;
    const long double r = ref(static_cast<long double>(x));
    const float y = f(x);
    if (std::isnan(r)) {
      if (bits_of(y) != 0x7FC00000u) ++s.bad_specials;
      return;
    }
    const long double mag = std::fabs(r);
    if (mag >= 0x1.fffffep127L) {  // beyond max finite: Inf or max (rounding)
      if (!(std::isinf(y) || std::fabs(y) == 0x1.fffffep127f)) ++s.bad_specials;
      return;
    }
    if (mag < 0x1p-126L) {  // flushed (or rounded up to the smallest normal)
      if (!(y == 0.0f || std::fabs(y) == 0x1p-126f)) ++s.bad_specials;
      return;
    }
    const long double err = ulp_error(y, r);
    ++s.checked;
    if (err > 0.5L) ++s.not_correctly_rounded;
    if (err > s.max_ulp) {
      s.max_ulp = err;
      s.worst_input = u;
    }
  };
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 509 * test::kSweepStride) one(static_cast<uint32_t>(u));
  const int dense = 1'000'000 / static_cast<int>(test::kRandomScale);
  for (int i = 0; i <= dense; ++i) one(bits_of(lo + (hi - lo) * static_cast<float>(i) / dense));
  return s;
}

// The bounds docs/numerics.md documents (measured max, rounded up).
constexpr long double kTranscendentalUlpBound = 0.5001L;

void expect_within(const char* name, const UlpSweep& s, long double bound) {
  std::printf("%s: max error %.9Lf ulp at x=%a over %llu inputs, %llu not correctly rounded\n", name, s.max_ulp,
              static_cast<double>(float_of(s.worst_input)), static_cast<unsigned long long>(s.checked),
              static_cast<unsigned long long>(s.not_correctly_rounded));
  EXPECT_LE(s.max_ulp, bound) << name << " worst input 0x" << std::hex << s.worst_input;
  EXPECT_EQ(s.bad_specials, 0u) << name;
  EXPECT_GT(s.checked, 1'000'000u / test::kRandomScale) << name;
}

TEST(VpuUlp, Exp) {
  expect_within("exp", sweep([](float x) { return exp(x); }, [](long double x) { return std::exp(x); }, -87.0f, 88.0f),
                kTranscendentalUlpBound);
}
TEST(VpuUlp, Log) {
  expect_within("log", sweep([](float x) { return log(x); }, [](long double x) { return std::log(x); }, 0.5f, 2.0f),
                kTranscendentalUlpBound);
}
TEST(VpuUlp, Tanh) {
  expect_within("tanh", sweep([](float x) { return tanh(x); }, [](long double x) { return std::tanh(x); }, -10.0f, 10.0f),
                kTranscendentalUlpBound);
}
TEST(VpuUlp, Erf) {
  expect_within("erf", sweep([](float x) { return erf(x); }, [](long double x) { return std::erf(x); }, -4.0f, 4.0f),
                kTranscendentalUlpBound);
}
TEST(VpuUlp, Rsqrt) {
  expect_within("rsqrt",
                sweep([](float x) { return rsqrt(x); }, [](long double x) { return 1.0L / std::sqrt(x); }, 0.25f, 4.0f),
                kTranscendentalUlpBound);
}

TEST(VpuExact, DivSqrtRecipAreCorrectlyRounded) {
  // Correctly rounded means: equal to the double result rounded by the integer
  // routine (binary64 double rounding is innocuous for / and sqrt of binary32).
  std::mt19937_64 rng(9);
  uint64_t bad = 0;
  for (int i = 0; i < 2'000'000 / static_cast<int>(test::kRandomScale); ++i) {
    const uint64_t r = rng();
    const uint32_t a = static_cast<uint32_t>(r), b = static_cast<uint32_t>(r >> 32);
    if (test::is_nan_bits(a) || test::is_nan_bits(b)) continue;
    const double x = test::daz_to_double(a), y = test::daz_to_double(b);
    const double q = x / y, sq = std::sqrt(std::fabs(x)), rc = 1.0 / x;
    const uint32_t wq = q != q ? 0x7FC00000u : test::round_double_to_fp32_contract(q);
    const uint32_t ws = test::round_double_to_fp32_contract(sq);
    const uint32_t wr = test::round_double_to_fp32_contract(rc);
    if (bits_of(div(float_of(a), float_of(b))) != wq && bad++ < 5) ADD_FAILURE() << std::hex << "div " << a << " " << b;
    if (bits_of(sqrt(std::fabs(float_of(a)))) != ws && (a & 0x7FFFFFFFu) != 0 && bad++ < 5)
      ADD_FAILURE() << std::hex << "sqrt " << a;
    if (bits_of(recip(float_of(a))) != wr && bad++ < 5) ADD_FAILURE() << std::hex << "recip " << a;
  }
  EXPECT_EQ(bad, 0u);
}

TEST(VpuSpecials, NanInfZeroRules) {
  EXPECT_EQ(bits_of(sqrt(-1.0f)), 0x7FC00000u);
  EXPECT_EQ(bits_of(sqrt(-0.0f)), 0x80000000u);
  EXPECT_EQ(bits_of(log(-1.0f)), 0x7FC00000u);
  EXPECT_EQ(bits_of(log(0.0f)), 0xFF800000u);
  EXPECT_EQ(bits_of(log(float_of(0x00000010u))), 0xFF800000u);  // DAZ: log(0)
  EXPECT_EQ(bits_of(exp(-200.0f)), 0u);                           // flushed
  EXPECT_EQ(bits_of(exp(100.0f)), 0x7F800000u);
  EXPECT_EQ(bits_of(recip(-0.0f)), 0xFF800000u);
  EXPECT_EQ(bits_of(rsqrt(0.0f)), 0x7F800000u);
  EXPECT_EQ(bits_of(div(0.0f, 0.0f)), 0x7FC00000u);
  EXPECT_EQ(bits_of(neg(float_of(0x7FC00001u))), 0x7FC00000u);
  EXPECT_EQ(bits_of(neg(float_of(0x00000001u))), 0x80000000u);  // -(+subnormal read as +0)
  EXPECT_EQ(bits_of(abs(-0.0f)), 0u);
  EXPECT_EQ(bits_of(tanh(float_of(0x80000001u))), 0x80000000u);
  EXPECT_EQ(bits_of(erf(-INFINITY)), 0xBF800000u);
}

// ---------------------------------------------------------------------------
// Reductions against an independent re-derivation of the documented order.
float model_combine(ReduceOp op, float a, float b) {
  // Independent of fp32.h: the contract's add/max/min written from the doubles.
  const uint32_t ua = bits_of(a), ub = bits_of(b);
  if (test::is_nan_bits(ua) || test::is_nan_bits(ub)) return float_of(0x7FC00000u);
  const double x = test::daz_to_double(ua), y = test::daz_to_double(ub);
  switch (op) {
    case ReduceOp::kSum: {
      const double s = x + y;
      return float_of(s != s ? 0x7FC00000u : test::round_double_to_fp32_contract(s));
    }
    case ReduceOp::kMax:
      if (x == y) return float_of(bits_of(static_cast<float>(x)) & bits_of(static_cast<float>(y)));
      return static_cast<float>(x > y ? x : y);
    case ReduceOp::kMin:
      if (x == y) return float_of(bits_of(static_cast<float>(x)) | bits_of(static_cast<float>(y)));
      return static_cast<float>(x < y ? x : y);
  }
  return 0;
}

// The halving tree read as a recursion: the result combines the elements at even
// positions (of the current stride) with those at odd positions.
float model_tree(ReduceOp op, const std::vector<float>& v, size_t offset, size_t stride, size_t count) {
  if (count == 1) return v[offset];
  return model_combine(op, model_tree(op, v, offset, 2 * stride, count / 2),
                       model_tree(op, v, offset + stride, 2 * stride, count / 2));
}

float model_identity(ReduceOp op) {
  return op == ReduceOp::kSum ? 0.0f : op == ReduceOp::kMax ? -INFINITY : INFINITY;
}

// reduce_row: lane l folds x[l], x[128 + l], ... in increasing tile order (the
// last tile padded with the identity), then the 128 lanes go through the tree.
float model_row(ReduceOp op, const std::vector<float>& x, size_t width) {
  const size_t tiles = x.empty() ? 1 : (x.size() + width - 1) / width;
  std::vector<float> lanes(width);
  for (size_t l = 0; l < width; ++l) {
    float acc = l < x.size() ? x[l] : model_identity(op);
    for (size_t t = 1; t < tiles; ++t) {
      const size_t i = t * width + l;
      acc = model_combine(op, acc, i < x.size() ? x[i] : model_identity(op));
    }
    lanes[l] = acc;
  }
  return model_tree(op, lanes, 0, 1, width);
}

std::vector<float> reduction_data(std::mt19937_64& rng, size_t n, int flavour) {
  std::vector<float> v(n);
  for (auto& x : v) {
    const uint64_t r = rng();
    switch (flavour) {
      case 0: x = float_of(static_cast<uint32_t>((r & 0x80000000u) | ((100 + r % 50) << 23) | (r >> 40 & 0x7FFFFF))); break;
      case 1: x = (r & 1 ? 1.0f : -1.0f) * (r & 2 ? 16777216.0f : 1.0f); break;      // cancellation
      case 2: x = float_of(r % 5 == 0 ? 0x80000000u : r % 5 == 1 ? 0x00000007u : 0x80000000u | 0x00800000u); break;
      default: x = float_of(static_cast<uint32_t>(r)); break;  // anything: NaN, Inf, subnormal
    }
  }
  return v;
}

TEST(VpuReduce, LanesSublanesRowColumnMatchTheDocumentedOrder) {
  std::mt19937_64 rng(77);
  uint64_t bad = 0;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin})
    for (int flavour = 0; flavour < 4; ++flavour) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{8}, size_t{9}, size_t{127}, size_t{128}, size_t{129},
                       size_t{300}, size_t{1000}}) {
        const std::vector<float> x = reduction_data(rng, n, flavour);
        const float row = reduce_row(op, x.data(), n);
        if (bits_of(row) != bits_of(model_row(op, x, kLanes)) && bad++ < 5)
          ADD_FAILURE() << "reduce_row op " << static_cast<int>(op) << " n=" << n << " flavour " << flavour;
        // Column: the same values with a stride of 3.
        std::vector<float> strided(std::max<size_t>(1, 3 * n), 99.0f);
        for (size_t i = 0; i < n; ++i) strided[3 * i] = x[i];
        const float col = reduce_column(op, strided.data(), n, 3);
        if (bits_of(col) != bits_of(model_row(op, x, kSublanes)) && bad++ < 5)
          ADD_FAILURE() << "reduce_column op " << static_cast<int>(op) << " n=" << n << " flavour " << flavour;
      }
      const std::vector<float> lanes = reduction_data(rng, kLanes, flavour);
      if (bits_of(reduce_lanes(op, lanes.data())) != bits_of(model_tree(op, lanes, 0, 1, kLanes)) && bad++ < 5)
        ADD_FAILURE() << "reduce_lanes";
      const std::vector<float> subl = reduction_data(rng, kSublanes, flavour);
      if (bits_of(reduce_sublanes(op, subl.data())) != bits_of(model_tree(op, subl, 0, 1, kSublanes)) && bad++ < 5)
        ADD_FAILURE() << "reduce_sublanes";
    }
  EXPECT_EQ(bad, 0u);
}

TEST(VpuReduce, OrderIsNotSequential) {
  // 2^24 in lane 0, ones everywhere else, n = 129 (tile 2 holds one more 1 in lane
  // 0). fp32 spacing at 2^24 is 2, so 2^24 + 1 ties back to 2^24.
  //  tile fold: lane 0 = 2^24 + 1 = 2^24; lanes 1..127 = 1.
  //  tree w=64: v0 = 2^24 + 1 = 2^24 (lost); w=32..1 add 2, 4, 8, 16, 32, 64 exactly.
  //  result 2^24 + 126. A sequential sum loses every 1: 2^24.
  std::vector<float> x(129, 1.0f);
  x[0] = 16777216.0f;
  EXPECT_EQ(reduce_row(ReduceOp::kSum, x.data(), x.size()), 16777216.0f + 126.0f);
  float seq = 0;
  for (float v : x) seq = add(seq, v);
  EXPECT_EQ(seq, 16777216.0f);
}

TEST(VpuReduce, SumOfNegativeZerosIsNegativeZeroOnlyWithoutPadding) {
  std::vector<float> z(256, -0.0f);
  EXPECT_EQ(bits_of(reduce_row(ReduceOp::kSum, z.data(), 256)), 0x80000000u);
  EXPECT_EQ(bits_of(reduce_row(ReduceOp::kSum, z.data(), 200)), 0u);  // +0.0 padding
}

}  // namespace
}  // namespace tpusim::num
