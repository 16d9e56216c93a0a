// The MXU: an independent brute-force model of the contract checks the scalar
// reference on small cases, and every code path of the fast kernel must equal the
// reference bit for bit on random and adversarial data.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "isa/numerics/mxu.h"
#include "isa/numerics/mxu_paths.h"
#include "test_util.h"

namespace tpusim::num {
namespace {

using test::bits_of;
using test::float_of;

// ---------------------------------------------------------------------------
// Independent model: values as double, every rounding by the integer routine.
// Products of bf16 are exact in double; a sum of two fp32 values is exact in
// double unless their exponents are far apart, and then rounding the double sum
// (53 bits) to fp32 is still the correctly rounded fp32 sum.
double model_value(uint32_t f) {
  if (test::is_nan_bits(f)) return NAN;
  return test::daz_to_double(f);
}

uint32_t model_round(double x) { return x != x ? 0x7FC00000u : test::round_double_to_fp32_contract(x); }

double bf16_model(uint16_t h) { return model_value(static_cast<uint32_t>(h) << 16); }

uint32_t model_add(uint32_t a, uint32_t b) { return model_round(model_value(a) + model_value(b)); }

uint32_t model_product(uint16_t a, uint16_t w) { return model_round(bf16_model(a) * bf16_model(w)); }

struct Problem {
  int m, k, n, rows;
  bool accumulate;
  size_t lda, ldw, ldc;
  std::vector<uint16_t> a, w;
  std::vector<float> c0;  // initial C (accumulator input), ldc layout
  MatmulArgs args(float* c) const {
    MatmulArgs p;
    p.a = a.data();
    p.lda = lda;
    p.w = w.data();
    p.ldw = ldw;
    p.c = c;
    p.ldc = ldc;
    p.m = m;
    p.k = k;
    p.n = n;
    p.rows = rows;
    p.accumulate = accumulate;
    return p;
  }
};

// The contract written out a second time, differently: explicit per-row products
// including the padded +0.0 rows of the last chunk (all R of them), integer rounding.
std::vector<uint32_t> brute_force(const Problem& q) {
  std::vector<uint32_t> out(q.c0.size());
  for (size_t i = 0; i < q.c0.size(); ++i) out[i] = bits_of(q.c0[i]);
  const int chunks = (q.k + q.rows - 1) / q.rows;
  for (int i = 0; i < q.m; ++i)
    for (int j = 0; j < q.n; ++j) {
      std::vector<uint32_t> sums;
      for (int c = 0; c < chunks; ++c) {
        uint32_t s = 0;  // +0.0
        for (int r = 0; r < q.rows; ++r) {
          const int k = c * q.rows + r;
          const uint32_t p = k < q.k ? model_product(q.a[i * q.lda + k], q.w[k * q.ldw + j]) : 0u;
          s = model_add(s, p);
        }
        sums.push_back(s);
      }
      uint32_t acc;
      size_t first;
      if (q.accumulate) {
        acc = bits_of(q.c0[i * q.ldc + j]);
        first = 0;
        if (sums.empty()) acc = model_round(model_value(acc));
      } else {
        acc = sums.empty() ? 0u : sums[0];
        first = 1;
      }
      for (size_t c = first; c < sums.size(); ++c) acc = model_add(acc, sums[c]);
      out[i * q.ldc + j] = acc;
    }
  return out;
}

// ---------------------------------------------------------------------------
// Data generators.
enum class Data { kRandom, kCancel, kSpecial, kTiny, kHuge, kNegZeroFlush };

uint16_t random_bf16(std::mt19937_64& rng, Data d) {
  const uint64_t r = rng();
  switch (d) {
    case Data::kRandom:  // magnitudes 2^-8 .. 2^8, both signs
      return static_cast<uint16_t>((r & 0x8000) | ((119 + r % 17) << 7) | ((r >> 8) & 0x7F));
    case Data::kCancel: {  // few distinct values, both signs: long runs cancel exactly
      static const uint16_t v[] = {0x3F80, 0xBF80, 0x4000, 0xC000, 0x3F00, 0xBF00, 0x4B80, 0xCB80};
      return v[r % 8];
    }
    case Data::kSpecial: {
      static const uint16_t v[] = {0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x0001, 0x807F,
                                   0x3F80, 0xBF80, 0x7F7F, 0xFF7F, 0x0080, 0x8080};
      return (r >> 8) % 3 ? static_cast<uint16_t>((r & 0x8000) | ((120 + r % 15) << 7)) : v[r % 14];
    }
    case Data::kTiny:  // products near and below 2^-126, sums near the flush boundary
      return static_cast<uint16_t>((r & 0x8000) | ((60 + r % 8) << 7) | ((r >> 8) & 0x7F));
    case Data::kHuge:  // products that overflow, sums that overflow
      return static_cast<uint16_t>((r & 0x8000) | ((186 + r % 8) << 7) | ((r >> 8) & 0x7F));
    case Data::kNegZeroFlush:  // 2^-63-ish operands: products ~2^-126, sums cancel into subnormals
      return static_cast<uint16_t>((r & 0x8000) | ((63 + r % 2) << 7) | ((r >> 8) & 0x3));
  }
  return 0;
}

Problem make_problem(uint64_t seed, int m, int k, int n, int rows, bool accumulate, Data d, int pad = 0) {
  std::mt19937_64 rng(seed);
  Problem q{m, k, n, rows, accumulate, static_cast<size_t>(k + pad), static_cast<size_t>(n + 2 * pad),
            static_cast<size_t>(n + 3 * pad), {}, {}, {}};
  q.a.resize(std::max<size_t>(1, m * q.lda));
  q.w.resize(std::max<size_t>(1, k * q.ldw));
  q.c0.resize(std::max<size_t>(1, m * q.ldc));
  for (auto& v : q.a) v = random_bf16(rng, d);
  for (auto& v : q.w) v = random_bf16(rng, d);
  for (auto& v : q.c0) {
    const uint64_t r = rng();
    // Accumulator inputs: ordinary values plus the odd subnormal, -0.0, NaN payload.
    v = r % 16 == 0 ? float_of(0x80000003u) : r % 16 == 1 ? -0.0f : r % 16 == 2 ? float_of(0xFF812345u)
                                                                     : float_of(0x3F800000u ^ static_cast<uint32_t>(r & 0x807FFFFF));
  }
  return q;
}

std::vector<uint32_t> run_reference(const Problem& q) {
  std::vector<float> c = q.c0;
  mxu_matmul_reference(q.args(c.data()));
  std::vector<uint32_t> out(c.size());
  for (size_t i = 0; i < c.size(); ++i) out[i] = bits_of(c[i]);
  return out;
}

std::vector<uint32_t> run_path(MxuPath path, const Problem& q) {
  std::vector<float> c = q.c0;
  mxu_matmul_with(path, q.args(c.data()));
  std::vector<uint32_t> out(c.size());
  for (size_t i = 0; i < c.size(); ++i) out[i] = bits_of(c[i]);
  return out;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

::testing::AssertionResult same_bits(const std::vector<uint32_t>& got, const std::vector<uint32_t>& want,
                                     const Problem& q) {
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i])
      return ::testing::AssertionFailure()
             << "m=" << q.m << " k=" << q.k << " n=" << q.n << " R=" << q.rows << " acc=" << q.accumulate
             << " lda=" << q.lda << ": element " << i << " (row " << i / q.ldc << ", col " << i % q.ldc
             << ") got " << hex32(got[i]) << " want " << hex32(want[i]);
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------
// The reference against the independent brute-force model.
TEST(MxuReference, MatchesBruteForceModel) {
  uint64_t seed = 1;
  for (Data d : {Data::kRandom, Data::kCancel, Data::kSpecial, Data::kTiny, Data::kHuge, Data::kNegZeroFlush})
    for (int rows : {1, 3, 8})
      for (int k : {0, 1, 2, 3, 7, 8, 9, 17, 24})
        for (bool acc : {false, true}) {
          const Problem q = make_problem(seed++, 3, k, 5, rows, acc, d, 1);
          ASSERT_TRUE(same_bits(run_reference(q), brute_force(q), q));
        }
}

TEST(MxuReference, ChunkOrderIsObservable) {
  // Products 2^24, 1, 1, -2^24 (fp32 spacing at 2^24 is 2, so 2^24 + 1 ties to 2^24).
  //  R=4: (((0 + 2^24) + 1) + 1) - 2^24 = 0.
  //  R=2: s0 = 2^24 + 1 = 2^24, s1 = 1 - 2^24 (exact); s0 + s1 = 1.
  //  R=1: every product is a chunk, combined in order: same as R=4, 0.
  const uint16_t a[4] = {0x4B80, 0x3F80, 0x3F80, 0xCB80};
  const uint16_t w[4] = {0x3F80, 0x3F80, 0x3F80, 0x3F80};
  auto run = [&](int rows) {
    float c = 7.0f;
    MatmulArgs p{a, 4, w, 1, &c, 1, 1, 4, 1, rows, false};
    mxu_matmul_reference(p);
    return bits_of(c);
  };
  EXPECT_EQ(run(4), 0u);
  EXPECT_EQ(run(2), 0x3F800000u);
  EXPECT_EQ(run(1), 0u);
}

TEST(MxuReference, RejectsMalformedArguments) {
  uint16_t a = 0, w = 0;
  float c = 0;
  MatmulArgs p{&a, 1, &w, 1, &c, 1, 1, 1, 1, 0, false};
  EXPECT_THROW(mxu_matmul_reference(p), std::invalid_argument);  // rows = 0
  p.rows = 128;
  p.k = -1;
  EXPECT_THROW(mxu_matmul_reference(p), std::invalid_argument);
  p.k = 2;  // lda = 1 < k
  try {
    mxu_matmul_reference(p);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("lda"), std::string::npos) << e.what();
  }
  for (MxuPath path : kAllMxuPaths)
    if (mxu_path_supported(path)) {
      EXPECT_THROW(mxu_matmul_with(path, p), std::invalid_argument);
    }
}

// ---------------------------------------------------------------------------
// Fast kernel == reference, every path.
struct Shape {
  int m, k, n, rows;
};

class MxuFastPath : public ::testing::TestWithParam<MxuPath> {
 protected:
  void SetUp() override {
    if (!mxu_path_supported(GetParam())) GTEST_SKIP() << mxu_path_name(GetParam()) << " not supported on this CPU";
  }
  void check(const Problem& q) { ASSERT_TRUE(same_bits(run_path(GetParam(), q), run_reference(q), q)); }
};

TEST_P(MxuFastPath, AdversarialShapes) {
  // K = 1, K < R, K = R, K not a multiple of R, several R; M/N not multiples of
  // any vector width or tile; padded leading dimensions.
  const Shape shapes[] = {{1, 1, 1, 8},     {3, 1, 17, 128},  {5, 7, 33, 8},    {9, 8, 31, 8},
                          {17, 9, 65, 8},   {7, 32, 16, 32},  {13, 33, 47, 32},  {8, 100, 32, 32},
                          {25, 127, 19, 128}, {6, 128, 48, 128}, {11, 129, 70, 128}, {2, 300, 130, 128},
                          {33, 257, 97, 8}, {1, 700, 3, 100}, {19, 64, 600, 32},
                          {5, 9, 40, 1},    {4, 10, 35, 3}};
  uint64_t seed = 100;
  for (const Shape& s : shapes)
    for (Data d : {Data::kRandom, Data::kCancel, Data::kSpecial, Data::kTiny, Data::kHuge, Data::kNegZeroFlush})
      for (bool acc : {false, true})
        for (int pad : {0, 3}) check(make_problem(seed++, s.m, s.k, s.n, s.rows, acc, d, pad));
}

TEST_P(MxuFastPath, KZeroAndEmpty) {
  for (bool acc : {false, true}) {
    check(make_problem(7, 4, 0, 5, 128, acc, Data::kRandom));
    check(make_problem(8, 0, 3, 5, 128, acc, Data::kRandom));
    check(make_problem(9, 4, 3, 0, 128, acc, Data::kRandom));
  }
}

TEST_P(MxuFastPath, LargeRandomAcrossCacheBlocks) {
  // Crosses the kernel's K (256), N (512) and M (192) blocks with ragged edges.
  check(make_problem(11, 200, 530, 530, 128, false, Data::kRandom));
  check(make_problem(12, 197, 300, 515, 128, true, Data::kCancel, 5));
  check(make_problem(13, 64, 1000, 40, 300, true, Data::kRandom));  // R larger than the K block target
}

TEST_P(MxuFastPath, NegativeZeroSumsAndPadding) {
  // One chunk whose sum flushes to -0.0: (-1.5 * 2^-126) + 2^-126 = -2^-127 -> -0.
  // K = R: no padding, result -0.0. K < R: the padded +0.0 rows turn it into +0.0.
  const uint16_t a[2] = {0xBFC0, 0x3F80};  // -1.5, 1
  const uint16_t w[2] = {0x0080, 0x0080};  // 2^-126
  for (int rows : {2, 4}) {
    Problem q{1, 2, 1, rows, false, 2, 1, 1, {a, a + 2}, {w, w + 2}, {5.0f}};
    const auto want = run_reference(q);
    EXPECT_EQ(want[0], rows == 2 ? 0x80000000u : 0u);
    check(q);
  }
}

TEST_P(MxuFastPath, LeavesTheCallersMxcsrAlone) {
  // A product whose exact value is subnormal-range must flush inside the kernel
  // and leave the caller's floating-point environment (gradual underflow) as it was.
  check(make_problem(21, 9, 40, 40, 8, false, Data::kTiny));
  volatile float tiny = float_of(0x00800000u);
  volatile float half = 0.5f;
  EXPECT_EQ(bits_of(tiny * half), 0x00400000u);  // still gradual underflow out here
}

// Weights packed once, A given as fp32 operands: the same bits as the reference on
// the same shapes and data, and the packed W reused for a second, different A.
TEST_P(MxuFastPath, PackedWeightsMatchReference) {
  const Shape shapes[] = {{8, 128, 128, 128}, {128, 128, 128, 128}, {1, 1, 1, 8}, {3, 1, 17, 128}, {5, 7, 33, 8},
                          {9, 8, 31, 8},      {17, 9, 65, 8},       {13, 33, 47, 32}, {25, 127, 19, 128},
                          {11, 129, 70, 128}, {2, 300, 130, 128},   {33, 257, 97, 8}, {1, 700, 3, 100},
                          {19, 64, 600, 32},  {4, 10, 35, 3}};
  uint64_t seed = 500;
  for (const Shape& s : shapes)
    for (Data d : {Data::kRandom, Data::kCancel, Data::kSpecial, Data::kTiny, Data::kHuge, Data::kNegZeroFlush})
      for (bool acc : {false, true})
        for (int pad : {0, 3}) {
          const Problem q = make_problem(seed++, s.m, s.k, s.n, s.rows, acc, d, pad);
          MxuPackedWeights w;
          mxu_pack_weights_with(GetParam(), w, q.w.data(), q.ldw, q.k, q.n, q.rows);
          for (int round = 0; round < 2; ++round) {
            Problem qa = q;
            if (round == 1) qa.a = make_problem(seed++, s.m, s.k, s.n, s.rows, acc, d, pad).a;
            std::vector<float> a(qa.a.size());
            for (size_t i = 0; i < a.size(); ++i) a[i] = bf16_to_fp32(qa.a[i]);
            std::vector<float> c = qa.c0;
            mxu_matmul_packed(w, a.data(), qa.lda, c.data(), qa.ldc, qa.m, qa.accumulate);
            std::vector<uint32_t> got(c.size());
            for (size_t i = 0; i < c.size(); ++i) got[i] = bits_of(c[i]);
            ASSERT_TRUE(same_bits(got, run_reference(qa), qa)) << "packed, round " << round;
          }
        }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, MxuFastPath, ::testing::ValuesIn(kAllMxuPaths),
                         [](const ::testing::TestParamInfo<MxuPath>& i) { return std::string(mxu_path_name(i.param)); });

TEST(MxuFast, DispatchPicksASupportedPath) {
  EXPECT_TRUE(mxu_path_supported(mxu_selected_path()));
  EXPECT_STREQ(mxu_matmul_isa(), mxu_path_name(mxu_selected_path()));
  const Problem q = make_problem(31, 10, 50, 20, 8, true, Data::kSpecial);
  std::vector<float> c = q.c0;
  mxu_matmul(q.args(c.data()));
  std::vector<uint32_t> got(c.size());
  for (size_t i = 0; i < c.size(); ++i) got[i] = bits_of(c[i]);
  EXPECT_TRUE(same_bits(got, run_reference(q), q));
}

// mxu_round_lhs is round_to_bf16 (the contract's fp32 -> bf16 -> fp32) on a sweep
// of bit patterns: every 65521st one (a prime stride: every exponent, both signs,
// varied low halves) plus the boundaries of each rounding rule.
TEST(MxuRoundLhs, EqualsRoundToBf16) {
  std::vector<uint32_t> in;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 65521) in.push_back(static_cast<uint32_t>(u));
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t b : {0x0u, 0x1u, 0x007FFFFFu, 0x00800000u, 0x00807FFFu, 0x00808000u, 0x00818000u, 0x3F808000u,
                       0x3F818000u, 0x3F807FFFu, 0x7F7F7FFFu, 0x7F7F8000u, 0x7F7FFFFFu, 0x7F800000u, 0x7F800001u,
                       0x7FC00000u, 0x7FFFFFFFu})
      in.push_back(sign | b);
  std::vector<float> out(in.size());
  mxu_round_lhs(in.data(), out.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(bits_of(out[i]), bits_of(round_to_bf16(float_of(in[i])))) << "input " << hex32(in[i]);
}

}  // namespace
}  // namespace tpusim::num
