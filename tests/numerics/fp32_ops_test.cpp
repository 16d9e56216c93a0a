// fp32 add/sub/mul/max/min of fp32.h: special cases by hand, random operands
// against double arithmetic rounded by test_util.h's integer routine (double
// rounding of +,-,* through binary64 is innocuous for binary32: 53 >= 2*24+2).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "isa/numerics/fp32.h"
#include "test_util.h"

namespace tpusim::num {
namespace {

using test::bits_of;
using test::float_of;

constexpr uint32_t kQNaN = 0x7FC00000u, kPInf = 0x7F800000u, kNInf = 0xFF800000u;
constexpr uint32_t kPZero = 0u, kNZero = 0x80000000u, kOne = 0x3F800000u, kMinNormal = 0x00800000u;

enum class Op { kAdd, kSub, kMul };

uint32_t expected(Op op, uint32_t a, uint32_t b) {
  if (test::is_nan_bits(a) || test::is_nan_bits(b)) return kQNaN;
  const double x = test::daz_to_double(a), y = test::daz_to_double(b);
  double r = 0;
  switch (op) {
    case Op::kAdd: r = x + y; break;
    case Op::kSub: r = x - y; break;
    case Op::kMul: r = x * y; break;
  }
  if (r != r) return kQNaN;  // Inf - Inf, 0 * Inf
  return test::round_double_to_fp32_contract(r);
}

uint32_t run(Op op, uint32_t a, uint32_t b) {
  switch (op) {
    case Op::kAdd: return bits_of(add(float_of(a), float_of(b)));
    case Op::kSub: return bits_of(sub(float_of(a), float_of(b)));
    case Op::kMul: return bits_of(mul(float_of(a), float_of(b)));
  }
  return 0;
}

TEST(Fp32Ops, SpecialCases) {
  EXPECT_EQ(run(Op::kAdd, kPInf, kNInf), kQNaN);
  EXPECT_EQ(run(Op::kSub, kPInf, kPInf), kQNaN);
  EXPECT_EQ(run(Op::kMul, kPInf, kPZero), kQNaN);
  EXPECT_EQ(run(Op::kMul, kNInf, 0x00000001u), kQNaN);  // subnormal reads as zero
  EXPECT_EQ(run(Op::kAdd, 0xFFC12345u, kOne), kQNaN);   // payload and sign dropped
  EXPECT_EQ(run(Op::kAdd, kNZero, kNZero), kNZero);
  EXPECT_EQ(run(Op::kAdd, kNZero, kPZero), kPZero);
  EXPECT_EQ(run(Op::kSub, kNZero, kPZero), kNZero);
  EXPECT_EQ(run(Op::kAdd, kOne, 0xBF800000u), kPZero);  // exact cancellation is +0 under RNE
  EXPECT_EQ(run(Op::kAdd, 0x80000001u, kNZero), kNZero);  // DAZ keeps the sign
  // 1.5 * 2^-126 - 2^-126 = 2^-127: subnormal, flushed to +0; the negative one to -0.
  EXPECT_EQ(run(Op::kSub, 0x00C00000u, kMinNormal), kPZero);
  EXPECT_EQ(run(Op::kSub, kMinNormal, 0x00C00000u), kNZero);
  // Flush after rounding: (1 - 2^-24) * 2^-126 is exactly halfway between the
  // largest subnormal and 2^-126 and rounds (to even) up to 2^-126, which stays.
  // x86 MXCSR.FTZ would give 0 here (tininess after rounding, unbounded exponent).
  EXPECT_EQ(run(Op::kMul, 0x3F7FFFFFu, kMinNormal), kMinNormal);
  // Just below that: (1 - 2^-23) * 2^-126 rounds to the largest subnormal: flushed.
  EXPECT_EQ(run(Op::kMul, 0x3F7FFFFEu, kMinNormal), kPZero);
  EXPECT_EQ(run(Op::kMul, 0x7F7FFFFFu, 0x40000000u), kPInf);
  EXPECT_EQ(run(Op::kAdd, 0x7F7FFFFFu, 0x73000000u), kPInf);  // max + half ulp ties to even -> Inf
}

TEST(Fp32Ops, MaxMin) {
  auto mx = [](uint32_t a, uint32_t b) { return bits_of(max(float_of(a), float_of(b))); };
  auto mn = [](uint32_t a, uint32_t b) { return bits_of(min(float_of(a), float_of(b))); };
  EXPECT_EQ(mx(kNZero, kPZero), kPZero);
  EXPECT_EQ(mx(kPZero, kNZero), kPZero);
  EXPECT_EQ(mn(kNZero, kPZero), kNZero);
  EXPECT_EQ(mn(kPZero, kNZero), kNZero);
  EXPECT_EQ(mx(kQNaN, kOne), kQNaN);
  EXPECT_EQ(mx(kOne, 0xFFC00001u), kQNaN);
  EXPECT_EQ(mn(kNInf, 0x7F800001u), kQNaN);
  EXPECT_EQ(mx(kNInf, kOne), kOne);
  EXPECT_EQ(mn(kPInf, kOne), kOne);
  EXPECT_EQ(mx(0x00000005u, kNZero), kPZero);  // DAZ: +subnormal is +0
  EXPECT_EQ(mn(0x80000005u, kPZero), kNZero);
  EXPECT_EQ(mx(0x80000005u, 0x80000000u), kNZero);  // both read as -0
}

TEST(Fp32Ops, RandomAgainstDouble) {
  std::mt19937_64 rng(42);
  const uint64_t n = 4'000'000 / test::kRandomScale;
  uint64_t bad = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    uint32_t a = static_cast<uint32_t>(r), b = static_cast<uint32_t>(r >> 32);
    // Half the time pull b's exponent near a's, where cancellation and carries happen.
    if (i & 1) b = (b & 0x807FFFFFu) | (((a & 0x7F800000u) + ((r >> 20) & 0x03800000u) - 0x01800000u) & 0x7F800000u);
    // A quarter of the time force both near the underflow boundary.
    if ((i & 3) == 2) {
      a = (a & 0x807FFFFFu) | (((r >> 40) & 3u) << 23);
      b = (b & 0x807FFFFFu) | (((r >> 42) & 3u) << 23);
    }
    for (Op op : {Op::kAdd, Op::kSub, Op::kMul}) {
      const uint32_t got = run(op, a, b), want = expected(op, a, b);
      if (got != want && bad++ < 5)
        ADD_FAILURE() << std::hex << "op " << static_cast<int>(op) << " a=0x" << a << " b=0x" << b << " got 0x" << got
                      << " want 0x" << want;
    }
    // max/min against the ordering of the DAZ'd doubles.
    if (!test::is_nan_bits(a) && !test::is_nan_bits(b)) {
      const double x = test::daz_to_double(a), y = test::daz_to_double(b);
      if (x != y) {
        const double big = x > y ? x : y, small = x > y ? y : x;
        if (bits_of(max(float_of(a), float_of(b))) != bits_of(static_cast<float>(big)) && bad++ < 5)
          ADD_FAILURE() << "max " << std::hex << a << " " << b;
        if (bits_of(min(float_of(a), float_of(b))) != bits_of(static_cast<float>(small)) && bad++ < 5)
          ADD_FAILURE() << "min " << std::hex << a << " " << b;
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

TEST(Fp32Ops, MultiplyNearUnderflowBoundaryExhaustiveFractions) {
  // a = 1.f (every fraction), b = 2^-126 .. 2^-125: products straddle 2^-126,
  // the one place where "flush after rounding" and "flush before rounding" differ.
  uint64_t bad = 0;
  for (uint32_t f = 0; f < (1u << 23); f += 1u + 6u * (test::kSweepStride > 1)) {
    const uint32_t a = 0x3F000000u | f;  // [0.5, 1)
    for (uint32_t b : {0x00800000u, 0x00800001u, 0x00FFFFFFu, 0x01000000u, 0x80800003u}) {
      const uint32_t got = run(Op::kMul, a, b), want = expected(Op::kMul, a, b);
      if (got != want && bad++ < 5) ADD_FAILURE() << std::hex << a << " * " << b << " got " << got << " want " << want;
    }
  }
  EXPECT_EQ(bad, 0u);
}

}  // namespace
}  // namespace tpusim::num
