// One chip: its TensorCores, the HBM behind one memory port shared by their DMA
// engines, and the inbox of its links. Chips never touch each other's state
// directly: a transfer to another chip is a LinkDelivery that lands at least one
// cycle after it was sent, and same-cycle landings apply in (cycle, source chip,
// sequence) order, so a partitioned run could reproduce a single-process one.
#pragma once

#include <memory>
#include <queue>
#include <vector>

#include "hw/chip/core.h"

namespace tpusim::hw {

class Chip {
 public:
  Chip(const CoreParams& p, exec::Machine& m, const isa::Bundle& b, uint32_t chip,
       const std::function<std::unique_ptr<mem::MemoryPort>()>& make_memory, uint64_t cycle_ps,
       Barrier& barrier, timeline::Timeline* tl, std::function<void(LinkDelivery&&)> send_remote);

  void deliver(LinkDelivery&& d);
  void tick(uint64_t cycle);
  void skip(uint64_t n);
  uint64_t next_event_cycle(uint64_t now) const;

  bool done() const;
  std::string fault() const;
  uint64_t last_activity_cycle() const;
  std::vector<std::unique_ptr<TensorCore>>& cores() { return cores_; }
  const std::vector<std::unique_ptr<TensorCore>>& cores() const { return cores_; }
  MemoryHub& hub() { return *hub_; }
  uint32_t index() const { return index_; }

 private:
  struct Later {
    bool operator()(const LinkDelivery& a, const LinkDelivery& b) const {
      if (a.arrive_cycle != b.arrive_cycle) return a.arrive_cycle > b.arrive_cycle;
      if (a.source_chip != b.source_chip) return a.source_chip > b.source_chip;
      return a.sequence > b.sequence;
    }
  };
  uint32_t index_;
  exec::Machine& machine_;
  std::unique_ptr<MemoryHub> hub_;
  std::vector<std::unique_ptr<TensorCore>> cores_;
  std::priority_queue<LinkDelivery, std::vector<LinkDelivery>, Later> inbox_;
  std::string link_fault_;
  uint64_t last_landing_ = 0;
};

}  // namespace tpusim::hw
