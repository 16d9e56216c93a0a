// --check-races: flags accesses that break the synchronisation rule of docs/isa.md
// (section 3). The reference completes a DMA at issue, so a racy program still
// gets values there; this checker remembers each DMA as "in flight" for every core
// until that core has waited on its completion flag (the issuer's flag, or the
// destination's rflag), and faults when a core touches the DMA's bytes earlier.
// Happens-before also flows through barriers and through the rflag of a later DMA
// from a core that had already waited. Accesses are compared byte for byte: a
// strided transfer's gaps are not part of it, so two interleaved strided DMAs (the
// column bands of a matmul) do not collide.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "isa/exec/semantics.h"

namespace tpusim::exec {

// The bytes one access touches: runs of `run` bytes at base + sum_d i_d * stride_d,
// 0 <= i_d < count_d (a DMA end, a vector tile's 8 sublanes, an SMEM word).
struct BytePattern {
  static constexpr int kMaxDims = isa::kMaxDmaDims;
  int64_t base = 0, run = 0;
  int ndims = 0;
  int64_t count[kMaxDims] = {}, stride[kMaxDims] = {};
  int64_t lo = 0, hi = 0;  // bounding range, for messages and a quick reject

  static BytePattern contiguous(int64_t lo, int64_t hi);
  // Runs of `run` bytes; dims given as (count, stride) pairs, any sign, any order.
  static BytePattern strided(int64_t base, int64_t run, int ndims, const int64_t* count, const int64_t* stride);
  static BytePattern dma_src(const DmaPlan& p);
  static BytePattern dma_dst(const DmaPlan& p);
  bool empty() const { return lo >= hi; }
  // Whether some byte is in both (exact; past a work budget of ~1M runs it
  // answers true, the old bounding-range behaviour).
  bool overlaps(const BytePattern& o) const;
};

class RaceChecker {
 public:
  static constexpr size_t kNoCore = static_cast<size_t>(-1);
  explicit RaceChecker(size_t cores) : cores_(cores) {}

  // Core `who` reads or writes `bytes` of `mem`; throws Fault on a race.
  void access(size_t who, const Memory* mem, const BytePattern& bytes, bool write) const;
  // After the DMA's own accesses were checked with access().
  void dma_issued(size_t who, const DmaPlan& p, size_t dest, const std::string& where);
  void wait_satisfied(size_t who, int flag);
  void barrier_released();

 private:
  struct Record {
    uint64_t id;
    const Memory* src;
    BytePattern src_bytes;
    const Memory* dst;
    BytePattern dst_bytes;
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
