// The compiler's precision policies (shared/spec/numerics.md, "Precision policies")
// and the few conversions every layer performs under them, so that the graph
// reference, the ISA reference and the hardware model store the same bits.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "isa/numerics/bf16.h"
#include "isa/numerics/fp32.h"

namespace tpusim::num {

enum class PrecisionPolicy {
  kDefault,  // fp32 tensors; matmul/conv operands rounded to bf16 entering the MXU
  kBf16,     // tensors stored as bf16; MXU accumulation and VPU math fp32 inside
};

// The spelling of `tpusim compile --precision` (shared/spec/cli.md).
inline const char* precision_policy_name(PrecisionPolicy p) { return p == PrecisionPolicy::kBf16 ? "bf16" : "default"; }

inline std::optional<PrecisionPolicy> parse_precision_policy(std::string_view s) {
  if (s == "default") return PrecisionPolicy::kDefault;
  if (s == "bf16") return PrecisionPolicy::kBf16;
  return std::nullopt;
}

// Bytes per element of a graph tensor in memory (HBM/VMEM) under the policy.
inline int tensor_storage_bytes(PrecisionPolicy p) { return p == PrecisionPolicy::kBf16 ? 2 : 4; }

// The fp32 value a tensor store writes (and a later load reads back) under the
// policy: the fp32 result itself (DAZ/FTZ, canonical NaN) under `default`, the
// result converted to bf16 (RNE, subnormal -> signed zero, canonical NaN) under
// `bf16`. Every layer rounds stored tensors through this one function.
inline float stored_value(PrecisionPolicy p, float x) {
  return p == PrecisionPolicy::kBf16 ? round_to_bf16(x) : flush(x);
}

// The bit pattern of a tensor element as stored: fp32 bits zero-extended, or bf16
// bits in the low half.
inline uint32_t stored_bits(PrecisionPolicy p, float x) {
  return p == PrecisionPolicy::kBf16 ? fp32_to_bf16(x) : f32_bits(flush(x));
}

// The fp32 value a load of stored_bits(p, x) reads back: stored_value(p, x).
inline float loaded_value(PrecisionPolicy p, uint32_t bits) {
  return p == PrecisionPolicy::kBf16 ? bf16_to_fp32(static_cast<uint16_t>(bits)) : flush(f32_from_bits(bits));
}

// The bf16 operand an fp32 tensor value becomes as it enters the MXU. The same
// rule under both policies; under `bf16` the value is already bf16, so it is exact.
inline uint16_t mxu_operand(float x) { return fp32_to_bf16(x); }

}  // namespace tpusim::num
