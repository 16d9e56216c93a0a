// MXU products (mxu_product) against the exact product computed in double (exact:
// 8 x 8 significant bits) rounded per the contract by test_util.h's integer
// rounding routine.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "isa/numerics/mxu.h"
#include "test_util.h"

namespace tpusim::num {
namespace {

using test::bits_of;

double bf16_daz_value(uint16_t h) {
  if ((h & 0x7F80u) == 0) return (h & 0x8000u) ? -0.0 : 0.0;
  return static_cast<double>(test::float_of(static_cast<uint32_t>(h) << 16));
}

bool bf16_is_nan(uint16_t h) { return (h & 0x7F80u) == 0x7F80u && (h & 0x7Fu); }
bool bf16_is_inf(uint16_t h) { return (h & 0x7FFFu) == 0x7F80u; }

uint32_t expected_product(uint16_t a, uint16_t w) {
  if (bf16_is_nan(a) || bf16_is_nan(w)) return 0x7FC00000u;
  const double x = bf16_daz_value(a), y = bf16_daz_value(w);
  if ((bf16_is_inf(a) && y == 0.0) || (bf16_is_inf(w) && x == 0.0)) return 0x7FC00000u;  // 0 * Inf
  return test::round_double_to_fp32_contract(x * y);  // exact in double, or +/-Inf
}

void check_pair(uint16_t a, uint16_t w, uint64_t* bad) {
  const uint32_t got = bits_of(mxu_product(a, w));
  const uint32_t want = expected_product(a, w);
  if (got != want) {
    if (*bad < 5) ADD_FAILURE() << std::hex << "a=0x" << a << " w=0x" << w << " got 0x" << got << " want 0x" << want;
    ++*bad;
  }
}

// Every (sign, exponent) of both operands (2^18 combinations), each with random
// fractions; split by the first operand's exponent so ctest runs slices in parallel.
class ProductExponentSweep : public ::testing::TestWithParam<int> {};

TEST_P(ProductExponentSweep, AllSignExponentCombinations) {
  std::mt19937 rng(1234 + GetParam());
  const int fractions = 24;
  uint64_t bad = 0;
  for (int ea = GetParam() * 32; ea < GetParam() * 32 + 32; ++ea)
    for (int sa = 0; sa < 2; ++sa)
      for (int ew = 0; ew < 256; ++ew)
        for (int sw = 0; sw < 2; ++sw)
          for (int f = 0; f < fractions; ++f) {
            // Include the all-zero and all-one fractions, then random ones.
            const uint16_t fa = f == 0 ? 0 : f == 1 ? 0x7F : rng() & 0x7F;
            const uint16_t fw = f == 0 ? 0x7F : f == 1 ? 0 : rng() & 0x7F;
            check_pair(static_cast<uint16_t>(sa << 15 | ea << 7 | fa), static_cast<uint16_t>(sw << 15 | ew << 7 | fw),
                       &bad);
          }
  EXPECT_EQ(bad, 0u);
}

INSTANTIATE_TEST_SUITE_P(ByExponentOfA, ProductExponentSweep, ::testing::Range(0, 8));

// Near the boundaries: exponent sums that land within a few binades of 2^-126
// (underflow) and 2^128 (overflow), every fraction of one operand.
TEST(Product, DenseNearUnderflowAndOverflow) {
  uint64_t bad = 0;
  for (int target : {-126, 127}) {
    for (int ea = 1; ea < 255; ++ea) {
      const int ew = target - (ea - 127) + 127;  // unbiased sum ~ target
      for (int dw = -2; dw <= 1; ++dw) {
        const int e = ew + dw;
        if (e < 0 || e > 255) continue;
        for (int fa = 0; fa < 128; fa += 3)
          for (int fw = 0; fw < 128; ++fw)
            for (int s = 0; s < 4; ++s)
              check_pair(static_cast<uint16_t>((s & 1) << 15 | ea << 7 | fa),
                         static_cast<uint16_t>((s >> 1) << 15 | e << 7 | fw), &bad);
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

// 10^8 random pairs of bf16 bit patterns in four slices of 2.5 * 10^7.
class ProductRandom : public ::testing::TestWithParam<int> {};

TEST_P(ProductRandom, RandomPairs) {
  std::mt19937_64 rng(0x5EED0000u + GetParam());
  const uint64_t n = 25'000'000 / test::kRandomScale;
  uint64_t bad = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    check_pair(static_cast<uint16_t>(r), static_cast<uint16_t>(r >> 16), &bad);
    check_pair(static_cast<uint16_t>(r >> 32), static_cast<uint16_t>(r >> 48), &bad);
  }
  EXPECT_EQ(bad, 0u);
}

INSTANTIATE_TEST_SUITE_P(Slices, ProductRandom, ::testing::Range(0, 2));

TEST(Product, SpecialValues) {
  EXPECT_EQ(bits_of(mxu_product(0x7F80, 0x0000)), 0x7FC00000u);  // Inf * 0
  EXPECT_EQ(bits_of(mxu_product(0x7F80, 0x0001)), 0x7FC00000u);  // Inf * subnormal (DAZ -> 0)
  EXPECT_EQ(bits_of(mxu_product(0xFF80, 0x3F80)), 0xFF800000u);  // -Inf * 1
  EXPECT_EQ(bits_of(mxu_product(0x8000, 0x3F80)), 0x80000000u);  // -0 * 1
  EXPECT_EQ(bits_of(mxu_product(0x0000, 0xBF80)), 0x80000000u);  // +0 * -1
  EXPECT_EQ(bits_of(mxu_product(0x7F7F, 0x7F7F)), 0x7F800000u);  // overflow
  EXPECT_EQ(bits_of(mxu_product(0x0080, 0x3F00)), 0x00000000u);  // 2^-126 * 0.5 flushes
  EXPECT_EQ(bits_of(mxu_product(0x8080, 0x3F00)), 0x80000000u);  // ... to a signed zero
  EXPECT_EQ(bits_of(mxu_product(0x0080, 0x3F80)), 0x00800000u);  // 2^-126 * 1 stays
}

}  // namespace
}  // namespace tpusim::num
