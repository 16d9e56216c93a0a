// --check-races: flags accesses that break the synchronisation rule of docs/isa.md
// (section 3). The reference completes a DMA at issue, so a racy program still
// gets values there; this checker remembers each DMA as "in flight" for every core
// until that core has waited on its completion flag (the issuer's flag, or the
// destination's rflag), and faults when a core touches the DMA's bytes earlier.
// Happens-before also flows through barriers and through the rflag of a later DMA
// from a core that had already waited. Ranges are the bounding byte ranges of the
// access (conservative for interleaved strided transfers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "isa/exec/semantics.h"

namespace tpusim::exec {

class RaceChecker {
 public:
  static constexpr size_t kNoCore = static_cast<size_t>(-1);
  explicit RaceChecker(size_t cores) : cores_(cores) {}

  // Core `who` reads or writes [lo, hi) of `mem`; throws Fault on a race.
  void access(size_t who, const Memory* mem, int64_t lo, int64_t hi, bool write) const;
  // After the DMA's own accesses were checked with access().
  void dma_issued(size_t who, const DmaPlan& p, size_t dest, const std::string& where);
  void wait_satisfied(size_t who, int flag);
  void barrier_released();

  // Bounding byte ranges a DMA reads and writes.
  static void dma_spans(const DmaPlan& p, int64_t& src_lo, int64_t& src_hi, int64_t& dst_lo, int64_t& dst_hi);

 private:
  struct Record {
    uint64_t id;
    const Memory* src;
    int64_t src_lo, src_hi;
    const Memory* dst;
    int64_t dst_lo, dst_hi;
    size_t issuer, dest;
    int flag, rflag;
    std::vector<bool> observed;
    std::vector<uint64_t> inherited;  // records the issuer had observed at issue
    std::string where;
  };
  void observe(size_t who, Record& r);
  void collect();

  size_t cores_;
  uint64_t next_id_ = 0;
  std::vector<Record> records_;
};

}  // namespace tpusim::exec
