// Gathers through VMEM (im2col, pooling taps, weight rearrangement). HBM moves
// data in bursts spread over its channels, so a gather whose runs are one element
// long costs one memory request per element; staged through VMEM the HBM side is
// two contiguous transfers and the element-sized runs are VMEM -> VMEM copies.
#include "compiler/lower/emitter.h"

#include <cstdio>
#include <utility>

namespace tpusim::compiler::lowering {

std::pair<int64_t, int64_t> Emitter::Gather::dst_hull() const {
  int64_t lo = dst_off, hi = dst_off + run;
  for (size_t at = dims.find("dim="); at != std::string::npos; at = dims.find("dim=", at + 4)) {
    long long count = 0, src_stride = 0, dst_stride = 0;
    std::sscanf(dims.c_str() + at, "dim=%lld:%lld:%lld", &count, &src_stride, &dst_stride);
    (dst_stride >= 0 ? hi : lo) += (count - 1) * dst_stride;
  }
  return {lo, hi};
}

void Emitter::staged_gather(int64_t src, int64_t src_bytes, int64_t dst, int64_t dst_bytes,
                            const std::vector<Gather>& gathers, bool fill, float fill_value, DType fill_dt,
                            int64_t planes, int64_t plane_stride, const Gather* interleave, HbmRuns src_runs,
                            HbmRuns dst_runs) {
  auto runs = [](const HbmRuns& r, int64_t bytes) {
    return r.runs > 1 ? dim(r.runs, r.stride, bytes / r.runs) : std::string();
  };
  auto hbm_runs = [](const HbmRuns& r, int64_t bytes) {
    return r.runs > 1 ? dim(r.runs, bytes / r.runs, r.stride) : std::string();
  };
  const int64_t sv = 0, dv = align_up(src_bytes, kAlign);
  const int64_t gv = interleave ? dv + align_up(dst_bytes, kAlign) : dv;  // where the gathers write
  dma(vmem(sv), hbm(src), src_bytes / src_runs.runs, runs(src_runs, src_bytes));
  if (fill) {
    // One vst per tile: 8 x 128 elements of the fill value.
    const int64_t tile = kTileElems * esz(fill_dt);
    line("vbcast v0, " + fimm(fill_value));
    for (int64_t off = 0; off < dst_bytes; off += tile) line(std::string(st(fill_dt)) + " v0, " + at(gv + off));
  }
  wait_dmas();
  // Gathers whose bounding ranges are disjoint (a plane each) run at once; one whose
  // range meets an earlier one's (interleaved rows) waits for those in flight.
  std::vector<std::pair<int64_t, int64_t>> in_flight;
  for (const Gather& g : gathers) {
    const auto h = g.dst_hull();
    for (const auto& f : in_flight)
      if (h.first < f.second && f.first < h.second) {
        wait_dmas();
        in_flight.clear();
        break;
      }
    dma(vmem(gv + g.dst_off), vmem(sv + g.src_off), g.run, g.dims);
    in_flight.push_back(h);
  }
  wait_dmas();
  if (interleave) {
    dma(vmem(dv + interleave->dst_off), vmem(gv + interleave->src_off), interleave->run, interleave->dims);
    wait_dmas();
  }
  const int64_t part = dst_bytes / planes;
  for (int64_t p = 0; p < planes; ++p)
    dma(hbm(dst + p * plane_stride), vmem(dv + p * part), part / dst_runs.runs, hbm_runs(dst_runs, part));
  wait_dmas();
}

}  // namespace tpusim::compiler::lowering
