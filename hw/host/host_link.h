// One chip's link to its host: the PCIe link (per direction a FIFO with a per-byte
// serialisation cost and a pipelined fixed latency) and the infeed source on the
// host side, which prepares the bytes that DMAs read from `host:` space at a
// configurable rate. Plain C++; the DMA engines of the chip's cores share it.
//
// Timing of a transfer of B bytes asked for at cycle t (docs/ici.md, "Host link
// and infeed"):
//   host -> chip:  ready = max(producer free, 0) + prep + B / rate   (the infeed source)
//                  begin = max(t, ready, link free);  link free = begin + B * cpb
//                  done  = begin + B * cpb + latency
//   chip -> host:  the same without the infeed source.
// The infeed source starts at cycle 0 and prepares batches back to back in the
// order the DMAs start (one DMA = one batch), so it runs ahead of a program that
// is slower than the host (an unbounded prefetch queue) and a program that is
// faster waits prep + B / rate per batch. Everything is decided when the transfer
// starts, so the model needs no events of its own.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "hw/config/params.h"

namespace tpusim::hw {

struct HostParams {
  double latency_cycles = 0;   // host.hbm_to_host.latency_cycles: fixed part, pipelined
  double cycles_per_kib = 0;   // host.hbm_to_host.cycles_per_kib: link serialisation
  double infeed_bytes_per_s = 0;  // host.infeed_bytes_per_s; 0 = the bytes are ready from the start
  double batch_prep_us = 0;       // host.batch_prep_us: per infeed batch, before its bytes
  double clock_hz = 1e9;
  static HostParams from_config(const config::Params& p);  // throws config::ConfigError
};

class HostLink {
 public:
  explicit HostLink(const HostParams& p) : p_(p) {}

  // A transfer of `bytes` asked for at `cycle`; returns the cycle its last byte has
  // landed (>= cycle + 1). `infeed`: host -> chip, through the infeed source.
  uint64_t transfer(uint64_t bytes, bool infeed, uint64_t cycle);

  // Flags a pending infeed transfer will raise: (core, flag) -> transfers. A
  // sequencer waiting on one of them is stalled for infeed.
  void infeed_pending(uint32_t core, int flag, int delta);
  bool infeed_pending(uint32_t core, int flag) const;

  uint64_t bytes_in = 0, bytes_out = 0, batches = 0;
  double producer_wait_cycles = 0;  // cycles transfers waited for the infeed source beyond the link

 private:
  HostParams p_;
  double producer_free_ = 0;    // cycle the infeed source finishes its last batch
  double link_free_[2] = {0, 0};  // per direction: 0 host -> chip, 1 chip -> host
  std::map<std::pair<uint32_t, int>, int> pending_;
};

}  // namespace tpusim::hw
