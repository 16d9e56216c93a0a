#include "isa/exec/race_checker.h"

#include <algorithm>

namespace tpusim::exec {

void RaceChecker::dma_spans(const DmaPlan& p, int64_t& src_lo, int64_t& src_hi, int64_t& dst_lo, int64_t& dst_hi) {
  int64_t slo = 0, shi = 0, dlo = 0, dhi = 0;
  for (int d = 0; d < p.ndims; ++d) {
    const int64_t n = static_cast<int64_t>(p.dims[d].count) - 1;
    const int64_t so = n * p.dims[d].src_stride, dof = n * p.dims[d].dst_stride;
    (so < 0 ? slo : shi) += so;
    (dof < 0 ? dlo : dhi) += dof;
  }
  const int64_t b = static_cast<int64_t>(p.bytes);
  src_lo = p.src_addr + slo;
  src_hi = p.src_addr + shi + b;
  dst_lo = p.dst_addr + dlo;
  dst_hi = p.dst_addr + dhi + b;
}

void RaceChecker::access(size_t who, const Memory* mem, int64_t lo, int64_t hi, bool write) const {
  if (lo >= hi) return;
  for (const Record& r : records_) {
    if (r.observed[who]) continue;
    if (r.dst == mem && lo < r.dst_hi && r.dst_lo < hi)
      throw Fault(std::string("race: ") + (write ? "writes" : "reads") + " bytes [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + ") of " + mem->name() + " that the DMA at " + r.where +
                  " writes, before waiting on its completion flag");
    if (write && r.src == mem && lo < r.src_hi && r.src_lo < hi)
      throw Fault("race: overwrites bytes [" + std::to_string(lo) + ", " + std::to_string(hi) + ") of " +
                  mem->name() + " that the DMA at " + r.where + " reads, before waiting on its completion flag");
  }
}

void RaceChecker::dma_issued(size_t who, const DmaPlan& p, size_t dest, const std::string& where) {
  if (p.total_bytes() == 0) return;
  Record r;
  r.id = next_id_++;
  r.src = p.src;
  r.dst = p.dst;
  dma_spans(p, r.src_lo, r.src_hi, r.dst_lo, r.dst_hi);
  r.issuer = who;
  r.dest = dest;
  r.flag = p.flag;
  r.rflag = p.rflag;
  r.observed.assign(cores_, false);
  for (const Record& o : records_)
    if (o.observed[who]) r.inherited.push_back(o.id);
  r.where = where;
  records_.push_back(std::move(r));
}

void RaceChecker::observe(size_t who, Record& r) {
  if (r.observed[who]) return;
  r.observed[who] = true;
  for (uint64_t id : r.inherited)
    for (Record& o : records_)
      if (o.id == id) o.observed[who] = true;
}

void RaceChecker::wait_satisfied(size_t who, int flag) {
  for (Record& r : records_)
    if ((r.issuer == who && r.flag == flag) || (r.dest == who && r.rflag == flag)) observe(who, r);
  collect();
}

void RaceChecker::barrier_released() {
  for (Record& r : records_)
    if (std::find(r.observed.begin(), r.observed.end(), true) != r.observed.end())
      std::fill(r.observed.begin(), r.observed.end(), true);
  collect();
}

void RaceChecker::collect() {
  records_.erase(std::remove_if(records_.begin(), records_.end(),
                                [](const Record& r) {
                                  return std::find(r.observed.begin(), r.observed.end(), false) == r.observed.end();
                                }),
                 records_.end());
}

}  // namespace tpusim::exec
