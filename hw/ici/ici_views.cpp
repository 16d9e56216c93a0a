#include "hw/ici/ici_views.h"

namespace tpusim::ici {

using sc_core::sc_time;
using sc_core::sc_time_stamp;

IciFast::IciFast(sc_core::sc_module_name name, Network& network, sc_time cycle)
    : sc_module(name), net_(network), cycle_(cycle) {
  if (cycle_.value() == 0) throw IciError(std::string(this->name()) + ": cycle time must be > 0");
  SC_THREAD(run);
}

uint64_t IciFast::cycles_now_ceil() const {
  const uint64_t v = sc_time_stamp().value(), c = cycle_.value();
  return (v + c - 1) / c;
}

MessageId IciFast::send(Endpoint src, Endpoint dst, uint64_t bytes, Network::DeliveryCallback cb, int tie_direction) {
  // Everything before the current moment is already decided: catch up, then
  // issue at the first cycle not yet evaluated.
  const uint64_t c = cycles_now_ceil();
  if (net_.now() < c) net_.skip(c - net_.now());
  const MessageId id = net_.send(src, dst, bytes, net_.now(), std::move(cb), tie_direction);
  kick_.notify(sc_core::SC_ZERO_TIME);
  return id;
}

void IciFast::run() {
  const uint64_t c = cycle_.value();
  for (;;) {
    const uint64_t v = sc_time_stamp().value();
    if (v % c == 0) {
      const uint64_t cyc = v / c;
      if (net_.now() < cyc) net_.skip(cyc - net_.now());
      if (net_.next_event() == cyc) net_.tick();
    }
    const uint64_t next = net_.next_event();
    if (next == kNever) {
      wait(kick_);
    } else {
      wait(sc_time::from_value(next * c - v), kick_);
    }
  }
}

IciClocked::IciClocked(sc_core::sc_module_name name, Network& network) : sc_module(name), net_(network) {
  SC_METHOD(on_clock);
  sensitive << clk.pos();
  dont_initialize();
}

}  // namespace tpusim::ici
