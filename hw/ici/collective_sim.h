// A collective schedule run on the network model: every move becomes one message
// (a DMA from core 0 of the sending chip to core 0 of the receiving chip; for the
// hierarchical algorithm, whose participants are the cores, participant 2 x chip +
// core, from that core to that core, so its on-chip steps use the chip's
// core-to-router paths), issued
// as soon as what it depends on has been delivered:
//  - the moves that last wrote the elements it sends (read after write),
//  - for a reducing move, the moves that last wrote the elements it adds into,
//  - the moves that read the elements it overwrites since they were last written
//    (write after read: the sender's DMA must have left before new data lands).
// No global barrier between steps: a ring runs as a pipeline of data dependences,
// which is what the lowered program's sync flags do. The vector adds are not
// timed here (a VPU adds 4 KiB per cycle, the link moves ~40-90 B), so the result
// is the network's share of the collective.
#pragma once

#include <cstdint>
#include <vector>

#include "hw/ici/collectives.h"
#include "hw/ici/network.h"

namespace tpusim::ici {

struct CollectiveRun {
  uint64_t cycles = 0;             // first issue (cycle `start`) to last delivery
  uint64_t messages = 0;           // moves with bytes (empty moves are skipped)
  uint64_t bytes_moved = 0;        // payload, all moves
  double seconds = 0;              // cycles / clock
  double algorithm_bytes_per_s = 0;  // buffer bytes / seconds
};

// A schedule in flight on a network. start() issues the moves that depend on
// nothing at network.now(); the rest follow from delivery callbacks, so whoever
// advances the network (Network::run, IciFast, IciClocked) drives it. The driver
// and the schedule must outlive the run.
class CollectiveDriver {
 public:
  CollectiveDriver(Network& network, const Schedule& s, int64_t bytes_per_element);
  void start();
  bool done() const { return finished_ == nodes_.size(); }
  CollectiveRun result() const;  // throws IciError if not done

 private:
  struct Node {
    const Move* move = nullptr;
    std::vector<uint32_t> dependents;
    uint32_t waiting = 0;
    uint64_t bytes = 0;
  };
  void issue(uint32_t i, uint64_t t);
  int participants_per_chip() const { return s_.algorithm == Algorithm::kHierarchical ? 2 : 1; }
  void finish(uint32_t i, uint64_t t);
  Network& net_;
  const Schedule& s_;
  int64_t bytes_per_element_;
  std::vector<Node> nodes_;
  size_t finished_ = 0;
  uint64_t start_ = 0, last_ = 0;
  CollectiveRun run_;
};

// Runs `s` with `bytes_per_element` bytes per element, starting at network.now().
// Runs the network until the collective completes (throws IciError on deadlock).
CollectiveRun simulate(Network& network, const Schedule& s, int64_t bytes_per_element);

}  // namespace tpusim::ici
