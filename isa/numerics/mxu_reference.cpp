#include "isa/numerics/mxu.h"

namespace tpusim::num {

void mxu_matmul_reference(const MatmulArgs& p) {
  const int chunks = (p.k + p.rows - 1) / p.rows;
  for (int i = 0; i < p.m; ++i) {
    for (int j = 0; j < p.n; ++j) {
      float acc = p.accumulate ? p.c[i * p.ldc + j] : 0.0f;
      for (int c = 0; c < chunks; ++c) {
        const int k0 = c * p.rows;
        const int k1 = k0 + p.rows < p.k ? k0 + p.rows : p.k;
        float s = 0.0f;  // +0.0
        for (int k = k0; k < k1; ++k) s = add(s, mxu_product(p.a[i * p.lda + k], p.w[k * p.ldw + j]));
        // Unused rows of a short last chunk contribute +0.0 products; adding +0.0
        // once is the same as adding it any number of times (it only turns -0 to +0).
        if (k1 - k0 < p.rows) s = add(s, 0.0f);
        acc = (c == 0 && !p.accumulate) ? s : add(acc, s);
      }
      p.c[i * p.ldc + j] = flush(acc);
    }
  }
}

}  // namespace tpusim::num
