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

// g as up to `parts` DMAs, each a range of its outermost dimension's count: a gather
// writes each of its bytes once, so the parts write disjoint bytes.
std::vector<Emitter::Gather> Emitter::Gather::split(int64_t parts) const {
  const size_t at = dims.rfind(", dim=");
  long long count = 0, src_stride = 0, dst_stride = 0;
  if (at == std::string::npos ||
      std::sscanf(dims.c_str() + at, ", dim=%lld:%lld:%lld", &count, &src_stride, &dst_stride) != 3 || parts < 2 ||
      count < 2)
    return {*this};
  parts = std::min<int64_t>(parts, count);
  std::vector<Gather> v;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t c0 = count * p / parts, c1 = count * (p + 1) / parts;
    v.push_back(Gather{src_off + c0 * src_stride, dst_off + c0 * dst_stride, run,
                       dims.substr(0, at) + dim(c1 - c0, src_stride, dst_stride), disjoint});
  }
  return v;
}

void Emitter::run_gathers(int64_t sv, int64_t dv, const std::vector<Gather>& gathers, int flag) {
  // Gathers whose bounding ranges are disjoint (a plane each) run at once, and so do
  // disjoint ones (an im2col row's taps) whatever their ranges: the race checker
  // compares the bytes each writes, past a budget of about 1M runs compared (then it
  // answers "they meet"), so only gathers of at most kFreeRuns runs rely on it. One
  // whose range meets an earlier one's otherwise waits for those in flight.
  constexpr int64_t kFreeRuns = 1 << 18;
  // A copy within VMEM holds a DMA engine for the on-chip path's latency and its
  // bytes (docs/tensorcore.md, "DMA"): waited for at once (nothing else in flight),
  // fewer gathers than engines go as parts of at least kSplitBytes on the idle
  // engines. Left in flight (gathered_stream) they stay whole: there the ring's loads
  // and stores use the other engines, and parts held them all (the cnn step's shifted
  // convs' planes, ~2 K cycles slower each).
  const int64_t per =
      flag >= 0 ? 1 : std::max<int64_t>(1, kDmaEngines / std::max<int64_t>(1, static_cast<int64_t>(gathers.size())));
  std::vector<std::pair<int64_t, int64_t>> in_flight;
  for (const Gather& g : gathers) {
    const auto h = g.dst_hull();
    if (!(g.disjoint && g.runs() <= kFreeRuns))
      for (const auto& f : in_flight)
        if (h.first < f.second && f.first < h.second) {
          if (flag < 0) wait_dmas();
          else wait_flag(flag);
          in_flight.clear();
          break;
        }
    for (const Gather& part : g.split(std::min(per, g.run * g.runs() / kSplitBytes))) {
      if (flag < 0) dma(vmem(dv + part.dst_off), vmem(sv + part.src_off), part.run, part.dims);
      else dma_on(flag, vmem(dv + part.dst_off), vmem(sv + part.src_off), part.run, part.dims);
    }
    in_flight.push_back(h);
  }
  if (flag < 0) wait_dmas();
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
