#include "hw/chip/chip.h"

#include <algorithm>

namespace tpusim::hw {

Chip::Chip(const CoreParams& p, exec::Machine& m, const isa::Bundle& b, uint32_t chip,
           const std::function<std::unique_ptr<mem::MemoryPort>()>& make_memory, uint64_t cycle_ps,
           Barrier& barrier, timeline::Timeline* tl, std::function<void(LinkDelivery&&)> send_remote)
    : index_(chip), machine_(m), hub_(std::make_unique<MemoryHub>(make_memory(), cycle_ps)) {
  // One beat through idle copies of the memory: the part of the published DMA
  // latency the memory itself accounts for.
  const uint64_t read_beat = MemoryHub::unloaded_beat_cycles(*make_memory(), p.dma.chunk_bytes, false, cycle_ps);
  const uint64_t write_beat = MemoryHub::unloaded_beat_cycles(*make_memory(), p.dma.chunk_bytes, true, cycle_ps);
  for (uint32_t c = 0; c < b.target.cores_per_chip; ++c) {
    const isa::CoreProgram* prog = nullptr;
    for (const auto& cp : b.cores)
      if (cp.chip == chip && cp.core == c) prog = &cp;
    cores_.push_back(std::make_unique<TensorCore>(p, m, chip, c, prog, barrier, *hub_, read_beat, write_beat, tl,
                                                  send_remote));
  }
}

void Chip::deliver(LinkDelivery&& d) { inbox_.push(std::move(d)); }

void Chip::tick(uint64_t cycle) {
  while (!inbox_.empty() && inbox_.top().arrive_cycle <= cycle) {
    const LinkDelivery& d = inbox_.top();
    try {
      exec::dma_copy(d.plan);
      exec::dma_signal_destination(d.plan);
    } catch (const exec::Fault& e) {
      if (link_fault_.empty()) link_fault_ = "fault: chip" + std::to_string(index_) + " link delivery: " + e.what();
    }
    last_landing_ = std::max(last_landing_, cycle);
    inbox_.pop();
  }
  hub_->tick(cycle);
  for (auto& c : cores_) c->tick(cycle);
}

void Chip::skip(uint64_t n) {
  for (auto& c : cores_) c->skip(n);
}

uint64_t Chip::next_event_cycle(uint64_t now) const {
  uint64_t next = hub_->next_event_cycle(now);
  if (!inbox_.empty()) next = std::min(next, std::max(now + 1, inbox_.top().arrive_cycle));
  for (const auto& c : cores_) next = std::min(next, c->next_event_cycle(now));
  return next;
}

bool Chip::done() const {
  if (!inbox_.empty()) return false;
  for (const auto& c : cores_)
    if (!c->done()) return false;
  return true;
}

std::string Chip::fault() const {
  for (const auto& c : cores_)
    if (!c->fault().empty()) return c->fault();
  return link_fault_;
}

uint64_t Chip::last_activity_cycle() const {
  uint64_t t = last_landing_;
  for (const auto& c : cores_) t = std::max(t, c->last_activity_cycle());
  return t;
}

}  // namespace tpusim::hw
