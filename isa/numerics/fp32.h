// fp32 arithmetic of the numerics contract (shared/spec/numerics.md): IEEE-754
// binary32, round to nearest even, subnormal inputs read as signed zero (DAZ),
// subnormal results written as signed zero (FTZ), every produced NaN canonical.
//
// FTZ is applied to the IEEE result (rounded with gradual underflow): a result that
// is subnormal after rounding becomes a zero of its sign; a result that rounds up
// to 2^-126 stays. See docs/numerics.md for why this is the choice and where it
// can differ from other flush rules (never for MXU products of bf16 operands).
//
// Everything here is header-only and constexpr-free on purpose: it must compile to
// plain IEEE operations with -ffp-contract=off (no FMA contraction).
#pragma once

#include <cstdint>
#include <cstring>

namespace tpusim::num {

inline constexpr uint32_t kCanonicalNanF32 = 0x7FC00000u;
inline constexpr uint32_t kF32SignMask = 0x80000000u;
inline constexpr uint32_t kF32ExpMask = 0x7F800000u;
inline constexpr uint32_t kF32FracMask = 0x007FFFFFu;

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline bool f32_is_nan(uint32_t u) {
  return (u & kF32ExpMask) == kF32ExpMask && (u & kF32FracMask) != 0;
}

// Zero exponent field: zero or subnormal.
inline bool f32_is_zero_or_subnormal(uint32_t u) { return (u & kF32ExpMask) == 0; }

// Subnormal -> zero of the same sign; any NaN -> canonical NaN; else unchanged.
// The same rule serves inputs (DAZ) and results (FTZ): both flush to signed zero.
inline float flush(float x) {
  uint32_t u = f32_bits(x);
  if (f32_is_zero_or_subnormal(u)) return f32_from_bits(u & kF32SignMask);
  if (f32_is_nan(u)) return f32_from_bits(kCanonicalNanF32);
  return x;
}

// Elementwise operations of the vector unit and the adds of the MXU.
inline float add(float a, float b) { return flush(flush(a) + flush(b)); }
inline float sub(float a, float b) { return flush(flush(a) - flush(b)); }
inline float mul(float a, float b) { return flush(flush(a) * flush(b)); }

// max/min: NaN if either operand is NaN; max(-0,+0) = +0 and min(-0,+0) = -0.
inline float max(float a, float b) {
  a = flush(a);
  b = flush(b);
  if (f32_is_nan(f32_bits(a)) || f32_is_nan(f32_bits(b))) return f32_from_bits(kCanonicalNanF32);
  if (a == b) return f32_from_bits(f32_bits(a) & f32_bits(b));  // +0 wins on a signed-zero tie
  return a > b ? a : b;
}

inline float min(float a, float b) {
  a = flush(a);
  b = flush(b);
  if (f32_is_nan(f32_bits(a)) || f32_is_nan(f32_bits(b))) return f32_from_bits(kCanonicalNanF32);
  if (a == b) return f32_from_bits(f32_bits(a) | f32_bits(b));  // -0 wins on a signed-zero tie
  return a < b ? a : b;
}

// Comparisons are IEEE comparisons of the DAZ'd operands (NaN compares unordered,
// -0 == +0, a subnormal equals zero).
inline bool cmp_eq(float a, float b) { return flush(a) == flush(b); }
inline bool cmp_lt(float a, float b) { return flush(a) < flush(b); }
inline bool cmp_le(float a, float b) { return flush(a) <= flush(b); }

}  // namespace tpusim::num
