// The HBM end of transfers with an endpoint on another chip, on one chip: the
// reads of a source in this chip's HBM (a push it issues, or a pull that asked it
// for data) and the writes of data that landed in its HBM. They go through the
// chip's MemoryHub in core.dma.chunk_bytes beats, as the DMA engines' own, so
// they compete with the cores' local traffic for the same memory.
//  * reads: beat by beat from the data leg's start, no faster than the
//    hbm_to_vmem streaming rate; each time the bytes read in order cross a
//    network packet boundary (or reach the end) `progress` releases them to the
//    gated network message (ici::Network::release), so congestion in HBM delays
//    the packets and the link rate paces nothing here.
//  * writes: the landed message's beats from the cycle after it landed, no faster
//    than the vmem_to_hbm rate; the transfer retires (bytes visible, rflag raised,
//    by `retire`) when its writes are done and every transfer that landed on this
//    chip before it has retired, so data and flags become visible in landing
//    order, as they did when a landing was visible at once.
// Everything runs from the chip's own tick (Chip::tick): a transfer is handed in
// by a network delivery that touched this chip, or by one of its own cores.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "hw/dma/dma_engines.h"
#include "hw/timeline/timeline.h"

namespace tpusim::hw {

class RemoteHbm {
 public:
  struct Beat {
    uint64_t addr;
    uint32_t bytes;
  };
  using Progress = std::function<void(uint64_t bytes_in_order, uint64_t cycle)>;
  using Retire = std::function<void(uint64_t cycle)>;

  RemoteHbm(MemoryHub& hub, const DmaParams& p, uint32_t source);

  // The HBM beats of a transfer's source (src_side) or destination, in the order
  // the transfer's bytes travel.
  std::vector<Beat> beats(const exec::DmaPlan& plan, bool src_side) const;
  // Reads `beats` from cycle `first` on (>= the cycle of the next tick).
  void read(std::vector<Beat> beats, uint64_t first, uint64_t step_bytes, Progress progress);
  // A transfer landed at cycle `now`: writes `beats` (none for a VMEM or SMEM
  // destination) from `first` on, then retires it in landing order. Retires at
  // once, inside this call, when there is nothing to write or wait for.
  void land(std::vector<Beat> beats, uint64_t now, uint64_t first, Retire retire);

  void tick(uint64_t cycle);
  // Adds each transfer's bytes, once all its beats are back, to the chip's
  // "HBM bandwidth (GB/s)" counter (the process of `track`) over its span.
  void set_timeline(timeline::Timeline* tl, timeline::TrackId track) {
    tl_ = tl;
    track_ = track;
  }
  uint64_t next_event_cycle(uint64_t now) const;
  bool idle() const { return reads_.empty() && landings_.empty(); }
  uint64_t last_activity_cycle() const { return last_activity_; }
  // stats.json: the remote traffic this chip's HBM carried.
  nlohmann::json stats_json() const;

 private:
  struct Stream {
    bool write = false;
    std::vector<Beat> beats;
    uint64_t first = 0;
    double cycles_per_byte = 0;
    size_t issued = 0, landed = 0;
    uint64_t bytes_issued = 0;
    // Reads: which beats are back, the in-order prefix and the next report.
    std::vector<char> back;
    size_t prefix = 0;
    uint64_t prefix_bytes = 0, total_bytes = 0, step = 0, next_report = 0;
    Progress progress;
    Retire retire;
    uint64_t serial = 0;
  };
  uint64_t next_issue(const Stream& s) const {
    return s.first + static_cast<uint64_t>(static_cast<double>(s.bytes_issued) * s.cycles_per_byte);
  }
  bool issue(Stream& s, uint64_t cycle);  // false on back-pressure
  Stream* add(std::unique_ptr<Stream> s, bool write);

  void count(const Stream& s, uint64_t cycle) const;

  MemoryHub& hub_;
  DmaParams p_;
  timeline::Timeline* tl_ = nullptr;
  timeline::TrackId track_{};
  uint32_t source_;
  uint64_t next_serial_ = 1;
  std::vector<std::unique_ptr<Stream>> reads_;
  std::deque<std::unique_ptr<Stream>> landings_;  // landing order
  std::unordered_map<uint64_t, Stream*> by_serial_;
  MemoryHub::Sink sink_;
  std::vector<uint64_t> landed_;  // tokens from the hub
  bool backpressured_ = false;
  uint64_t last_activity_ = 0;
  uint64_t read_transfers_ = 0, write_transfers_ = 0, bytes_read_ = 0, bytes_written_ = 0;
  uint64_t stall_backpressure_cycles_ = 0;
};

}  // namespace tpusim::hw
