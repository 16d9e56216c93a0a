#include "hw/hbm/hbm_memory.h"

#include "hw/timeline/timeline.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tpusim::hbm {

HbmMemory::HbmMemory(const HbmConfig& cfg) : cfg_(cfg), clock_(cfg.clock_hz), decoder_(cfg_) {
  channels_.reserve(cfg_.channels());
  // Channels keep a pointer to cfg_, which lives as long as they do.
  for (uint32_t i = 0; i < cfg_.channels(); ++i) channels_.emplace_back(cfg_, i);
  bursts_per_channel_.assign(cfg_.channels(), 0);
  sample_interval_ = cfg_.sample_interval_cycles;
  next_sample_ = sample_interval_;
}

bool HbmMemory::try_enqueue(const mem::MemRequest& req, uint64_t now_ps) {
  if (req.bytes == 0) throw std::invalid_argument("HBM request " + std::to_string(req.id) + ": zero bytes");
  if (req.addr >= cfg_.capacity_bytes() || req.bytes > cfg_.capacity_bytes() - req.addr)
    throw std::invalid_argument("HBM request " + std::to_string(req.id) + ": bytes [" + std::to_string(req.addr) +
                                ", " + std::to_string(req.addr + req.bytes) + ") run past the capacity of " +
                                std::to_string(cfg_.capacity_bytes()) + " bytes");
  advance_to(now_ps);
  const uint32_t shift = cfg_.mapping.offset_bits;
  const uint64_t first = req.addr >> shift, last = (req.addr + req.bytes - 1) >> shift;
  // All or nothing: a request never sits half in the queues.
  if (memo_bytes_ != req.bytes || memo_addr_ != req.addr) {
    memo_counts_.clear();
    decoder_.decode(req.addr, req.bytes, memo_bursts_);
    for (const DecodedAddress& d : memo_bursts_) ++bursts_per_channel_[d.channel];
    for (const DecodedAddress& d : memo_bursts_) {
      const uint32_t ch = d.channel;
      if (bursts_per_channel_[ch]) memo_counts_.push_back({ch, bursts_per_channel_[ch]}), bursts_per_channel_[ch] = 0;
    }
    memo_addr_ = req.addr, memo_bytes_ = req.bytes;
  }
  for (const auto& [ch, n] : memo_counts_) {
    if (n > cfg_.queue_entries)  // would be refused forever
      throw std::invalid_argument("HBM request " + std::to_string(req.id) + ": " + std::to_string(req.bytes) +
                                  " bytes need " + std::to_string(n) + " bursts in pseudo-channel " +
                                  std::to_string(ch) + ", more than its queue holds (hbm.queue_entries = " +
                                  std::to_string(cfg_.queue_entries) + ")");
    if (!channels_[ch].has_room(n)) {
      ++rejected_;
      return false;
    }
  }
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = uint32_t(slots_.size());
    slots_.emplace_back();
  }
  slots_[slot] = {req.id, now_ps, 0, uint32_t(last - first + 1), req.source, req.is_write};
  for (const DecodedAddress& d : memo_bursts_) {
    channels_[d.channel].enqueue({slot, uint16_t(d.bank_group * cfg_.banks_per_group + d.bank),
                                  uint16_t(d.bank_group), d.row, d.column, next_cycle_, req.is_write});
  }
  ++outstanding_;
  if (req.is_write) ++requests_write_, bytes_written_ += req.bytes;
  else ++requests_read_, bytes_read_ += req.bytes;
  return true;
}

void HbmMemory::advance_to(uint64_t t_ps) {
  if (t_ps < now_ps_)
    throw std::logic_error("HBM: advance_to(" + std::to_string(t_ps) + " ps) is before the current time " +
                           std::to_string(now_ps_) + " ps");
  advance_cycles_to(clock_.last_cycle_at_or_before(t_ps) + 1);
  now_ps_ = t_ps;
}

uint64_t HbmMemory::next_active_cycle() const {
  uint64_t k = kNeverCycle;
  for (const auto& ch : channels_) k = std::min(k, ch.next_try());
  return std::max(k, next_cycle_);
}

