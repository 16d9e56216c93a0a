// Data movement lowerings: numpy broadcast into scratch, reshape/flatten copies,
// transpose.
#include "compiler/lower/emitter.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "isa/asm/instr.h"

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

// transpose. Output axes that are adjacent and in order in the input too move as
// one axis, and size-1 axes not at all: BERT's head split [1,128,12,64] perm
// [0,2,1,3] is [128,12,64] -> [12,128,64], whose innermost 64 elements are
// contiguous at both ends. Such a trailing axis is each DMA run (256 B there
// instead of one 4-byte element, 64 times fewer memory requests); the next three
// innermost axes are a DMA's dims, each index of the outer ones one DMA. Runs
// shorter than a few HBM bursts (a true 2-D transpose: one element) go through
// VMEM as the conv's NHWC -> NCHW store does, where they cost per byte, not per
// run: the whole tensor at once, or blocks of an outermost axis the input shares.
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
  struct Axis {
    int64_t size, src_stride, dst_stride;
  };
  std::vector<Axis> axes;  // output order, outermost first
  for (size_t d = 0; d < rank; ++d) {
    if (os[d] == 1) continue;
    const Axis a{os[d], in_stride[static_cast<size_t>(perm[d])], out_stride[d]};
    // The axis before it steps over exactly this one at both ends: one axis.
    if (!axes.empty() && axes.back().src_stride == a.src_stride * a.size &&
        axes.back().dst_stride == a.dst_stride * a.size)
      axes.back() = {axes.back().size * a.size, a.src_stride, a.dst_stride};
    else
      axes.push_back(a);
  }
  int64_t run = e;
  constexpr int64_t kMaxRun = int64_t{1} << 30;  // as lower_copy's DMAs
  if (!axes.empty() && axes.back().src_stride == e && axes.back().dst_stride == e && axes.back().size * e <= kMaxRun) {
    run = axes.back().size * e;
    axes.pop_back();
  }
  for (const Axis& a : axes)
    if (a.src_stride > INT32_MAX || a.dst_stride > INT32_MAX)
      fail(n, "a stride of " + std::to_string(std::max(a.src_stride, a.dst_stride)) +
                  " bytes is beyond a DMA dim's signed 32 bits");
  // The DMAs that move `ax` (outermost first), offsets from the two bases.
  const auto transfers = [run, this](const std::vector<Axis>& ax) {
    const size_t inner = std::min<size_t>(isa::kMaxDmaDims, ax.size()), outer_axes = ax.size() - inner;
    std::string dims;
    for (size_t k = 0; k < inner; ++k) {
      const Axis& a = ax[ax.size() - 1 - k];
      dims += dim(a.size, a.src_stride, a.dst_stride);
    }
    int64_t outer = 1;
    for (size_t d = 0; d < outer_axes; ++d) outer *= ax[d].size;
    std::vector<Gather> out;
    for (int64_t o = 0; o < outer; ++o) {
      int64_t rem = o, src = 0, dst = 0;
      for (size_t d = outer_axes; d-- > 0;) {
        const int64_t i = rem % ax[d].size;
        rem /= ax[d].size;
        src += i * ax[d].src_stride;
        dst += i * ax[d].dst_stride;
      }
      out.push_back({src, dst, run, dims});
    }
    return out;
  };
  const int64_t total = num_elements(os) * e, y = t_.at(n.output).addr;
  constexpr int64_t kStagedRunsBelow = 128;  // bytes
  if (run < kStagedRunsBelow && !axes.empty()) {
    // Blocks of the outermost axis when the input has it outermost too (batch and
    // head axes a transpose leaves in place): each block is contiguous at both ends.
    const bool shared = axes[0].src_stride * axes[0].size == total;
    const int64_t count = shared ? axes[0].size : 1, slice = total / count;
    int64_t per = count;
    while (per > 0 && !staging_fits(per * slice, per * slice)) --per;
    if (per > 0) {
      for (int64_t b0 = 0; b0 < count; b0 += per) {
        const int64_t k = std::min(per, count - b0);
        std::vector<Axis> block(axes.begin() + (shared ? 1 : 0), axes.end());
        if (shared && k > 1) block.insert(block.begin(), Axis{k, slice, slice});
        staged_gather(X.addr + b0 * slice, k * slice, y + b0 * slice, k * slice, transfers(block), false, 0.0f,
                      n.type.dtype);
      }
      return;
    }
  }
  for (const Gather& g : transfers(axes)) dma(hbm(y + g.dst_off), hbm(X.addr + g.src_off), g.run, g.dims);
  wait_dmas();
}

}  // namespace tpusim::compiler::lowering
