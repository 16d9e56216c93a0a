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

int64_t Emitter::Gather::runs() const {
  int64_t n = 1;
  for (size_t at = dims.find("dim="); at != std::string::npos; at = dims.find("dim=", at + 4)) {
    long long count = 0;
    std::sscanf(dims.c_str() + at, "dim=%lld:", &count);
    n *= count;
  }
  return n;
}

int64_t Emitter::gather_in_vmem(int64_t src, int64_t src_bytes, int64_t dst_bytes, const std::vector<Gather>& gathers,
                                bool fill, float fill_value, DType fill_dt, HbmRuns src_runs, const Relayout* relayout) {
  const int64_t rv = align_up(src_bytes, kAlign);  // the relayout's region, if any
  const int64_t sv = relayout ? rv : 0, dv = rv + (relayout ? align_up(relayout->bytes, kAlign) : 0);
  dma(vmem(0), hbm(src), src_bytes / src_runs.runs,
      src_runs.runs > 1 ? dim(src_runs.runs, src_runs.stride, src_bytes / src_runs.runs) : std::string());
  if (fill) fill_vmem(relayout ? rv : dv, relayout ? relayout->bytes : dst_bytes, fill_value, fill_dt);
  wait_dmas();
  if (relayout) {
    const Gather& g = relayout->gather;
    dma(vmem(rv + g.dst_off), vmem(g.src_off), g.run, g.dims);
    wait_dmas();
  }
  run_gathers(sv, dv, gathers);
  return dv;
}

void Emitter::fill_vmem(int64_t addr, int64_t bytes, float value, DType dt) {
  line("vbcast v0, " + fimm(value));
  for (int64_t off = 0; off < bytes; off += kTileElems * esz(dt)) line(std::string(st(dt)) + " v0, " + at(addr + off));
}

void Emitter::run_gathers(int64_t sv, int64_t dv, const std::vector<Gather>& gathers) {
  // Gathers whose bounding ranges are disjoint (a plane each) run at once, and so do
  // disjoint ones (an im2col row's taps) whatever their ranges: the race checker
  // compares the bytes each writes, past a budget of about 1M runs compared (then it
  // answers "they meet"), so only gathers of at most kFreeRuns runs rely on it. One
  // whose range meets an earlier one's otherwise waits for those in flight.
  constexpr int64_t kFreeRuns = 1 << 18;
  std::vector<std::pair<int64_t, int64_t>> in_flight;
  for (const Gather& g : gathers) {
    const auto h = g.dst_hull();
    if (!(g.disjoint && g.runs() <= kFreeRuns))
      for (const auto& f : in_flight)
        if (h.first < f.second && f.first < h.second) {
          wait_dmas();
          in_flight.clear();
          break;
        }
    dma(vmem(dv + g.dst_off), vmem(sv + g.src_off), g.run, g.dims);
    in_flight.push_back(h);
  }
  wait_dmas();
}

void Emitter::staged_gather(int64_t src, int64_t src_bytes, int64_t dst, int64_t dst_bytes,
                            const std::vector<Gather>& gathers, bool fill, float fill_value, DType fill_dt,
                            int64_t planes, int64_t plane_stride, HbmRuns src_runs, HbmRuns dst_runs,
                            const Relayout* relayout) {
  const int64_t dv =
      gather_in_vmem(src, src_bytes, dst_bytes, gathers, fill, fill_value, fill_dt, src_runs, relayout);
  const int64_t part = dst_bytes / planes;
  for (int64_t p = 0; p < planes; ++p)
    dma(hbm(dst + p * plane_stride), vmem(dv + p * part), part / dst_runs.runs,
        dst_runs.runs > 1 ? dim(dst_runs.runs, part / dst_runs.runs, dst_runs.stride) : std::string());
  wait_dmas();
}

}  // namespace tpusim::compiler::lowering
