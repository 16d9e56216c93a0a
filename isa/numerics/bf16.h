// bfloat16 storage format and its conversions, per shared/spec/numerics.md.
// bf16 is the upper half of an fp32; values are carried as raw uint16_t bit
// patterns so that no layer can accidentally do arithmetic on them.
#pragma once

#include <cstdint>

#include "isa/numerics/fp32.h"

namespace tpusim::num {

inline constexpr uint16_t kCanonicalNanBf16 = 0x7FC0u;

// fp32 -> bf16: NaN -> 0x7FC0; subnormal -> signed zero; otherwise round to
// nearest even on the upper 16 bits (overflow rounds to +/-Inf).
inline uint16_t fp32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if (f32_is_nan(u)) return kCanonicalNanBf16;
  if (f32_is_zero_or_subnormal(u)) return static_cast<uint16_t>((u & kF32SignMask) >> 16);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// bf16 -> fp32: exact, except a subnormal becomes signed zero and a NaN the
// canonical fp32 NaN.
inline float bf16_to_fp32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  return flush(f32_from_bits(u));
}

// Rounds an fp32 value through bf16 storage and back (what a bf16 store+load does).
inline float round_to_bf16(float f) { return bf16_to_fp32(fp32_to_bf16(f)); }

}  // namespace tpusim::num
