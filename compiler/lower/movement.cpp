// Data movement lowerings: numpy broadcast into scratch, reshape/flatten copies,
// transpose.
#include "compiler/lower/emitter.h"

#include <algorithm>
#include <cmath>

namespace tpusim::compiler::lowering {

// A broadcast (numpy rules) of p to out_shape as moves: one per run of output rows
// whose source rows advance by a constant stride (and blocks of such runs that
// repeat, as a second dimension).
Emitter::BroadcastMoves Emitter::broadcast_moves(const Placed& p, const Shape& out_shape) const {
  BroadcastMoves mv;
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
  std::vector<int64_t> src_row(rows);  // relative to the operand's first byte
  for (int64_t r = 0; r < rows; ++r) {
    int64_t rem = r, a = 0;
    for (size_t d = rank - 1; d-- > 0;) {
      a += (rem % out_shape[d]) * in_stride[d];
      rem /= out_shape[d];
    }
    src_row[r] = a;
  }
  const bool inner_bcast = rank && in[rank - 1] == 1 && L != 1;
  const int64_t row_bytes = L * e;
  mv.src_bytes = num_elements(p.type.shape) * e;
  mv.dst_bytes = num_elements(out_shape) * e;
  mv.short_runs = (inner_bcast ? e : row_bytes) < kStagedRunsBelow;
  for (int64_t r = 0; r < rows;) {
    int64_t cnt = 1;
    const int64_t step = r + 1 < rows ? src_row[r + 1] - src_row[r] : 0;
    while (r + cnt < rows && src_row[r + cnt] - src_row[r + cnt - 1] == step && cnt < 65535) ++cnt;
    // Blocks of cnt rows that repeat at a constant distance (a [1,1,H,W] operand over
    // N x C planes: the same H rows each time) as a second dimension.
    int64_t blocks = 1;
    const int64_t step2 = r + cnt < rows ? src_row[r + cnt] - src_row[r] : 0;
    auto block_matches = [&](int64_t k) {
      if (r + (k + 1) * cnt > rows) return false;
      for (int64_t i = 0; i < cnt; ++i)
        if (src_row[r + k * cnt + i] != src_row[r + i] + k * step2) return false;
      return true;
    };
    while (blocks < 65535 && block_matches(blocks)) ++blocks;
    std::string dims;
    int64_t bytes = row_bytes;
    if (inner_bcast) {
      bytes = e;
      dims += dim(L, 0, e);
    }
    if (cnt > 1) dims += dim(cnt, step, row_bytes);
    if (blocks > 1) dims += dim(blocks, step2, cnt * row_bytes);
    mv.gathers.push_back(Gather{src_row[r], r * row_bytes, bytes, dims});
    r += cnt * blocks;
  }
  return mv;
}

// Copies tensor `name` broadcast to `out_shape` into fresh HBM scratch with those
// moves; returns its address. The same address if no broadcast is needed: the shapes
// are equal, or differ only by axes of one element (the training step's loss: its
// mean over the replicas, the xent's total; such an operand was copied through VMEM,
// three DMAs in a row, ~1.3 K cycles).
int64_t Emitter::broadcast_to(const Node& n, const std::string& name, const Shape& out_shape) {
  const Placed& p = t_.at(name);
  if (num_elements(p.type.shape) == num_elements(out_shape)) return p.addr;
  const BroadcastMoves mv = broadcast_moves(p, out_shape);
  const int64_t dst = place_hbm(mv.dst_bytes);
  check_addr(n, dst + mv.dst_bytes);
  // Runs of an element or a short row cost a memory request each in HBM: where the
  // operand and the result fit, they go through VMEM, whose gathers cost per byte (the
  // bundled CNN's global_avgpool gradient, a [N,C,1,1] value over H x W and a
  // [1,1,H,W] one over N x C: 276,844 -> 4,330 cycles, with the blocks below).
  if (mv.short_runs && staging_fits(mv.src_bytes, mv.dst_bytes)) {
    staged_gather(p.addr, mv.src_bytes, dst, mv.dst_bytes, mv.gathers, false, 0.0f, p.type.dtype);
  } else {
    for (const Gather& g : mv.gathers) dma(hbm(dst + g.dst_off), hbm(p.addr + g.src_off), g.run, g.dims);
    wait_dmas();
  }
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

// transpose: copy_nd's strided copy of x's view in y's order. Axes adjacent and
// in order at both ends merge and size-1 axes drop, so BERT's head split
// [1,128,12,64] perm [0,2,1,3] is one DMA of 12 x 128 runs of 256 B instead of
// runs of one 4-byte element (64 times fewer memory requests). Runs shorter than a
// few HBM bursts (a true 2-D transpose: one element) go through VMEM as the conv's
// NHWC -> NCHW store does, where they cost per byte, not per run: the whole tensor
// at once, or blocks of its outermost axis when the input has that axis outermost
// too (batch and head axes a transpose leaves in place).
void Emitter::lower_transpose(const Node& n) {
  const Placed& X = t_.at(n.inputs[0]);
  const auto& perm = n.attr_ints("perm");
  const Shape& os = n.type.shape;
  const int64_t e = esz(n.type.dtype);
  const size_t rank = os.size();
  std::vector<int64_t> in_stride(rank), src(rank), dst(rank);
  for (int64_t d = static_cast<int64_t>(rank) - 1, si = e, so = e; d >= 0; --d) {
    in_stride[static_cast<size_t>(d)] = si;
    si *= X.type.shape[static_cast<size_t>(d)];
    dst[static_cast<size_t>(d)] = so;
    so *= os[static_cast<size_t>(d)];
  }
  for (size_t d = 0; d < rank; ++d) src[d] = in_stride[static_cast<size_t>(perm[d])];
  const int64_t total = num_elements(os) * e, y = t_.at(n.output).addr;
  const std::vector<Gather> direct = strided_copies(dst, src, os, e);
  if (!direct.empty() && direct.front().run < kStagedRunsBelow) {
    size_t d0 = 0;
    while (d0 < rank && os[d0] == 1) ++d0;
    const bool shared = d0 < rank && src[d0] * os[d0] == total;
    const int64_t count = shared ? os[d0] : 1, slice = total / count;
    // Blocks of the shared axis over the cores, each core's in a ring of three
    // (gathered_stream): a block's gathers run while the next blocks come in and the
    // one before goes out (two blocks a core at least). The whole tensor on one core, its load, gathers and
    // store one after another, took BERT's K transpose ([8, 128, 12, 64] perm
    // [0, 2, 3, 1], bf16) 7,771 cycles on v3 with the second core idle.
    const int64_t S = kRingSlots;
    int64_t per2 = std::min(count, (count + 2 * cores_ - 1) / (2 * cores_));
    while (per2 > 0 && static_cast<uint64_t>(2 * S * align_up(per2 * slice, kAlign)) > opt_.target.vmem_bytes) --per2;
    if (shared && per2 > 0 && count > per2) {
      const int64_t bytes = align_up(per2 * slice, kAlign);
      auto block = [&](int64_t k) { return std::make_pair(k * per2, std::min(per2, count - k * per2)); };
      gathered_stream(
          (count + per2 - 1) / per2,
          [&](int64_t k, int64_t slot, int flag) {
            const auto [b0, nb] = block(k);
            dma_on(flag, vmem(slot * bytes), hbm(X.addr + b0 * slice), nb * slice, "");
          },
          [&](int64_t k, int64_t slot, int flag) {
            Shape part = os;
            part[d0] = block(k).second;
            run_gathers(slot * bytes, (S + slot) * bytes, strided_copies(dst, src, part, e), flag);
          },
          [&](int64_t k, int64_t slot, int flag) {
            const auto [b0, nb] = block(k);
            dma_on(flag, hbm(y + b0 * slice), vmem((S + slot) * bytes), nb * slice, "");
          });
      return;
    }
    int64_t per = count;
    while (per > 0 && !staging_fits(per * slice, per * slice)) --per;
    if (per > 0) {
      for (int64_t b0 = 0; b0 < count; b0 += per) {
        const int64_t k = std::min(per, count - b0);
        Shape part = os;
        if (shared) part[d0] = k;
        staged_gather(X.addr + b0 * slice, k * slice, y + b0 * slice, k * slice, strided_copies(dst, src, part, e),
                      false, 0.0f, n.type.dtype);
      }
      return;
    }
  }
  for (const Gather& g : direct) dma(hbm(y + g.dst_off), hbm(X.addr + g.src_off), g.run, g.dims);
  wait_dmas();
}

}  // namespace tpusim::compiler::lowering
