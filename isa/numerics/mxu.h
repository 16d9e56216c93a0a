// The MXU's arithmetic (shared/spec/numerics.md, "MXU"): bf16 x bf16 products
// rounded once to fp32, summed in chunks of R consecutive reduction indices in
// increasing order, chunk sums combined in increasing order. Every layer that
// multiplies matrices (graph reference, ISA reference, SystemC MXU) calls these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

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

enum class MxuPath;  // mxu_paths.h

// The LHS as the array multiplies it: round_to_bf16 of n fp32 bit patterns (a NaN
// becomes the canonical NaN, a subnormal signed zero), vectorised.
void mxu_round_lhs(const uint32_t* src, float* dst, size_t n);

// Weights packed once into the kernel's layout for many matmuls against them, as
// a weight-stationary array holds its weights between two swaps: a K x N bf16 W
// and the chunk length R. Packing is part of every mxu_matmul call otherwise
// (about a third of a 128^3 one).
class MxuPackedWeights {
 public:
  // Packs for the path mxu_matmul dispatches to; throws std::invalid_argument on
  // malformed sizes (as mxu_matmul).
  void pack(const uint16_t* w, size_t ldw, int k, int n, int rows);
  int k() const { return k_; }
  int n() const { return n_; }
  int rows() const { return rows_; }
  const float* data() const;  // 64-byte aligned

 private:
  friend void mxu_matmul_packed(const MxuPackedWeights&, const float*, size_t, float*, size_t, int, bool);
  friend void mxu_pack_weights_with(MxuPath, MxuPackedWeights&, const uint16_t*, size_t, int, int, int);
  int path_ = 0, k_ = 0, n_ = 0, rows_ = 1;
  std::vector<float> storage_;
};

// C (m x N, stride ldc) = A * W, or C + A * W with accumulate, bit-identical to
// mxu_matmul on the same bf16 operands. A is m x K fp32 (row stride lda), each
// value what bf16_to_fp32 gives for some bf16 (mxu_round_lhs output qualifies).
void mxu_matmul_packed(const MxuPackedWeights& w, const float* a, size_t lda, float* c, size_t ldc, int m,
                       bool accumulate);

// Name of the code path mxu_matmul takes on this CPU ("avx512", "avx2", "portable").
const char* mxu_matmul_isa();

}  // namespace tpusim::num
