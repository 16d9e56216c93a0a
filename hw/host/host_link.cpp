#include "hw/host/host_link.h"

#include <algorithm>
#include <cmath>

namespace tpusim::hw {

HostParams HostParams::from_config(const config::Params& c) {
  HostParams p;
  p.latency_cycles = c.get_double("host.hbm_to_host.latency_cycles");
  p.cycles_per_kib = c.get_double("host.hbm_to_host.cycles_per_kib");
  // Absent from a preset: the host has every byte ready from the start.
  p.infeed_bytes_per_s = c.has("host.infeed_bytes_per_s") ? c.get_double("host.infeed_bytes_per_s") : 0.0;
  p.batch_prep_us = c.has("host.batch_prep_us") ? c.get_double("host.batch_prep_us") : 0.0;
  p.clock_hz = c.get_double("clock_hz");
  const auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw config::ConfigError(c.source() + ": " + what);
  };
  need(p.latency_cycles >= 0 && p.latency_cycles <= 1e12, "host.hbm_to_host.latency_cycles must be in 0..1e12");
  need(p.cycles_per_kib >= 0 && p.cycles_per_kib <= 1e9, "host.hbm_to_host.cycles_per_kib must be in 0..1e9");
  need(p.infeed_bytes_per_s == 0 || (p.infeed_bytes_per_s >= 1 && p.infeed_bytes_per_s <= 1e15),
       "host.infeed_bytes_per_s must be 0 (bytes ready from the start) or in 1..1e15");
  need(p.batch_prep_us >= 0 && p.batch_prep_us <= 1e9, "host.batch_prep_us must be in 0..1e9");
  need(p.clock_hz > 0, "clock_hz must be positive");
  // Shown by `tpusim presets` beside the rate the transfers are timed at; no
  // transfer reads it, but a nonsense value must not pass for a setting.
  if (c.has("host.pcie_bytes_per_s")) {
    const double pcie = c.get_double("host.pcie_bytes_per_s");
    need(pcie >= 1 && pcie <= 1e15,
         "host.pcie_bytes_per_s must be in 1..1e15 (the link's nominal rate; transfers are timed by "
         "host.hbm_to_host)");
  }
  return p;
}

uint64_t HostLink::transfer(uint64_t bytes, bool infeed, uint64_t cycle) {
  const double b = static_cast<double>(bytes);
  double begin = static_cast<double>(cycle);
  if (infeed) {
    ++batches;
    double produce = p_.batch_prep_us * 1e-6 * p_.clock_hz;
    if (p_.infeed_bytes_per_s > 0) produce += b / p_.infeed_bytes_per_s * p_.clock_hz;
    producer_free_ += produce;
    const double link_ready = std::max(begin, link_free_[0]);
    if (producer_free_ > link_ready) producer_wait_cycles += producer_free_ - link_ready;
    begin = std::max(begin, producer_free_);
  }
  double& free = link_free_[infeed ? 0 : 1];
  begin = std::max(begin, free);
  const double ser = b * p_.cycles_per_kib / 1024.0;
  free = begin + ser;
  (infeed ? bytes_in : bytes_out) += bytes;
  const double done = std::ceil(begin + ser + p_.latency_cycles);
  return std::max<uint64_t>(cycle + 1, static_cast<uint64_t>(done));
}

void HostLink::infeed_pending(uint32_t core, int flag, int delta) {
  if (flag < 0) return;
  int& n = pending_[{core, flag}];
  n += delta;
  if (n <= 0) pending_.erase({core, flag});
}

bool HostLink::infeed_pending(uint32_t core, int flag) const { return pending_.count({core, flag}) != 0; }

}  // namespace tpusim::hw
