// One chip: its TensorCores, the HBM behind one memory port shared by their DMA
// engines, and its host link. Chips never touch each other's state directly: a
// transfer with an endpoint on another chip goes to the board's ICI network
// (RemotePort), whose links all have a latency of at least one cycle, so a
// partitioned run could reproduce a single-process one.
#pragma once

#include <memory>
#include <vector>

#include "hw/chip/core.h"
#include "hw/dma/remote_hbm.h"
#include "hw/host/host_link.h"

namespace tpusim::hw {

// Cycles one DMA beat (core.dma.chunk_bytes) takes through an idle copy of the
// memory the preset's published DMA latencies were measured on: the part of each
// latency that memory accounts for. The engines keep the rest as their own head.
struct DmaBeatCycles {
  uint64_t read = 0, write = 0;
};

class Chip {
 public:
  Chip(const CoreParams& p, exec::Machine& m, const isa::Bundle& b, uint32_t chip,
       const std::function<std::unique_ptr<mem::MemoryPort>()>& make_memory, uint64_t cycle_ps,
       const DmaBeatCycles& calibration_beat, Barrier& barrier, timeline::Timeline* tl, const RemotePort& remote,
       const HostParams& host);

  void tick(uint64_t cycle);
  void skip(uint64_t n);
  uint64_t next_event_cycle(uint64_t now) const;
  // Fast mode: idle units are not ticked (TensorCore::set_quiet_units_skip).
  void set_quiet_units_skip(bool on);
  // Applies skipped cycles still owed to units; before reading counters.
  void settle();

  bool done() const;
  std::string fault() const;
  uint64_t last_activity_cycle() const;
  std::vector<std::unique_ptr<TensorCore>>& cores() { return cores_; }
  const std::vector<std::unique_ptr<TensorCore>>& cores() const { return cores_; }
  MemoryHub& hub() { return *hub_; }
  // The HBM end of this chip's transfers with another chip (reads of a source
  // here, writes of what landed here).
  RemoteHbm& remote_hbm() { return *remote_hbm_; }
  const RemoteHbm& remote_hbm() const { return *remote_hbm_; }
  HostLink& host() { return *host_; }
  uint32_t index() const { return index_; }

 private:
  uint32_t index_;
  exec::Machine& machine_;
  std::unique_ptr<MemoryHub> hub_;
  std::unique_ptr<HostLink> host_;
  std::unique_ptr<RemoteHbm> remote_hbm_;
  std::vector<std::unique_ptr<TensorCore>> cores_;
};

}  // namespace tpusim::hw
