// Every fp32 bit pattern through fp32_to_bf16 and every bf16 pattern through
// bf16_to_fp32, against Eigen::bfloat16 for the normal range plus the contract's
// own NaN and subnormal rules (shared/spec/numerics.md, "fp32 -> bf16").
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cstdint>

#include "isa/numerics/bf16.h"
#include "test_util.h"

namespace tpusim::num {
namespace {

using test::bits_of;
using test::float_of;

uint16_t expected_bf16(uint32_t u) {
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu)) return 0x7FC0;  // NaN
  if ((u & 0x7F800000u) == 0) return static_cast<uint16_t>(u >> 16) & 0x8000;  // DAZ: signed zero
  return Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(float_of(u)));   // RNE, overflow to Inf
}

// 2^32 patterns in 16 slices so ctest can run them in parallel.
class Fp32ToBf16Sweep : public ::testing::TestWithParam<uint32_t> {};

TEST_P(Fp32ToBf16Sweep, MatchesEigenPlusContractRules) {
  const uint64_t begin = uint64_t{GetParam()} << 28, end = begin + (uint64_t{1} << 28);
  uint64_t mismatches = 0;
  uint32_t first_bad = 0;
  for (uint64_t v = begin; v < end; v += test::kSweepStride) {
    const uint32_t u = static_cast<uint32_t>(v);
    if (fp32_to_bf16(float_of(u)) != expected_bf16(u)) {
      if (mismatches++ == 0) first_bad = u;
    }
  }
  EXPECT_EQ(mismatches, 0u) << "first mismatch at fp32 0x" << std::hex << first_bad << " got 0x"
                            << fp32_to_bf16(float_of(first_bad)) << " want 0x" << expected_bf16(first_bad);
}

INSTANTIATE_TEST_SUITE_P(AllPatterns, Fp32ToBf16Sweep, ::testing::Range(0u, 16u));

TEST(Bf16ToFp32, AllPatterns) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint32_t got = bits_of(bf16_to_fp32(static_cast<uint16_t>(h)));
    uint32_t want;
    if ((h & 0x7F80u) == 0x7F80u && (h & 0x7Fu)) {
      want = 0x7FC00000u;
    } else if ((h & 0x7F80u) == 0) {
      want = (h & 0x8000u) << 16;
    } else {
      want = bits_of(static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(static_cast<uint16_t>(h))));
    }
    ASSERT_EQ(got, want) << "bf16 0x" << std::hex << h;
  }
}

TEST(Bf16, RoundTripOfEveryNonNanNormalBf16IsIdentity) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const bool nan = (h & 0x7F80u) == 0x7F80u && (h & 0x7Fu);
    const bool sub = (h & 0x7F80u) == 0 && (h & 0x7Fu);
    if (nan || sub) continue;
    ASSERT_EQ(fp32_to_bf16(bf16_to_fp32(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(Bf16, HandPickedBoundaries) {
  // Largest finite bf16 is 0x7F7F; the fp32 halfway point above it rounds to Inf.
  EXPECT_EQ(fp32_to_bf16(float_of(0x7F7F7FFFu)), 0x7F7Fu);
  EXPECT_EQ(fp32_to_bf16(float_of(0x7F7F8000u)), 0x7F80u);
  EXPECT_EQ(fp32_to_bf16(float_of(0xFF7F8000u)), 0xFF80u);
  // Smallest normal survives, the largest subnormal flushes even though RNE would
  // round it up to the smallest normal bf16.
  EXPECT_EQ(fp32_to_bf16(float_of(0x00800000u)), 0x0080u);
  EXPECT_EQ(fp32_to_bf16(float_of(0x007FFFFFu)), 0x0000u);
  EXPECT_EQ(fp32_to_bf16(float_of(0x807FFFFFu)), 0x8000u);
  // Negative NaN with payload -> positive canonical.
  EXPECT_EQ(fp32_to_bf16(float_of(0xFF800001u)), 0x7FC0u);
  EXPECT_EQ(bits_of(bf16_to_fp32(0xFFFFu)), 0x7FC00000u);
  EXPECT_EQ(bits_of(bf16_to_fp32(0x0001u)), 0x00000000u);
  EXPECT_EQ(bits_of(bf16_to_fp32(0x8001u)), 0x80000000u);
}

}  // namespace
}  // namespace tpusim::num
