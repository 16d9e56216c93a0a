#include "hw/mem/simple_memory.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace tpusim::mem {

double SimpleMemoryConfig::sustained_bytes_per_s(uint32_t request_bytes) const {
  const double lifetime_s = static_cast<double>(latency_ps) * 1e-12 + static_cast<double>(request_bytes) / bytes_per_s;
  return std::min(bytes_per_s, static_cast<double>(max_outstanding) * static_cast<double>(request_bytes) / lifetime_s);
}

uint32_t SimpleMemoryConfig::outstanding_for_peak(uint32_t request_bytes) const {
  // bytes_per_s x latency / request_bytes, in an order exact for round figures.
  const double in_flight = bytes_per_s * static_cast<double>(latency_ps) / (1e12 * static_cast<double>(request_bytes));
  return static_cast<uint32_t>(std::min(std::ceil(in_flight) + 1, 4294967295.0));
}

SimpleMemoryConfig SimpleMemoryConfig::peak_pipe(double bytes_per_s, uint32_t request_bytes) {
  SimpleMemoryConfig cfg;
  cfg.bytes_per_s = bytes_per_s;
  if (request_bytes > 0 && bytes_per_s > 0)
    cfg.max_outstanding = std::max(cfg.max_outstanding, cfg.outstanding_for_peak(request_bytes));
  return cfg;
}

SimpleMemory::SimpleMemory(const SimpleMemoryConfig& cfg) : cfg_(cfg) {
  if (!(cfg_.bytes_per_s > 0)) throw std::invalid_argument("simple memory: bytes_per_s must be > 0");
  if (cfg_.max_outstanding == 0) throw std::invalid_argument("simple memory: max_outstanding must be > 0");
}

bool SimpleMemory::try_enqueue(const MemRequest& req, uint64_t now_ps) {
  if (req.bytes == 0) throw std::invalid_argument("memory request " + std::to_string(req.id) + ": zero bytes");
  advance_to(now_ps);
  if (outstanding_ >= cfg_.max_outstanding) {
    ++rejected_;
    return false;
  }
  const uint64_t start = std::max(now_ps, pipe_free_ps_);
  const auto transfer_ps = uint64_t(std::ceil(double(req.bytes) * 1e12 / cfg_.bytes_per_s));
  pipe_free_ps_ = start + transfer_ps;
  const uint64_t done = pipe_free_ps_ + cfg_.latency_ps;
  pending_.push({req.id, done});
  ++outstanding_;
  (req.is_write ? writes_ : reads_)++;
  bytes_ += req.bytes;
  latency_ns_.add((done - now_ps) / 1000);
  return true;
}

void SimpleMemory::advance_to(uint64_t t_ps) {
  if (t_ps < now_ps_) throw std::logic_error("simple memory: time went backwards");
  now_ps_ = t_ps;
}

uint64_t SimpleMemory::next_event_ps() const { return pending_.empty() ? kNever : pending_.top().done_ps; }

bool SimpleMemory::pop_completion(MemCompletion& out) {
  if (pending_.empty() || pending_.top().done_ps > now_ps_) return false;
  out = pending_.top();
  pending_.pop();
  --outstanding_;
  return true;
}

nlohmann::json SimpleMemory::stats_json() const {
  return {{"model", "simple"},     {"reads", reads_},   {"writes", writes_},
          {"bytes", bytes_},       {"rejected", rejected_}, {"latency_ns", latency_ns_.to_json()}};
}

}  // namespace tpusim::mem
