// The memory-port interface: how a requester (the TensorCore's DMA engines) asks a
// memory model WHEN bytes move. Timing only: the requester moves data values itself.
//
// Time is absolute picoseconds, so the core clock and the DRAM clock need no
// conversion at the boundary. A model is a plain C++ object (no SystemC): the
// requester drives it with advance_to() from whatever kernel it lives in.
//
// Contract (docs/hbm.md):
//  * try_enqueue(req, now) first processes everything up to `now`, then accepts the
//    request whole or not at all; false is back-pressure (some queue it needs is
//    full): retry at a later time. `now` never goes backwards.
//  * A request of any size and alignment is split into DRAM bursts by the model; it
//    completes when its last burst does.
//  * advance_to(t) processes everything up to and including time t.
//  * next_event_ps() is the earliest time at which the model's state may change
//    without new requests (a command issue or a completion); UINT64_MAX when no
//    request is outstanding. A requester that sleeps until then misses nothing.
//  * pop_completion() returns completions with done_ps <= the advanced time, in
//    (done_ps, id) order. Same inputs give the same completions, bit for bit.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>

namespace tpusim::timeline {
class Timeline;
}

namespace tpusim::mem {

inline constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

struct MemRequest {
  uint64_t id = 0;       // chosen by the requester; unique among outstanding requests
  uint64_t addr = 0;     // byte address
  uint32_t bytes = 0;    // > 0; any alignment
  bool is_write = false;
  uint32_t source = 0;   // requester number, for per-source statistics
};

struct MemCompletion {
  uint64_t id = 0;
  uint64_t done_ps = 0;  // the time the last byte moved
};

class MemoryPort {
 public:
  virtual ~MemoryPort() = default;
  virtual bool try_enqueue(const MemRequest& req, uint64_t now_ps) = 0;
  virtual void advance_to(uint64_t t_ps) = 0;
  virtual uint64_t next_event_ps() const = 0;
  virtual bool pop_completion(MemCompletion& out) = 0;
  // Requests accepted and not yet popped.
  virtual uint64_t outstanding() const = 0;
  // The theoretical peak the model can move, for utilisation figures.
  virtual double peak_bytes_per_s() const = 0;
  // Everything the model counts, ready to embed into stats.json.
  virtual nlohmann::json stats_json() const = 0;
  // Per-channel counters on the timeline's `process` (e.g. "chip0"), which counts
  // in cycles of `cycle_ps`; models without channels record nothing.
  virtual void set_timeline(timeline::Timeline* tl, const std::string& process, uint64_t cycle_ps) {
    (void)tl, (void)process, (void)cycle_ps;
  }
};

}  // namespace tpusim::mem
