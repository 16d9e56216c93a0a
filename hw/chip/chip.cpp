#include "hw/chip/chip.h"

#include <algorithm>

namespace tpusim::hw {

Chip::Chip(const CoreParams& p, exec::Machine& m, const isa::Bundle& b, uint32_t chip,
           const std::function<std::unique_ptr<mem::MemoryPort>()>& make_memory, uint64_t cycle_ps,
           const DmaBeatCycles& calibration_beat, Barrier& barrier, timeline::Timeline* tl, const RemotePort& remote,
           const HostParams& host)
    : index_(chip),
      machine_(m),
      hub_(std::make_unique<MemoryHub>(make_memory(), cycle_ps)),
      host_(std::make_unique<HostLink>(host)),
      // Its own requester number for the memory's per-source statistics: after the cores'.
      remote_hbm_(std::make_unique<RemoteHbm>(*hub_, p.dma, b.target.cores_per_chip)) {
  if (tl) hub_->port().set_timeline(tl, "chip" + std::to_string(chip), cycle_ps);  // per-channel HBM counters
  bool host_reads = false;
  for (uint32_t c = 0; c < b.target.cores_per_chip; ++c) {
    const isa::CoreProgram* prog = nullptr;
    for (const auto& cp : b.cores)
      if (cp.chip == chip && cp.core == c) prog = &cp;
    if (prog)
      for (const auto& in : prog->code) host_reads |= in.op == isa::Op::kDma && in.src.space == isa::Space::kHost;
    cores_.push_back(std::make_unique<TensorCore>(p, m, chip, c, prog, barrier, *hub_, calibration_beat.read,
                                                  calibration_beat.write, tl, remote, *host_));
  }
  for (auto& c : cores_) c->set_infeed_possible(host_reads);
  // The HBM ends of transfers to or from other chips join the chip's HBM
  // bandwidth counter (kept on its core 0 DMA track's process).
  if (tl) remote_hbm_->set_timeline(tl, tl->track("chip" + std::to_string(chip), "core0.dma"));
}

// A core without a program never has an event, so its tick is a skip of one cycle
// (the counters the same); on a pod slice whose programs use core 0 only that
// halves the cores the board ticks.
void Chip::tick(uint64_t cycle) {
  hub_->tick(cycle);
  // The cores take turns going first: the DMA engines of the core that ticks first
  // fill the memory port's queues before the others see them, and a fixed order
  // made core 1 of a v3-8 chip wait twice as long on HBM as core 0 under load
  // (a 64 MiB all-reduce: 241 K against 114 K cycles); the memory is shared fairly.
  const size_t n = cores_.size();
  for (size_t i = 0; i < n; ++i) {
    auto& c = cores_[(cycle + i) % n];
    if (c->has_program()) c->tick(cycle);
    else c->skip(1);
  }
  // After the cores: a push one of them started this cycle issues its first reads now.
  if (!remote_hbm_->idle()) remote_hbm_->tick(cycle);
}

void Chip::set_quiet_units_skip(bool on) {
  for (auto& c : cores_) c->set_quiet_units_skip(on);
}

void Chip::settle() {
  for (auto& c : cores_) c->settle();
}

void Chip::skip(uint64_t n) {
  for (auto& c : cores_) c->skip(n);
}

uint64_t Chip::next_event_cycle(uint64_t now) const {
  uint64_t next = std::min(hub_->next_event_cycle(now), remote_hbm_->next_event_cycle(now));
  for (const auto& c : cores_)
    if (c->has_program()) next = std::min(next, c->next_event_cycle(now));
  return next;
}

bool Chip::done() const {
  if (!remote_hbm_->idle()) return false;  // writes of a landed transfer still going
  for (const auto& c : cores_)
    if (!c->done()) return false;
  return true;
}

std::string Chip::fault() const {
  for (const auto& c : cores_)
    if (!c->fault().empty()) return c->fault();
  return {};
}

uint64_t Chip::last_activity_cycle() const {
  uint64_t t = remote_hbm_->last_activity_cycle();
  for (const auto& c : cores_) t = std::max(t, c->last_activity_cycle());
  return t;
}

}  // namespace tpusim::hw