uint64_t HbmMemory::next_event_ps() const {
  uint64_t t = completions_.empty() ? mem::kNever : completions_.top().done_ps;
  uint64_t k = kNeverCycle;
  for (const auto& ch : channels_)
    if (ch.queued()) k = std::min(k, ch.next_try());
  if (k != kNeverCycle) t = std::min(t, clock_.cycle_to_ps(std::max(k, next_cycle_)));
  return t;
}

bool HbmMemory::pop_completion(mem::MemCompletion& out) {
  if (completions_.empty() || completions_.top().done_ps > now_ps_) return false;
  out = completions_.top();
  completions_.pop();
  --outstanding_;
  return true;
}

void HbmMemory::set_timeline(timeline::Timeline* tl, const std::string& process, uint64_t cycle_ps) {
  tl_ = tl;
  tl_channels_.clear();
  if (!tl_) return;
  tl_cycle_ps_ = std::max<uint64_t>(1, cycle_ps);
  tl_interval_ = cfg_.sample_interval_cycles ? cfg_.sample_interval_cycles : kTimelineIntervalCycles;
  tl_next_ = (next_cycle_ / tl_interval_ + 1) * tl_interval_;
  tl_bursts_seen_ = 0;
  tl_nonzero_ = 0;
  for (uint32_t i = 0; i < channel_count(); ++i) {
    TimelineChannel t;
    const std::string unit = "hbm.ch" + std::to_string(i);
    t.track = tl_->track(process, unit);
    t.bw_name = unit + " GB/s";
    t.queued_name = unit + " queued";
    t.bursts_before = channels_[i].counters().reads + channels_[i].counters().writes;
    tl_bursts_seen_ += t.bursts_before;
    tl_channels_.push_back(std::move(t));
  }
}

void HbmMemory::timeline_until(uint64_t c) {
  if (c < tl_next_) return;
  uint64_t bursts = 0;
  size_t queued = 0;
  for (const auto& ch : channels_) bursts += ch.counters().reads + ch.counters().writes, queued += ch.queued();
  const double seconds = double(clock_.cycle_to_ps(tl_interval_)) * 1e-12;
  while (tl_next_ <= c) {
    // Nothing moved since the last boundary, nothing waits, and every counter
    // already reads 0: jump over the idle boundaries.
    if (bursts == tl_bursts_seen_ && queued == 0 && tl_nonzero_ == 0) {
      tl_next_ = (c / tl_interval_ + 1) * tl_interval_;
      break;
    }
    const uint64_t at = clock_.cycle_to_ps(tl_next_ - tl_interval_) / tl_cycle_ps_;
    for (uint32_t i = 0; i < channel_count(); ++i) {
      TimelineChannel& t = tl_channels_[i];
      const auto& k = channels_[i].counters();
      const uint64_t now = k.reads + k.writes;
      const double bw = double((now - t.bursts_before) * cfg_.burst_bytes()) / seconds * 1e-9;
      t.bursts_before = now;
      const uint64_t q = channels_[i].queued();
      const bool was_zero = t.last_bw == 0 && t.last_queued == 0;
      if (bw != t.last_bw) tl_->counter(t.track, t.bw_name, at, bw), t.last_bw = bw;
      if (q != t.last_queued) tl_->counter(t.track, t.queued_name, at, double(q)), t.last_queued = q;
      const bool is_zero = t.last_bw == 0 && t.last_queued == 0;
      tl_nonzero_ += uint32_t(was_zero && !is_zero);
      tl_nonzero_ -= uint32_t(!was_zero && is_zero);
    }
    tl_bursts_seen_ = bursts;
    tl_next_ += tl_interval_;
  }
}

void HbmMemory::take_samples_until(uint64_t c) {
  if (tl_) timeline_until(c);
  if (sample_interval_ == 0) return;
  while (next_sample_ <= c) {
    if (channels_[0].samples().size() >= kMaxSamplesPerChannel) {
      // Every channel samples at the same boundaries, so channel 0's count is all's.
      sample_interval_ *= 2;
      for (auto& ch : channels_) ch.keep_samples_at_multiples_of(sample_interval_);
      next_sample_ = (next_sample_ + sample_interval_ - 1) / sample_interval_ * sample_interval_;
      continue;
    }
    for (auto& ch : channels_) ch.sample(next_sample_);
    next_sample_ += sample_interval_;
  }
}

