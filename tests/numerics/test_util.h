// Independent formulations the numerics tests compare against. Nothing here calls
// the code under test: rounding is done with integer arithmetic on the bits of a
// double, not with float conversions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

namespace tpusim::num::test {

// Sweeps shrink under the sanitizers (TPUSIM_NUMERICS_SHRINK is set by
// tests/numerics/CMakeLists.txt when TPUSIM_SANITIZE=ON).
#ifdef TPUSIM_NUMERICS_SHRINK
inline constexpr uint64_t kSweepStride = 97;   // every 97th pattern (coprime with 2)
inline constexpr uint64_t kRandomScale = 64;   // 1/64th of the random counts
#else
inline constexpr uint64_t kSweepStride = 1;
inline constexpr uint64_t kRandomScale = 1;
#endif

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint64_t bits_of(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

// Rounds a finite double x to the contract's fp32: RNE to 24 significant bits
// with IEEE gradual underflow (grid 2^-149 below 2^-126), overflow to Inf, then a
// result below 2^-126 becomes a zero of x's sign (FTZ after rounding). Returns
// the fp32 bit pattern. Integer arithmetic only.
inline uint32_t round_double_to_fp32_contract(double x) {
  const uint64_t u = bits_of(x);
  const uint32_t sign = static_cast<uint32_t>(u >> 63) << 31;
  const int bexp = static_cast<int>((u >> 52) & 0x7FF);
  uint64_t frac = u & ((uint64_t{1} << 52) - 1);
  if (bexp == 0x7FF) return frac ? 0x7FC00000u : (sign | 0x7F800000u);
  if (bexp == 0 && frac == 0) return sign;
  // x = mant * 2^(e2) with mant an integer.
  uint64_t mant;
  int e2;
  if (bexp == 0) {
    mant = frac;
    e2 = -1074;
  } else {
    mant = frac | (uint64_t{1} << 52);
    e2 = bexp - 1075;
  }
  // Exponent of the leading bit: x in [2^lead, 2^(lead+1)).
  int msb = 63;
  while (!((mant >> msb) & 1)) --msb;
  const int lead = msb + e2;
  // Quantum of the target grid: 2^(lead-23) for normals, 2^-149 below 2^-126.
  const int quantum = lead >= -126 ? lead - 23 : -149;
  const int shift = quantum - e2;  // bits to drop from mant
  uint64_t q;
  if (shift <= 0) {
    q = mant << (-shift);
  } else if (shift >= 64) {
    q = 0;  // far below half a quantum
  } else {
    q = mant >> shift;
    const uint64_t rem = mant & ((uint64_t{1} << shift) - 1);
    const uint64_t half = uint64_t{1} << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
  }
  // value = q * 2^quantum. Normalise into an fp32 encoding.
  int qexp = quantum;
  if (q >= (uint64_t{1} << 24)) {  // rounding carried into a new binade
    q >>= 1;
    ++qexp;
  }
  if (q < (uint64_t{1} << 23)) return sign;  // subnormal (or zero) after rounding: FTZ
  const int biased = qexp + 23 + 127;
  if (biased >= 255) return sign | 0x7F800000u;
  return sign | (static_cast<uint32_t>(biased) << 23) | static_cast<uint32_t>(q & 0x7FFFFF);
}

// The contract's DAZ of an fp32 operand, written independently.
inline double daz_to_double(uint32_t f) {
  if ((f & 0x7F800000u) == 0) return (f >> 31) ? -0.0 : 0.0;
  return static_cast<double>(float_of(f));
}

inline bool is_nan_bits(uint32_t u) { return (u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu); }

}  // namespace tpusim::num::test
