// The two SystemC views of one Network core (architecture.md, "Fidelity modes"):
//  - IciFast: event-driven, no clock; one thread sleeps until the core's next
//    event (or until a send wakes it) and handles that cycle.
//  - IciClocked: calls tick() on every rising edge of a clock, for waveforms and
//    for checking the fast view; the same core, so the same cycle counts.
// Both hand the DMA engines the same send(): the message is issued at the first
// cycle the network has not evaluated yet, so call it between clock edges (any
// SystemC process at a time that is not a multiple of the cycle) and both views
// issue it at the same cycle.
#pragma once

#include <systemc>

#include "hw/ici/network.h"

namespace tpusim::ici {

class IciFast : public sc_core::sc_module {
 public:
  SC_HAS_PROCESS(IciFast);
  IciFast(sc_core::sc_module_name name, Network& network, sc_core::sc_time cycle);
  MessageId send(Endpoint src, Endpoint dst, uint64_t bytes, Network::DeliveryCallback cb = {}, int tie_direction = +1);
  Network& network() { return net_; }

 private:
  void run();
  uint64_t cycles_now_ceil() const;
  Network& net_;
  sc_core::sc_time cycle_;
  sc_core::sc_event kick_;
};

class IciClocked : public sc_core::sc_module {
 public:
  sc_core::sc_in<bool> clk{"clk"};
  SC_HAS_PROCESS(IciClocked);
  IciClocked(sc_core::sc_module_name name, Network& network);
  MessageId send(Endpoint src, Endpoint dst, uint64_t bytes, Network::DeliveryCallback cb = {}, int tie_direction = +1) {
    return net_.send(src, dst, bytes, net_.now(), std::move(cb), tie_direction);
  }
  Network& network() { return net_; }

 private:
  void on_clock() { net_.tick(); }
  Network& net_;
};

}  // namespace tpusim::ici