void HbmMemory::run_cycle(uint64_t c, bool all_channels) {
  take_samples_until(c);
  for (auto& ch : channels_)
    if (all_channels || ch.next_try() <= c) ch.evaluate(c, done_);
  if (!done_.empty()) finish_bursts();
}

void HbmMemory::finish_bursts() {
  for (const BurstDone& d : done_) {
    Slot& s = slots_[d.slot];
    s.last_end_cycle = std::max(s.last_end_cycle, d.end_cycle);
    if (--s.remaining == 0) {
      const uint64_t done_ps = clock_.cycle_to_ps(s.last_end_cycle);
      completions_.push({s.id, done_ps});
      request_latency_ps_.add(done_ps - s.enqueue_ps);
      free_slots_.push_back(d.slot);
    }
  }
  done_.clear();
}

void HbmMemory::tick() {
  run_cycle(next_cycle_, true);
  now_ps_ = std::max(now_ps_, clock_.cycle_to_ps(next_cycle_));
  ++next_cycle_;
}

void HbmMemory::skip(uint64_t cycles) {
  if (cycles == 0) return;
  advance_cycles_to(next_cycle_ + cycles);
  now_ps_ = std::max(now_ps_, clock_.cycle_to_ps(next_cycle_ - 1));
}

void HbmMemory::advance_cycles_to(uint64_t end_cycle) {
  if (every_cycle_) {
    while (next_cycle_ < end_cycle) tick();
    return;
  }
  while (next_cycle_ < end_cycle) {
    const uint64_t k = next_active_cycle();
    if (k >= end_cycle) {
      take_samples_until(end_cycle - 1);
      next_cycle_ = end_cycle;
      return;
    }
    run_cycle(k, false);
    next_cycle_ = k + 1;
  }
}

nlohmann::json HbmMemory::stats_json() const {
  const uint64_t cycles = next_cycle_;
  const double seconds = double(clock_.cycle_to_ps(cycles)) * 1e-12;
  nlohmann::json per_channel = nlohmann::json::array();
  ChannelCounters sum;
  uint64_t hits = 0;
  mem::LatencyHistogram burst_latency;
  for (const auto& ch : channels_) {
    per_channel.push_back(ch.stats_json(cycles));
    const auto& c = ch.counters();
    sum.reads += c.reads, sum.writes += c.writes, sum.activates += c.activates, sum.refreshes += c.refreshes;
    sum.row_misses += c.row_misses, sum.row_conflicts += c.row_conflicts, sum.turnarounds += c.turnarounds;
    hits += ch.row_hits();
    burst_latency.merge(ch.latency_cycles());
  }
  const uint64_t burst_bytes = uint64_t(sum.reads + sum.writes) * cfg_.burst_bytes();
  return {
      {"model", "hbm"},
      {"preset", cfg_.name},
      {"cycles", cycles},
      {"clock_hz", cfg_.clock_hz},
      {"peak_bytes_per_s", cfg_.peak_bytes_per_s()},
      {"requests", {{"reads", requests_read_}, {"writes", requests_write_}, {"rejected", rejected_}}},
      {"bytes_read", bytes_read_},
      {"bytes_written", bytes_written_},
      {"bursts", {{"reads", sum.reads}, {"writes", sum.writes}}},
      {"bandwidth_bytes_per_s", seconds > 0 ? double(burst_bytes) / seconds : 0.0},
      {"row_hits", hits},
      {"row_misses", sum.row_misses},
      {"row_conflicts", sum.row_conflicts},
      {"activates", sum.activates},
      {"read_write_turnarounds", sum.turnarounds},
      {"refreshes", sum.refreshes},
      {"request_latency_ps", request_latency_ps_.to_json()},
      {"burst_latency_cycles", burst_latency.to_json()},
      {"sample_interval_cycles", sample_interval_},
      {"channels", per_channel},
  };
}

}  // namespace tpusim::hbm
