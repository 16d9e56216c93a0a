#include <gtest/gtest.h>

#include "isa/numerics/bf16.h"
#include "isa/numerics/mxu.h"

namespace tpusim::num {
namespace {

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1+2^-7: ties to even (1.0).
  EXPECT_EQ(fp32_to_bf16(f32_from_bits(0x3F808000u)), 0x3F80u);
  // 1 + 2^-7 + 2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6: rounds up.
  EXPECT_EQ(fp32_to_bf16(f32_from_bits(0x3F818000u)), 0x3F82u);
  EXPECT_EQ(fp32_to_bf16(f32_from_bits(0x7F7FFFFFu)), 0x7F80u);  // overflow -> Inf
  EXPECT_EQ(fp32_to_bf16(f32_from_bits(0xFFC12345u)), kCanonicalNanBf16);
  EXPECT_EQ(fp32_to_bf16(f32_from_bits(0x80000001u)), 0x8000u);  // subnormal -> -0
}

TEST(MxuReference, ShortChunkTurnsNegativeZeroPositive) {
  // One product of -0.0 (K=1 < R): +0.0 + -0.0 = +0.0.
  uint16_t a = 0x8000, w = 0x3F80;
  float c = 1.0f;
  MatmulArgs args{&a, 1, &w, 1, &c, 1, 1, 1, 1};
  mxu_matmul_reference(args);
  EXPECT_EQ(f32_bits(c), 0u);
}

}  // namespace
}  // namespace tpusim::num
