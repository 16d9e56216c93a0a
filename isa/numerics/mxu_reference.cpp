// The contract's MXU arithmetic (shared/spec/numerics.md, "MXU") written out one
// output element at a time. Everything else (the fast kernel, the conv reference,
// the hardware model) is held bit-identical to this.
#include <stdexcept>
#include <string>

#include "isa/numerics/mxu.h"
#include "isa/numerics/mxu_paths.h"

namespace tpusim::num {

namespace {
[[noreturn]] void bad_args(const std::string& what) { throw std::invalid_argument("mxu_matmul: " + what); }
}  // namespace

void mxu_validate_args(const MatmulArgs& p) {
  if (p.m < 0 || p.k < 0 || p.n < 0)
    bad_args("negative size m=" + std::to_string(p.m) + " k=" + std::to_string(p.k) + " n=" + std::to_string(p.n));
  if (p.rows < 1) bad_args("reduction depth rows=" + std::to_string(p.rows) + " must be at least 1");
  if (p.m > 0 && p.k > 0 && (p.a == nullptr || p.lda < static_cast<size_t>(p.k)))
    bad_args("operand a is null or lda=" + std::to_string(p.lda) + " < k=" + std::to_string(p.k));
  if (p.k > 0 && p.n > 0 && (p.w == nullptr || p.ldw < static_cast<size_t>(p.n)))
    bad_args("operand w is null or ldw=" + std::to_string(p.ldw) + " < n=" + std::to_string(p.n));
  if (p.m > 0 && p.n > 0 && (p.c == nullptr || p.ldc < static_cast<size_t>(p.n)))
    bad_args("result c is null or ldc=" + std::to_string(p.ldc) + " < n=" + std::to_string(p.n));
}

void mxu_matmul_reference(const MatmulArgs& p) {
  mxu_validate_args(p);
  const int chunks = (p.k + p.rows - 1) / p.rows;  // ceil(K/R); zero when K = 0
  for (int i = 0; i < p.m; ++i) {
    for (int j = 0; j < p.n; ++j) {
      float& out = p.c[static_cast<size_t>(i) * p.ldc + j];
      float acc = p.accumulate ? out : 0.0f;
      for (int c = 0; c < chunks; ++c) {
        const int k0 = c * p.rows;
        const int k1 = p.k - k0 > p.rows ? k0 + p.rows : p.k;
        float s = 0.0f;  // every chunk starts from +0.0
        for (int k = k0; k < k1; ++k)
          s = add(s, mxu_product(p.a[static_cast<size_t>(i) * p.lda + k], p.w[static_cast<size_t>(k) * p.ldw + j]));
        // The unused rows of a short last chunk contribute +0.0 products. Adding
        // +0.0 changes only a -0.0 sum (to +0.0) and is idempotent, so one add
        // stands for all of them.
        if (k1 - k0 < p.rows) s = add(s, 0.0f);
        acc = (c == 0 && !p.accumulate) ? s : add(acc, s);  // accumulate: acc = y + s_0
      }
      // With no chunks (K = 0) the accumulator passes through, read with DAZ.
      out = flush(acc);
    }
  }
}

}  // namespace tpusim::num
