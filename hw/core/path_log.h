// What one core did that a run's critical path is walked through
// (hw/system/critical_path.h): every DMA it issued, every wait it passed, its
// barriers and forks, and the stalls of its sequencer that were not on a flag.
// Recorded only when `tpusim run --critical-path` asks for it (RunOptions::
// critical_path): the units check one pointer and record nothing otherwise.
//
// A core writes its own log from its own chip's tick; a flag raised on it by a
// DMA of another core is noted in `raised` by whoever raises it, which runs on
// this core's chip (a local DMA: this chip; a landing from another chip: the
// network's delivery, outside the chips' threads). So the windowed pod runs'
// threads never share a log.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "isa/asm/instr.h"

namespace tpusim::hw {

struct PathLog {
  // Where the time of a DMA goes, by its endpoints (DmaEngines::Kind's classes).
  enum class DmaKind : uint8_t { kHbm, kCoreToCore, kIci, kHost };
  struct Dma {
    uint64_t issued = 0;  // the sequencer issued it into the DMA queue
    uint64_t started = 0;  // an engine took it (the end of its queue wait)
    uint64_t done = 0;     // complete at the issuer (a remote one: the completion is back)
    int32_t op = -1;
    uint8_t stream = 0;
    DmaKind kind = DmaKind::kHbm;
    uint32_t pc = 0;  // the DMA instruction, on `stream`
  };
  // Who last raised a flag, at a cycle: a DMA (its issuer's id and its Dma's
  // index there), or an fset / fadd of this core (dma = kBySelf, from `stream`);
  // core < 0: never raised.
  static constexpr uint32_t kBySelf = UINT32_MAX;
  struct Raise {
    int32_t core = -1;
    uint32_t dma = 0;
    uint64_t at = 0;
    uint8_t stream = 0;
  };
  // A wait, wait.sub or wait.any that issued: the stream reached it at `reached`
  // and it passed at `passed`, on `flag` whose last raise was `by`.
  struct Wait {
    uint64_t reached = 0, passed = 0;
    int32_t op = -1;
    uint8_t stream = 0;
    Raise by;
    uint32_t pc = 0;  // the wait instruction
  };
  // A barrier this core (stream 0) arrived at and was released from (released:
  // UINT64_MAX, the sequencer's kNever, until then).
  struct Barrier {
    uint64_t arrived = 0, released = 0, generation = 0;
    int32_t op = -1;
  };
  // A stretch of the sequencer stalled for a reason other than a flag or a barrier.
  enum class Stall : uint8_t { kDmaQueue, kUnitQueue, kDrain };
  struct StallRun {
    uint64_t begin = 0, end = 0;  // [begin, end)
    Stall why = Stall::kUnitQueue;
  };

  int32_t id = 0;                      // chip * cores per chip + core
  std::vector<Dma> dmas;               // in issue order
  std::vector<Wait> waits;             // in issue order
  std::vector<Barrier> barriers;       // in arrival order
  std::vector<StallRun> stalls;        // ascending, merged when adjacent
  std::vector<std::pair<uint64_t, uint8_t>> forks;  // (cycle, stream started), ascending
  std::array<uint64_t, isa::kStreams> reached{};  // the cycle each stream last issued (it reached its next pc)
  std::array<Raise, isa::kSyncFlags> raised{};   // per flag, its last raise

  void stall(uint64_t begin, uint64_t n, Stall why) {
    if (!stalls.empty() && stalls.back().end == begin && stalls.back().why == why) stalls.back().end = begin + n;
    else stalls.push_back({begin, begin + n, why});
  }
};

// Every core's log, by chip * cores_per_chip + core.
struct PathLogs {
  uint32_t cores_per_chip = 1;
  std::vector<PathLog> cores;
  PathLog& at(uint32_t chip, uint32_t core) { return cores[chip * cores_per_chip + core]; }
  // A DMA's rflag raised on (chip, core): a landing there, by `by` (see above on
  // which thread may call this).
  void raised_by(uint32_t chip, uint32_t core, int flag, const PathLog::Raise& by) {
    at(chip, core).raised[static_cast<size_t>(flag)] = by;
  }
};

}  // namespace tpusim::hw
