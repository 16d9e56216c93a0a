#include "hw/hbm/hbm_channel.h"

#include <algorithm>

namespace tpusim::hbm {

const char* command_name(Command c) {
  switch (c) {
    case Command::kAct: return "ACT";
    case Command::kPre: return "PRE";
    case Command::kRd: return "RD";
    case Command::kWr: return "WR";
    case Command::kRef: return "REF";
    case Command::kRefSb: return "REFSB";
    default: return "?";
  }
}

namespace {
inline uint64_t bit(uint32_t b) { return uint64_t(1) << b; }
inline int64_t at_least_zero(int64_t v) { return v < 0 ? 0 : v; }
}  // namespace

HbmChannel::HbmChannel(const HbmConfig& cfg, uint32_t index) : cfg_(&cfg), index_(index) {
  const TimingTable& t = cfg.timing;
  const int64_t burst = t.tBURST();
  auto add = [&](Command earlier, Command later, Scope scope, int64_t delay) {
    rules_[size_t(earlier)].push_back({later, scope, uint32_t(at_least_zero(delay))});
  };
  using C = Command;
  // The whole protocol: which command delays which, over which scope, by how much.
  add(C::kAct, C::kAct, kBankScope, t[tRC]);
  add(C::kAct, C::kAct, kGroupScope, t[tRRD_L]);
  add(C::kAct, C::kAct, kChannelScope, t[tRRD_S]);
  add(C::kAct, C::kRd, kBankScope, t[tRCD]);
  add(C::kAct, C::kWr, kBankScope, t[tRCD]);
  add(C::kAct, C::kPre, kBankScope, t[tRAS]);
  add(C::kPre, C::kAct, kBankScope, t[tRP]);
  add(C::kPre, C::kRef, kBankScope, t[tRP]);
  add(C::kPre, C::kRefSb, kBankScope, t[tRP]);
  add(C::kRd, C::kRd, kGroupScope, t[tCCD_L]);
  add(C::kRd, C::kRd, kChannelScope, t[tCCD_S]);
  add(C::kRd, C::kWr, kGroupScope, t[tCCD_L]);
  // The write data must not reach the bus before the read data has left it.
  add(C::kRd, C::kWr, kChannelScope, std::max<int64_t>(t[tCCD_S], int64_t(t[tCL]) + burst + t[tRTRS] - t[tCWL]));
  add(C::kRd, C::kPre, kBankScope, t[tRTP]);
  add(C::kWr, C::kWr, kGroupScope, t[tCCD_L]);
  add(C::kWr, C::kWr, kChannelScope, t[tCCD_S]);
  add(C::kWr, C::kRd, kGroupScope, std::max<int64_t>(t[tCCD_L], int64_t(t[tCWL]) + burst + t[tWTR]));
  add(C::kWr, C::kRd, kChannelScope, std::max<int64_t>(t[tCCD_S], int64_t(t[tCWL]) + burst + t[tWTR]));
  add(C::kWr, C::kPre, kBankScope, int64_t(t[tCWL]) + burst + t[tWR]);
  add(C::kRef, C::kAct, kChannelScope, t[tRFC]);
  add(C::kRefSb, C::kAct, kBankScope, t[tRFCsb]);

  const uint32_t banks = cfg.banks();
  bank_next_.assign(banks, {});
  group_next_.assign(cfg.bank_groups, {});
  open_row_.assign(banks, kClosed);
  closed_for_conflict_.assign(banks, 0);
  all_banks_mask_ = banks == 64 ? ~uint64_t(0) : bit(banks) - 1;
  refresh_interval_ = cfg.refresh_mode == RefreshMode::kAllBank ? t[tREFI] : t[tREFI] / banks;
  // Channels refresh at staggered times, as controllers do, so the whole stack
  // never pauses at once.
  refresh_due_ = refresh_interval_ + refresh_interval_ * index / std::max<uint32_t>(1, cfg.channels());
  next_try_ = refresh_due_;
  queue_.reserve(cfg.queue_entries);
}

void HbmChannel::enqueue(const QueuedBurst& b) {
  account_occupancy(b.arrival_cycle);
  queue_.push_back(b);
  counters_.occupancy_max = std::max<uint64_t>(counters_.occupancy_max, queue_.size());
  next_try_ = std::min(next_try_, b.arrival_cycle);
}

void HbmChannel::account_occupancy(uint64_t up_to_cycle) {
  if (up_to_cycle > occupancy_since_) {
    counters_.occupancy_integral += queue_.size() * (up_to_cycle - occupancy_since_);
    occupancy_since_ = up_to_cycle;
  }
}

uint64_t HbmChannel::earliest(Command cmd, uint32_t bank, uint32_t group) const {
  const size_t k = size_t(cmd);
  uint64_t t = std::max({bank_next_[bank][k], group_next_[group][k], channel_next_[k]});
  if (cmd == Command::kAct && acts_seen_ >= 4) t = std::max<uint64_t>(t, last_acts_[act_ring_pos_] + cfg_->timing[tFAW]);
  return t;
}

void HbmChannel::issue(uint64_t c, Command cmd, uint32_t bank, uint32_t group, uint32_t row) {
  for (const Rule& r : rules_[size_t(cmd)]) {
    const uint64_t at = c + r.delay;
    if (cmd == Command::kRef && r.scope == kBankScope) continue;  // REF has channel-wide rules only
    uint64_t& slot = r.scope == kBankScope    ? bank_next_[bank][size_t(r.next)]
                     : r.scope == kGroupScope ? group_next_[group][size_t(r.next)]
                                              : channel_next_[size_t(r.next)];
    slot = std::max(slot, at);
  }
  switch (cmd) {
    case Command::kAct:
      open_row_[bank] = row;
      open_mask_ |= bit(bank);
      last_acts_[act_ring_pos_] = c;
      act_ring_pos_ = (act_ring_pos_ + 1) % 4;
      ++acts_seen_;
      ++counters_.activates;
      if (closed_for_conflict_[bank]) ++counters_.row_conflicts;
      else ++counters_.row_misses;
      closed_for_conflict_[bank] = 0;
      break;
    case Command::kPre:
      open_row_[bank] = kClosed;
      open_mask_ &= ~bit(bank);
      ++counters_.precharges;
      break;
    case Command::kRef:
    case Command::kRefSb:
      ++counters_.refreshes;
      break;
    default:
      break;
  }
  if (record_) log_.push_back({c, cmd, bank, row});
}

void HbmChannel::start_refresh_if_due(uint64_t c) {
  if (pending_refresh_mask_ || c < refresh_due_) return;
  refresh_due_ += refresh_interval_;
  if (cfg_->refresh_mode == RefreshMode::kAllBank) {
    pending_refresh_mask_ = all_banks_mask_;
    return;
  }
  // Single-bank refresh: every bank once per round; within the round, refresh the
  // bank the queue needs least, so streaming rarely waits on a refreshing bank.
  uint64_t candidates = all_banks_mask_ & ~refreshed_this_round_;
  if (!candidates) {
    refreshed_this_round_ = 0;
    candidates = all_banks_mask_;
  }
  std::array<uint32_t, 64> demand{};
  for (const auto& e : queue_) ++demand[e.bank];
  uint32_t best = 64;
  for (uint32_t b = 0; b < cfg_->banks(); ++b) {
    if (!(candidates & bit(b))) continue;
    if (best == 64) {
      best = b;
      continue;
    }
    const bool fewer = demand[b] < demand[best];
    const bool same_but_closed = demand[b] == demand[best] && (open_mask_ & bit(best)) && !(open_mask_ & bit(b));
    if (fewer || same_but_closed) best = b;
  }
  refreshed_this_round_ |= bit(best);
  pending_refresh_mask_ = bit(best);
}

void HbmChannel::evaluate(uint64_t c, std::vector<BurstDone>& done) {
  start_refresh_if_due(c);
  uint64_t min_next = kNeverCycle;
  const uint32_t per_group = cfg_->banks_per_group;

  // First ready: the oldest row hit whose column command is legal now.
  uint64_t hit_mask = 0;
  int col = -1;
  for (size_t i = 0; i < queue_.size(); ++i) {
    const QueuedBurst& e = queue_[i];
    if (open_row_[e.bank] != e.row) continue;
    hit_mask |= bit(e.bank);
    if (col >= 0) continue;
    const uint64_t t = earliest(e.is_write ? Command::kWr : Command::kRd, e.bank, e.bank_group);
    if (t <= c) col = int(i);
    else min_next = std::min(min_next, t);
  }

  // The row command bus: refresh first, then the oldest request's ACT or PRE.
  bool row_issued = false;
  if (pending_refresh_mask_) {
    const uint64_t open_in = pending_refresh_mask_ & open_mask_;
    if (open_in) {
      for (uint32_t b = 0; b < cfg_->banks(); ++b) {
        if (!(open_in & bit(b))) continue;
        const uint64_t t = earliest(Command::kPre, b, b / per_group);
        if (t <= c && !row_issued) {
          issue(c, Command::kPre, b, b / per_group, 0);
          row_issued = true;
        } else {
          min_next = std::min(min_next, t);
        }
      }
    } else {
      const Command ref = cfg_->refresh_mode == RefreshMode::kAllBank ? Command::kRef : Command::kRefSb;
      uint64_t t = channel_next_[size_t(ref)];
      uint32_t target = 0;
      for (uint32_t b = 0; b < cfg_->banks(); ++b)
        if (pending_refresh_mask_ & bit(b)) t = std::max(t, bank_next_[b][size_t(ref)]), target = b;
      if (t <= c) {
        issue(c, ref, ref == Command::kRef ? 0 : target, target / per_group, 0);
        pending_refresh_mask_ = 0;
        row_issued = true;
      } else {
        min_next = std::min(min_next, t);
      }
    }
  }
  if (!row_issued) {
    uint64_t seen = pending_refresh_mask_;  // no ACT to a bank waiting for its refresh
    for (const QueuedBurst& e : queue_) {
      if (seen & bit(e.bank)) continue;
      seen |= bit(e.bank);
      Command cmd;
      if (open_row_[e.bank] == kClosed) cmd = Command::kAct;
      else if (open_row_[e.bank] != e.row && !(hit_mask & bit(e.bank))) cmd = Command::kPre;
      else continue;
      const uint64_t t = earliest(cmd, e.bank, e.bank_group);
      if (t <= c) {
        if (cmd == Command::kPre) closed_for_conflict_[e.bank] = 1;
        issue(c, cmd, e.bank, e.bank_group, e.row);
        row_issued = true;
        break;
      }
      min_next = std::min(min_next, t);
    }
  }
  if (!row_issued && cfg_->page_policy == PagePolicy::kClosed) {
    const uint64_t idle_open = open_mask_ & ~hit_mask & ~pending_refresh_mask_;
    for (uint32_t b = 0; idle_open && b < cfg_->banks(); ++b) {
      if (!(idle_open & bit(b))) continue;
      const uint64_t t = earliest(Command::kPre, b, b / per_group);
      if (t <= c) {
        issue(c, Command::kPre, b, b / per_group, 0);
        row_issued = true;
        break;
      }
      min_next = std::min(min_next, t);
    }
  }

  if (col >= 0) {
    const QueuedBurst e = queue_[size_t(col)];
    const Command cmd = e.is_write ? Command::kWr : Command::kRd;
    issue(c, cmd, e.bank, e.bank_group, e.row);
    const TimingTable& t = cfg_->timing;
    const uint64_t end = c + (e.is_write ? t[tCWL] : t[tCL]) + t.tBURST();
    done.push_back({e.slot, end});
    latency_cycles_.add(end - e.arrival_cycle);
    ++(e.is_write ? counters_.writes : counters_.reads);
    account_occupancy(c);
    queue_.erase(queue_.begin() + col);
  }

  if (row_issued || col >= 0) {
    next_try_ = c + 1;
  } else {
    next_try_ = min_next;
    if (!pending_refresh_mask_) next_try_ = std::min(next_try_, refresh_due_);
  }
}

void HbmChannel::sample(uint64_t cycle) {
  samples_.push_back({cycle, counters_.reads, counters_.writes, counters_.activates, counters_.refreshes,
                      uint64_t(queue_.size())});
}

nlohmann::json HbmChannel::stats_json(uint64_t elapsed_cycles) const {
  const uint64_t burst = cfg_->burst_bytes();
  const double cycles = double(std::max<uint64_t>(1, elapsed_cycles));
  nlohmann::json j = {
      {"channel", index_},
      {"reads", counters_.reads},
      {"writes", counters_.writes},
      {"bytes", (counters_.reads + counters_.writes) * burst},
      {"row_hits", row_hits()},
      {"row_misses", counters_.row_misses},
      {"row_conflicts", counters_.row_conflicts},
      {"activates", counters_.activates},
      {"precharges", counters_.precharges},
      {"refreshes", counters_.refreshes},
      {"queue_occupancy",
       {{"mean", double(counters_.occupancy_integral +
                        queue_.size() * (elapsed_cycles - std::min(elapsed_cycles, occupancy_since_))) /
                     cycles},
        {"max", counters_.occupancy_max}}},
      {"bandwidth_bytes_per_cycle", double((counters_.reads + counters_.writes) * burst) / cycles},
      {"data_bus_utilization", double((counters_.reads + counters_.writes) * cfg_->timing.tBURST()) / cycles},
      {"latency_cycles", latency_cycles_.to_json()},
  };
  if (!samples_.empty()) {
    nlohmann::json s = nlohmann::json::array();
    for (const auto& x : samples_)
      s.push_back({{"cycle", x.cycle}, {"reads", x.reads}, {"writes", x.writes}, {"activates", x.activates},
                   {"refreshes", x.refreshes}, {"queued", x.queued}});
    j["samples"] = std::move(s);
  }
  return j;
}

}  // namespace tpusim::hbm
