// --check-races: flags accesses that break the synchronisation rule of docs/isa.md
// (section 3). The reference completes a DMA at issue, so a racy program still
// gets values there; this checker remembers each DMA as "in flight" for every
// agent (a core's instruction stream) until that agent has waited on its
// completion flag (the issuer's flag, or the destination's rflag), and faults when
// it touches the DMA's bytes earlier. Happens-before also flows through barriers,
// through the rflag of a later DMA from an agent that had already waited, from a
// stream to the one it forks, and from a stream's `fadd`/`fset` of a flag to
// another stream of its core that waits on that flag. Accesses are compared byte
// for byte: a strided transfer's gaps are not part of it, so two interleaved
// strided DMAs (the column bands of a matmul) do not collide.
// Streams of one core are checked against each other too: a `vld`/`vst`/`ld`/`st`
// (or a DMA's end in the core's own memory) that touches bytes a sibling stream
// touched, one of the two a write, faults unless the sibling's access was ordered
// before it by a flag the sibling released, a fork, or a DMA the sibling issued
// after it (the engines start a DMA only after the vld/vst issued before it).
// Between barriers (an all-reduce has none) a DMA is remembered until every
// running agent has observed it, so on 128 cores thousands are; the checker
// therefore finds an access's DMAs by memory, a wait's by flag, and passes
// knowledge on as prefixes of per-agent logs instead of copies of it (a 128-core
// 256 KiB all-reduce checks in seconds; it took 23 minutes when every access
// scanned every DMA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
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
  // Agents are core * streams + stream; stream 0 of every core runs from the start,
  // the others from the `fork` that starts them (stream_forked).
  explicit RaceChecker(size_t cores, size_t streams = 1);

  // Agent `who` reads or writes `bytes` of `mem`; throws Fault on a race.
  void access(size_t who, const Memory* mem, const BytePattern& bytes, bool write) const;
  // A plain access (vld/vst, ld/st, or a DMA's end in its own core's memory) of
  // agent `who` to its core's `mem`, against what the core's other streams touched
  // (a no-op with one stream a core); throws Fault on a race.
  void sibling_access(size_t who, const Memory* mem, const BytePattern& bytes, bool write);
  // After the DMA's own accesses were checked with access(). `dest` is the core
  // (not agent) whose flag the rflag raises, or kNoCore.
  void dma_issued(size_t who, const DmaPlan& p, size_t dest, const std::string& where);
  void wait_satisfied(size_t who, int flag);
  // `fadd`/`fset` of its core's flag by agent `who`: a later wait on that flag by
  // another stream of the core learns what `who` knows now.
  void flag_released(size_t who, int flag);
  // Agent `parent` forks agent `child` (a stream of the same core), which starts
  // knowing what `parent` knows.
  void stream_forked(size_t parent, size_t child);
  // Agent `who` halts: it touches nothing more, so DMAs need not wait for it.
  void stream_halted(size_t who);
  void barrier_released();

  // DMAs still remembered (not yet observed by every running agent), for tests.
  size_t live_records() const { return live_; }

 private:
  // One DMA in flight for some core. What its issuer had observed when it issued
  // it is the first `known` entries of the issuer's log (in the same epoch), so a
  // core that observes this DMA observes those too without a copy of them.
  struct Record {
    bool live = false;
    const Memory* src = nullptr;
    BytePattern src_bytes;
    const Memory* dst = nullptr;
    BytePattern dst_bytes;
    size_t issuer = 0, seen = 0;  // seen: how many running agents observed it
    uint64_t epoch = 0;
    size_t known = 0;
    std::vector<bool> observed;
    std::string where;
    std::vector<uint32_t> plain;  // the issuer's release snapshot (streams_ > 1)
  };
  Record* find(uint64_t id);
  const Record* find(uint64_t id) const;
  void mark(size_t who, uint64_t id);
  void observe(size_t who, uint64_t id);
  void merge(size_t who, size_t from, size_t upto);
  void retire(uint64_t id);
  void retire_all_seen();

  size_t cores_, streams_, agents_;
  std::vector<bool> running_;  // per agent
  size_t running_count_ = 0;
  uint64_t first_id_ = 0;      // records_[i] is DMA first_id_ + i
  std::deque<Record> records_;  // dead records are dropped from the front
  size_t live_ = 0;
  // Per memory, the DMAs that read or write it (ids ascending; dead ones pruned
  // when they outnumber the live), so an access scans only the DMAs of its memory.
  struct MemoryIndex {
    std::vector<uint64_t> ids;
    size_t dead = 0;
  };
  std::unordered_map<const Memory*, MemoryIndex> by_memory_;
  // (core, flag) -> the DMAs that raise it, in issue order, and per stream of the
  // core how many of them a wait of that stream has already observed.
  struct FlagDmas {
    std::vector<uint64_t> ids;
    std::vector<size_t> taken;
  };
  std::map<std::pair<size_t, int>, FlagDmas> pending_;
  // (core, flag) -> per stream, its log's length at its last fadd/fset of the flag
  // in this epoch (0: none) and its release snapshot then.
  struct Release {
    size_t log = 0;
    std::vector<uint32_t> plain;
  };
  std::map<std::pair<size_t, int>, std::vector<Release>> released_;
  // Per agent, the DMAs it observed since the last barrier, in order; merged_[w *
  // agents + i]: how much of agent i's log agent w has already taken over.
  std::vector<std::vector<uint64_t>> log_;
  std::vector<size_t> merged_;
  uint64_t epoch_ = 0;  // barriers so far

  // Sibling streams' plain accesses (streams_ > 1). Each agent counts its releases
  // (fadd/fset, DMA issues, forks) in rel_; an access is stamped with that count,
  // and agent b has learnt of sibling s's accesses stamped below knows_[b *
  // streams_ + s]. A release's snapshot is what its agent knows then (its own entry
  // = its new count); acquiring one takes the maximum, so knowledge is transitive.
  std::vector<uint32_t> release(size_t who);
  void acquire(size_t who, const std::vector<uint32_t>& snapshot);
  std::vector<uint32_t> rel_, knows_;
  // Per memory of a core that has forked (a barrier orders only stream 0s, so it
  // leaves these as they are): per grain of bytes
  // (4 B in SMEM-sized memories, 256 B, a bf16 sublane row, in larger ones) the
  // last write (stream, stamp) and each stream's last read since it, in pages of
  // cells allocated as they are touched.
  static constexpr uint8_t kNone = 0xff;
  static constexpr uint32_t kNoRead = UINT32_MAX;
  struct Cell {
    uint8_t writer = kNone;
    uint32_t written = 0;
    uint32_t read[isa::kStreams] = {kNoRead, kNoRead, kNoRead, kNoRead};
  };
  static constexpr int64_t kCellsPerPage = 256;
  struct Shadow {
    int64_t grain = 0;
    std::unordered_map<int64_t, std::unique_ptr<Cell[]>> pages;
    Cell& at(int64_t cell);
  };
  std::unordered_map<const Memory*, Shadow> shadows_;
  std::vector<bool> forked_;  // per core: a second stream has run (before, stream 0 had no sibling)
};

}  // namespace tpusim::exec
