// The vector unit's arithmetic beyond the IEEE basics of fp32.h (shared/spec/
// numerics.md, "Vector unit"): division, square roots, reciprocal, the
// transcendentals, and the fixed order of the cross-lane and cross-sublane
// reductions. The graph reference, the ISA reference and the SystemC vector unit
// all call these, so they agree bit for bit by construction; docs/numerics.md
// gives each one's maximum error in ulp against a correctly rounded result.
//
// Every function reads its operands with DAZ, writes its result with FTZ, and
// returns the canonical NaN for any NaN it produces.
#pragma once

#include <cmath>
#include <cstddef>

#include "isa/numerics/fp32.h"

namespace tpusim::num {

// IEEE-754 correctly rounded operations on the flushed operands.
inline float div(float a, float b) { return flush(flush(a) / flush(b)); }
inline float sqrt(float a) { return flush(std::sqrt(flush(a))); }
inline float recip(float a) { return flush(1.0f / flush(a)); }
inline float neg(float a) { return flush(f32_from_bits(f32_bits(flush(a)) ^ kF32SignMask)); }
inline float abs(float a) { return flush(f32_from_bits(f32_bits(flush(a)) & ~kF32SignMask)); }

// Transcendentals: evaluated in double precision and rounded once to fp32. The
// double result is within 1 ulp (double) of the true value, so the fp32 result is
// the correctly rounded one except within ~2^-29 ulp of a rounding boundary.
inline float rsqrt(float a) { return flush(static_cast<float>(1.0 / std::sqrt(static_cast<double>(flush(a))))); }
inline float exp(float a) { return flush(static_cast<float>(std::exp(static_cast<double>(flush(a))))); }
inline float log(float a) { return flush(static_cast<float>(std::log(static_cast<double>(flush(a))))); }
inline float tanh(float a) { return flush(static_cast<float>(std::tanh(static_cast<double>(flush(a))))); }
inline float erf(float a) { return flush(static_cast<float>(std::erf(static_cast<double>(flush(a))))); }

// Reductions, in the one order the hardware uses. A vector register row holds
// kLanes lanes; a register holds kSublanes rows.
inline constexpr int kLanes = 128;
inline constexpr int kSublanes = 8;

enum class ReduceOp { kSum, kMax, kMin };

inline float reduce_combine(ReduceOp op, float a, float b) {
  switch (op) {
    case ReduceOp::kSum: return add(a, b);
    case ReduceOp::kMax: return max(a, b);
    case ReduceOp::kMin: return min(a, b);
  }
  return a;
}

// Halving tree over a power-of-two count n: step width w = n/2, n/4, ..., 1,
// v[i] = v[i] (op) v[i + w] for i < w; the result is v[0]. `v` is scratch.
inline float reduce_tree(ReduceOp op, float* v, int n) {
  for (int w = n / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) v[i] = reduce_combine(op, v[i], v[i + w]);
  return v[0];
}

// Cross-lane reduction of one 128-lane row (the transpose/reduce unit).
inline float reduce_lanes(ReduceOp op, const float* row) {
  float v[kLanes];
  for (int i = 0; i < kLanes; ++i) v[i] = row[i];
  return reduce_tree(op, v, kLanes);
}

// Cross-sublane reduction of one lane's 8 values.
inline float reduce_sublanes(ReduceOp op, const float* column) {
  float v[kSublanes];
  for (int i = 0; i < kSublanes; ++i) v[i] = column[i];
  return reduce_tree(op, v, kSublanes);
}

// The identity that pads a reduction whose length is not a multiple of the
// hardware width: +0.0 for sums, -Inf for max, +Inf for min.
inline float reduce_identity(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return 0.0f;
    case ReduceOp::kMax: return -INFINITY;
    case ReduceOp::kMin: return INFINITY;
  }
  return 0.0f;
}

// A reduction of n values along the lane axis, the way compiled code does it:
// the row is cut into 128-lane tiles (the last padded with the identity); tiles
// are combined elementwise in increasing order into one 128-lane accumulator,
// which is then reduced across lanes by reduce_lanes.
inline float reduce_row(ReduceOp op, const float* x, size_t n) {
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = static_cast<size_t>(l) < n ? x[l] : reduce_identity(op);
  for (size_t t = kLanes; t < n; t += kLanes)
    for (int l = 0; l < kLanes; ++l)
      acc[l] = reduce_combine(op, acc[l], t + l < n ? x[t + l] : reduce_identity(op));
  return reduce_lanes(op, acc);
}

// A reduction of n values along the sublane axis (x[i * stride]): 8-row tiles
// combined elementwise in increasing order, the last padded with the identity,
// then reduce_sublanes.
inline float reduce_column(ReduceOp op, const float* x, size_t n, size_t stride) {
  float acc[kSublanes];
  for (int s = 0; s < kSublanes; ++s) acc[s] = static_cast<size_t>(s) < n ? x[s * stride] : reduce_identity(op);
  for (size_t t = kSublanes; t < n; t += kSublanes)
    for (int s = 0; s < kSublanes; ++s)
      acc[s] = reduce_combine(op, acc[s], t + s < n ? x[(t + s) * stride] : reduce_identity(op));
  return reduce_sublanes(op, acc);
}

}  // namespace tpusim::num
