// The MXU's arithmetic (shared/spec/numerics.md, "MXU"): bf16 x bf16 products
// rounded once to fp32, summed in chunks of R consecutive reduction indices in
// increasing order, chunk sums combined in increasing order. Every layer that
// multiplies matrices (graph reference, ISA reference, SystemC MXU) calls these.
#pragma once

#include <cstddef>
#include <cstdint>

#include "isa/numerics/bf16.h"
#include "isa/numerics/fp32.h"

namespace tpusim::num {

// One product: exact, then rounded once to fp32 with FTZ. For bf16 operands the
// exact product has at most 16 significant bits, so the float multiply is exact
// except on overflow (-> Inf) or underflow (-> flushed).
inline float mxu_product(uint16_t a, uint16_t w) { return mul(bf16_to_fp32(a), bf16_to_fp32(w)); }

// Row-major operand views. a: M x K bf16 (row stride lda elements), w: K x N bf16
// (row stride ldw), c: M x N fp32 (row stride ldc).
struct MatmulArgs {
  const uint16_t* a = nullptr;
  size_t lda = 0;
  const uint16_t* w = nullptr;
  size_t ldw = 0;
  float* c = nullptr;
  size_t ldc = 0;
  int m = 0, k = 0, n = 0;
  int rows = 128;           // R: the array's reduction depth (chunk length)
  bool accumulate = false;  // c = c + A*W (first step acc = y + s_0) instead of c = A*W
};

// Scalar reference: the contract written out literally, one element at a time.
void mxu_matmul_reference(const MatmulArgs& args);

// Fast kernel, bit-identical to mxu_matmul_reference (vectorised, runtime dispatch
// to AVX-512 / AVX2 / portable code). Used by the fast MXU model and the
// functional reference.
void mxu_matmul(const MatmulArgs& args);

// Name of the code path mxu_matmul takes on this CPU ("avx512", "avx2", "portable").
const char* mxu_matmul_isa();

}  // namespace tpusim::num
