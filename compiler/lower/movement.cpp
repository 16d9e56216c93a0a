// Data movement lowerings: numpy broadcast into scratch, reshape/flatten copies,
// transpose.
#include "compiler/lower/emitter.h"

#include <algorithm>
#include <cmath>

namespace tpusim::compiler::lowering {

// Copies tensor `name` broadcast (numpy rules) to `out_shape` into fresh HBM
// scratch with HBM->HBM DMAs, one per run of output rows whose source rows advance
// by a constant stride; returns its address. The same address if no broadcast is
// needed.
int64_t Emitter::broadcast_to(const Node& n, const std::string& name, const Shape& out_shape) {
  const Placed& p = t_.at(name);
  if (p.type.shape == out_shape) return p.addr;
  const int64_t e = esz(p.type.dtype);
  const size_t rank = out_shape.size();
  Shape in(rank, 1);
  const size_t off = rank - p.type.shape.size();
  for (size_t d = 0; d < p.type.shape.size(); ++d) in[off + d] = p.type.shape[d];
  std::vector<int64_t> in_stride(rank, 0);
  int64_t s = e;
  for (size_t d = rank; d-- > 0;) {
    in_stride[d] = in[d] == 1 ? 0 : s;
    s *= in[d];
  }
  const int64_t L = rank ? out_shape[rank - 1] : 1;
  const int64_t rows = rank ? num_elements(out_shape) / std::max<int64_t>(L, 1) : 1;
  const int64_t dst = place_hbm(num_elements(out_shape) * e);
  check_addr(n, dst + num_elements(out_shape) * e);
  std::vector<int64_t> src_row(rows);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t rem = r, a = 0;
    for (size_t d = rank - 1; d-- > 0;) {
      a += (rem % out_shape[d]) * in_stride[d];
      rem /= out_shape[d];
    }
    src_row[r] = p.addr + a;
  }
  const bool inner_bcast = rank && in[rank - 1] == 1 && L != 1;
  const int64_t row_bytes = L * e;
  for (int64_t r = 0; r < rows;) {
    int64_t cnt = 1;
    const int64_t step = r + 1 < rows ? src_row[r + 1] - src_row[r] : 0;
    while (r + cnt < rows && src_row[r + cnt] - src_row[r + cnt - 1] == step && cnt < 65535) ++cnt;
    std::string dims;
    int64_t bytes = row_bytes;
    if (inner_bcast) {
      bytes = e;
      dims += dim(L, 0, e);
    }
    if (cnt > 1) dims += dim(cnt, step, row_bytes);
    dma(hbm(dst + r * row_bytes), hbm(src_row[r]), bytes, dims);
    r += cnt;
  }
  wait_dmas();
  return dst;
}

// Data movement whose dense bytes do not change (reshape, flatten).
void Emitter::lower_copy(const Node& n) {
  const Placed& s = t_.at(n.inputs[0]);
  const int64_t bytes = num_elements(n.type.shape) * esz(n.type.dtype);
  constexpr int64_t kMaxDma = int64_t{1} << 30;
  for (int64_t o = 0; o < bytes; o += kMaxDma) dma(hbm(t_.at(n.output).addr + o), hbm(s.addr + o), std::min(kMaxDma, bytes - o));
  wait_dmas();
}

// transpose: HBM -> HBM, element-sized runs; the three innermost output dims are a
// DMA's dims, the outer ones one DMA each (their destinations are disjoint blocks).
void Emitter::lower_transpose(const Node& n) {
  const Placed& X = t_.at(n.inputs[0]);
  const auto& perm = n.attr_ints("perm");
  const Shape& os = n.type.shape;
  const int64_t e = esz(n.type.dtype);
  const size_t rank = os.size();
  std::vector<int64_t> in_stride(rank), out_stride(rank);
  for (int64_t d = static_cast<int64_t>(rank) - 1, si = e, so = e; d >= 0; --d) {
    in_stride[static_cast<size_t>(d)] = si;
    si *= X.type.shape[static_cast<size_t>(d)];
    out_stride[static_cast<size_t>(d)] = so;
    so *= os[static_cast<size_t>(d)];
  }
  const size_t inner = std::min<size_t>(3, rank);
  std::string dims;
  for (size_t k = 0; k < inner; ++k) {
    const size_t d = rank - 1 - k;
    dims += dim(os[d], in_stride[static_cast<size_t>(perm[d])], out_stride[d]);
  }
  const int64_t outer = num_elements(Shape(os.begin(), os.end() - static_cast<std::ptrdiff_t>(inner)));
  const int64_t y = t_.at(n.output).addr;
  for (int64_t o = 0; o < outer; ++o) {
    int64_t rem = o, src = X.addr, dst = y;
    for (size_t d = rank - inner; d-- > 0;) {
      const int64_t i = rem % os[d];
      rem /= os[d];
      src += i * in_stride[static_cast<size_t>(perm[d])];
      dst += i * out_stride[d];
    }
    dma(hbm(dst), hbm(src), e, dims);
  }
  wait_dmas();
}

}  // namespace tpusim::compiler::lowering
