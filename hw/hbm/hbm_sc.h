// The two SystemC views of one HbmMemory core (docs/hbm.md, "Fidelity modes").
//  * HbmFastModule: event-driven. No clock: the module sleeps until the core's
//    next_event_ps() and does nothing while no request is outstanding.
//  * HbmDetailedModule: wakes on every DRAM clock edge and ticks the core once.
//    The edges are computed exactly from the clock fraction rather than taken from
//    an sc_clock, whose period (e.g. 1137.777... ps at 878.90625 MHz) a 1 ps time
//    grid cannot hold without drifting.
// A requester calls request() from its own process at the current simulation time
// and waits on completion_event(); completions arrive at their done_ps.
#pragma once

#include "hw/hbm/hbm_memory.h"

#include <systemc>

#include <deque>

namespace tpusim::hbm {

class HbmModuleBase : public sc_core::sc_module {
 public:
  HbmModuleBase(const sc_core::sc_module_name& name, const HbmConfig& cfg) : sc_core::sc_module(name), core_(cfg) {}
  // False is back-pressure: retry later.
  virtual bool request(const mem::MemRequest& req) = 0;
  bool take_completion(mem::MemCompletion& out) {
    if (delivered_.empty()) return false;
    out = delivered_.front();
    delivered_.pop_front();
    return true;
  }
  const sc_core::sc_event& completion_event() const { return completed_; }
  const HbmMemory& core() const { return core_; }
  HbmMemory& core() { return core_; }

 protected:
  static uint64_t now_ps() { return sc_core::sc_time_stamp().value() * ps_per_tick(); }
  static uint64_t ps_per_tick() {
    return uint64_t(sc_core::sc_get_time_resolution().to_seconds() * 1e12 + 0.5);
  }
  void deliver() {
    mem::MemCompletion c;
    bool any = false;
    while (core_.pop_completion(c)) delivered_.push_back(c), any = true;
    if (any) completed_.notify(sc_core::SC_ZERO_TIME);
  }
  HbmMemory core_;
  std::deque<mem::MemCompletion> delivered_;
  sc_core::sc_event completed_;
};

class HbmFastModule final : public HbmModuleBase {
 public:
  SC_HAS_PROCESS(HbmFastModule);
  HbmFastModule(const sc_core::sc_module_name& name, const HbmConfig& cfg) : HbmModuleBase(name, cfg) {
    SC_METHOD(wake);
    sensitive << wake_;
    dont_initialize();
  }
  bool request(const mem::MemRequest& req) override {
    const bool ok = core_.try_enqueue(req, now_ps());
    if (ok) schedule();
    return ok;
  }

 private:
  void wake() {
    core_.advance_to(now_ps());
    deliver();
    schedule();
  }
  void schedule() {
    const uint64_t next = core_.next_event_ps();
    if (next == mem::kNever) return;
    const uint64_t now = now_ps();
    // An earlier notification replaces a pending later one, so this never loses a wake-up.
    wake_.notify(sc_core::sc_time::from_value((next > now ? next - now : 0) / ps_per_tick()));
  }
  sc_core::sc_event wake_;
};

class HbmDetailedModule final : public HbmModuleBase {
 public:
  SC_HAS_PROCESS(HbmDetailedModule);
  HbmDetailedModule(const sc_core::sc_module_name& name, const HbmConfig& cfg) : HbmModuleBase(name, cfg) {
    core_.set_every_cycle(true);
    SC_THREAD(clock_edges);
  }
  bool request(const mem::MemRequest& req) override { return core_.try_enqueue(req, now_ps()); }

 private:
  void clock_edges() {
    for (uint64_t k = 0;; ++k) {
      const uint64_t edge = core_.clock().cycle_to_ps(k);
      const uint64_t now = now_ps();
      if (edge > now) wait(sc_core::sc_time::from_value((edge - now) / ps_per_tick()));
      core_.advance_to(now_ps());  // ticks cycle k (and any a request already ticked is skipped)
      deliver();
    }
  }
};

}  // namespace tpusim::hbm
