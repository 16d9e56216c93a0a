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

  for (int k = 0; k < kCmds; ++k) {
    min_delay_[size_t(k)] = kNeverCycle;
    col_channel_delay_[size_t(k)] = kNeverCycle;
    for (const Rule& r : rules_[size_t(k)]) {
      min_delay_[size_t(k)] = std::min<uint64_t>(min_delay_[size_t(k)], r.delay);
      if (r.scope == kChannelScope && (r.next == C::kRd || r.next == C::kWr))
        col_channel_delay_[size_t(k)] = std::min<uint64_t>(col_channel_delay_[size_t(k)], r.delay);
    }
  }
  const uint32_t banks = cfg.banks();
  bank_next_.assign(banks, {});
  group_next_.assign(cfg.bank_groups, {});
  open_row_.assign(banks, kClosed);
  closed_for_conflict_.assign(banks, 0);
  bank_head_.assign(banks, -1);
  bank_tail_.assign(banks, -1);
  bank_count_.assign(banks, 0);
  bank_writes_.assign(banks, 0);
  hit_count_.assign(banks, 0);
  first_hit_.assign(banks, {-1, -1});
  pool_.resize(cfg.queue_entries);
  for (int32_t i = int32_t(cfg.queue_entries) - 1; i >= 0; --i) free_.push_back(i);
  all_banks_mask_ = banks == 64 ? ~uint64_t(0) : bit(banks) - 1;
  last_act_.assign(banks, 0);
  address_rank_.assign(banks, 0);
  for (uint32_t b = 0; b < banks; ++b) {
    DecodedAddress d;
    d.channel = index, d.bank_group = b / cfg.banks_per_group, d.bank = b % cfg.banks_per_group;
    const uint64_t base = encode_address(cfg, d);
    for (uint32_t o = 0; o < banks; ++o) {
      DecodedAddress e = d;
      e.bank_group = o / cfg.banks_per_group, e.bank = o % cfg.banks_per_group;
      address_rank_[b] += encode_address(cfg, e) < base;
    }
  }
  refresh_interval_ = cfg.refresh_mode == RefreshMode::kAllBank ? t[tREFI] : t[tREFI] / banks;
  // All pseudo-channels refresh at the same times. Staggering them looks kinder but
  // a 4 KiB request spans every pseudo-channel and waits for the slowest: with 64
  // staggered all-bank refreshes some queue was always blocked, and a sequential
  // stream fell to 41% of peak instead of losing tRFC/tREFI.
  refresh_due_ = refresh_interval_;
  next_try_ = refresh_due_;
}

void HbmChannel::enqueue(const QueuedBurst& b) {
  account_occupancy(b.arrival_cycle);
  const int32_t idx = free_.back();
  free_.pop_back();
  pool_[size_t(idx)] = {b, seq_++, -1, bank_tail_[b.bank]};
  if (bank_tail_[b.bank] >= 0) pool_[size_t(bank_tail_[b.bank])].next = idx;
  else bank_head_[b.bank] = idx;
  bank_tail_[b.bank] = idx;
  ++bank_count_[b.bank];
  bank_writes_[b.bank] += b.is_write;
  writes_queued_ += b.is_write;
  nonempty_mask_ |= bit(b.bank);
  if (open_row_[b.bank] == b.row) {
    ++hit_count_[b.bank];
    int32_t& first = first_hit_[b.bank][b.is_write];
    if (first < 0) first = idx;  // the youngest: first only if it is the only one
  }
  ++queued_;
  counters_.occupancy_max = std::max<uint64_t>(counters_.occupancy_max, queued_);
  // The burst's first command (its RD/WR to the open row, else the bank's ACT or
  // PRE) is legal no earlier than its earliest time now: until some command issues,
  // which re-plans next_try_ in evaluate(), nothing else the burst changes can
  // issue sooner. Its arrival alone woke the channel for nothing 15 M times of 107
  // M in a v4-4x4x4 all-reduce (docs/performance.md "Simulation speed").
  const uint32_t open = open_row_[b.bank];
  const Command first = open == b.row ? (b.is_write ? Command::kWr : Command::kRd)
                        : open == kClosed ? Command::kAct
                                          : Command::kPre;
  next_try_ = std::min(next_try_, std::max(b.arrival_cycle, earliest(first, b.bank, b.bank_group)));
}

void HbmChannel::unlink(int32_t entry) {
  const Entry& x = pool_[size_t(entry)];
  const uint32_t b = x.burst.bank;
  const int32_t next = x.next, prev = x.prev;
  if (prev >= 0) pool_[size_t(prev)].next = next;
  else bank_head_[b] = next;
  if (next >= 0) pool_[size_t(next)].prev = prev;
  else bank_tail_[b] = prev;
  // The oldest hit of its kind leaves: the next one is further down the list.
  int32_t& first = first_hit_[b][x.burst.is_write];
  if (first == entry) {
    first = -1;
    for (int32_t e = next; e >= 0; e = pool_[size_t(e)].next) {
      const QueuedBurst& y = pool_[size_t(e)].burst;
      if (y.row == open_row_[b] && y.is_write == x.burst.is_write) {
        first = e;
        break;
      }
    }
  }
  bank_writes_[b] -= pool_[size_t(entry)].burst.is_write;
  writes_queued_ -= pool_[size_t(entry)].burst.is_write;
  if (--bank_count_[b] == 0) nonempty_mask_ &= ~bit(b);
  free_.push_back(entry);
  --queued_;
}

void HbmChannel::account_occupancy(uint64_t up_to_cycle) {
  if (up_to_cycle > occupancy_since_) {
    counters_.occupancy_integral += queued_ * (up_to_cycle - occupancy_since_);
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
      find_first_hits(bank);
      last_acts_[act_ring_pos_] = c;
      last_act_[bank] = c + 1;
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
      hit_count_[bank] = 0;
      first_hit_[bank] = {-1, -1};
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

void HbmChannel::find_first_hits(uint32_t b) {
  hit_count_[b] = 0;
  first_hit_[b] = {-1, -1};
  for (int32_t e = bank_head_[b]; e >= 0; e = pool_[size_t(e)].next) {
    const QueuedBurst& x = pool_[size_t(e)].burst;
    if (x.row != open_row_[b]) continue;
    ++hit_count_[b];
    int32_t& first = first_hit_[b][x.is_write];
    if (first < 0) first = e;
  }
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
  // Among equally idle banks: a closed one (no PRE first), then the one activated
  // longest ago (recently used banks tend to be used again), then the one highest
  // in the address space. Data usually starts at low addresses, which the default
  // mapping puts in bank 0 of each group: refreshing bank 0 first, as this did,
  // made the first small DMA of a program wait tRFCsb for it (the v4 VMEM->HBM 1 KiB
  // calibration came out 8% slow; docs/validation.md, TensorCore calibration).
  uint64_t candidates = all_banks_mask_ & ~refreshed_this_round_;
  if (!candidates) {
    refreshed_this_round_ = 0;
    candidates = all_banks_mask_;
  }
  std::array<uint32_t, 64> demand{};
  for (uint32_t b = 0; b < cfg_->banks(); ++b) demand[b] = bank_count_[b];
  uint32_t best = 64;
  for (uint32_t b = 0; b < cfg_->banks(); ++b) {
    if (!(candidates & bit(b))) continue;
    if (best == 64) {
      best = b;
      continue;
    }
    if (demand[b] != demand[best]) {
      if (demand[b] < demand[best]) best = b;
      continue;
    }
    const bool open_b = (open_mask_ & bit(b)) != 0, open_best = (open_mask_ & bit(best)) != 0;
    if (open_b != open_best) {
      if (!open_b) best = b;
      continue;
    }
    if (last_act_[b] != last_act_[best]) {
      if (last_act_[b] < last_act_[best]) best = b;
      continue;
    }
    if (address_rank_[b] > address_rank_[best]) best = b;
  }
  refreshed_this_round_ |= bit(best);
  pending_refresh_mask_ = bit(best);
}

HbmChannel::Choice HbmChannel::choose(uint64_t c) const {
  Choice ch;
  const uint32_t per_group = cfg_->banks_per_group;
  // Column bus, first ready: the oldest row hit whose RD/WR is legal now. Within a
  // bank only the oldest read hit and the oldest write hit can be that one
  // (first_hit_).
  // While the channel-wide tCCD_S/turnaround limits forbid every queued kind, no
  // column command is legal, and their earliest time is a lower bound on when one
  // can be: skip the walk (most evaluations right after a RD or WR).
  uint64_t col_floor = kNeverCycle;
  if (queued_ > writes_queued_) col_floor = std::min(col_floor, channel_next_[size_t(Command::kRd)]);
  if (writes_queued_) col_floor = std::min(col_floor, channel_next_[size_t(Command::kWr)]);
  const uint64_t col_banks = col_floor > c ? 0 : nonempty_mask_ & open_mask_;
  if (col_floor > c && (nonempty_mask_ & open_mask_)) ch.min_next = col_floor;
  for (uint64_t m = col_banks; m; m &= m - 1) {
    const uint32_t b = uint32_t(__builtin_ctzll(m));
    for (int w = 0; w < 2; ++w) {
      const int32_t e = first_hit_[b][size_t(w)];
      if (e < 0) continue;
      const Entry& x = pool_[size_t(e)];
      const uint64_t t = earliest(w ? Command::kWr : Command::kRd, b, x.burst.bank_group);
      if (t > c) {
        ch.min_next = std::min(ch.min_next, t);
      } else {
        ch.other_col_legal |= ch.col_entry >= 0;
        if (x.seq < ch.col_seq) ch.col_entry = e, ch.col_seq = x.seq;
      }
    }
  }

  // Row bus: a due refresh first, then the oldest request's ACT or PRE, then (closed
  // page) the PRE of an open row nobody is waiting for.
  if (pending_refresh_mask_) {
    const uint64_t open_in = pending_refresh_mask_ & open_mask_;
    if (open_in) {
      for (uint64_t m = open_in; m; m &= m - 1) {
        const uint32_t b = uint32_t(__builtin_ctzll(m));
        const uint64_t t = earliest(Command::kPre, b, b / per_group);
        if (t > c) {
          ch.min_next = std::min(ch.min_next, t);
        } else if (ch.row_bank < 0) {
          ch.row_bank = int32_t(b), ch.row_cmd = Command::kPre, ch.row_for_refresh = true;
        } else {
          ch.other_row_legal = true;
        }
      }
    } else {
      const Command ref = cfg_->refresh_mode == RefreshMode::kAllBank ? Command::kRef : Command::kRefSb;
      uint64_t t = channel_next_[size_t(ref)];
      uint32_t target = 0;
      for (uint64_t m = pending_refresh_mask_; m; m &= m - 1) {
        target = uint32_t(__builtin_ctzll(m));
        t = std::max(t, bank_next_[target][size_t(ref)]);
      }
      if (t > c) ch.min_next = std::min(ch.min_next, t);
      else ch.row_bank = int32_t(target), ch.row_cmd = ref, ch.row_for_refresh = true;
    }
  }
  if (ch.row_bank >= 0) {
    ch.other_row_legal = true;  // the request row commands were not looked at
    return ch;
  }
  for (uint64_t m = nonempty_mask_ & ~pending_refresh_mask_; m; m &= m - 1) {
    const uint32_t b = uint32_t(__builtin_ctzll(m));
    const Entry& head = pool_[size_t(bank_head_[b])];
    Command cmd;
    if (open_row_[b] == kClosed) cmd = Command::kAct;
    else if (open_row_[b] != head.burst.row && hit_count_[b] == 0) cmd = Command::kPre;
    else continue;
    const uint64_t t = earliest(cmd, b, head.burst.bank_group);
    if (t > c) {
      ch.min_next = std::min(ch.min_next, t);
    } else {
      ch.other_row_legal |= ch.row_bank >= 0;
      if (head.seq < ch.row_seq)
        ch.row_bank = int32_t(b), ch.row_cmd = cmd, ch.row_seq = head.seq, ch.row_conflict = cmd == Command::kPre;
    }
  }
  if (ch.row_bank >= 0 || cfg_->page_policy != PagePolicy::kClosed) {
    ch.other_row_legal |= ch.row_bank >= 0 && cfg_->page_policy == PagePolicy::kClosed;
    return ch;
  }
  for (uint64_t m = open_mask_ & ~pending_refresh_mask_; m; m &= m - 1) {
    const uint32_t b = uint32_t(__builtin_ctzll(m));
    if (hit_count_[b]) continue;
    const uint64_t t = earliest(Command::kPre, b, b / per_group);
    if (t > c) {
      ch.min_next = std::min(ch.min_next, t);
    } else if (ch.row_bank < 0) {
      ch.row_bank = int32_t(b), ch.row_cmd = Command::kPre;
      // A waiting request for another row makes this PRE a conflict, as in open page.
      ch.row_conflict = (nonempty_mask_ & bit(b)) != 0;
    } else {
      ch.other_row_legal = true;
    }
  }
  return ch;
}

void HbmChannel::evaluate(uint64_t c, std::vector<BurstDone>& done) {
  start_refresh_if_due(c);
  Choice ch = choose(c);
  // A refresh's PRE and a read of the row it closes can both be legal at c; the
  // column command goes first and the PRE follows when tRTP/tWR allow.
  if (ch.row_bank >= 0 && ch.row_cmd == Command::kPre && ch.col_entry >= 0 &&
      pool_[size_t(ch.col_entry)].burst.bank == uint32_t(ch.row_bank))
    ch.row_bank = -1, ch.other_row_legal = true;
  const bool issued = ch.row_bank >= 0 || ch.col_entry >= 0;
  if (ch.row_bank >= 0) {
    const uint32_t b = uint32_t(ch.row_bank);
    const uint32_t group = b / cfg_->banks_per_group;
    if (ch.row_conflict) closed_for_conflict_[b] = 1;
    const uint32_t row = ch.row_cmd == Command::kAct ? pool_[size_t(bank_head_[b])].burst.row : 0;
    issue(c, ch.row_cmd, ch.row_cmd == Command::kRef ? 0 : b, group, row);
    if (ch.row_cmd == Command::kRef || ch.row_cmd == Command::kRefSb) pending_refresh_mask_ = 0;
  }
  Command col_cmd = Command::kRd;
  if (ch.col_entry >= 0) {
    const QueuedBurst e = pool_[size_t(ch.col_entry)].burst;
    col_cmd = e.is_write ? Command::kWr : Command::kRd;
    issue(c, e.is_write ? Command::kWr : Command::kRd, e.bank, e.bank_group, e.row);
    const TimingTable& t = cfg_->timing;
    const uint64_t end = c + (e.is_write ? t[tCWL] : t[tCL]) + t.tBURST();
    done.push_back({e.slot, end});
    latency_cycles_.add(end - e.arrival_cycle);
    ++(e.is_write ? counters_.writes : counters_.reads);
    if (last_col_was_read_ == e.is_write && counters_.reads + counters_.writes > 1) ++counters_.turnarounds;
    last_col_was_read_ = !e.is_write;
    account_occupancy(c);
    unlink(ch.col_entry);
    --hit_count_[e.bank];
  }
  uint64_t next = ch.min_next;
  if (issued) {
    // What was legal now but lost its bus goes next cycle. Otherwise nothing can
    // happen before min_next (issuing only raises earliest times) except what the
    // issue itself made a candidate (the hits of a row just opened, the next
    // burst of the bank, the ACT after a PRE or REF), and every such command
    // waits for a rule of the command issued: a lower bound without a second
    // choose(), which was a third of the simulation time.
    // Column commands that lost to the one issued wait for its channel-wide rule.
    if (ch.other_row_legal) {
      next = c + 1;
    } else {
      uint64_t since = kNeverCycle;
      if (ch.row_bank >= 0) since = min_delay_[size_t(ch.row_cmd)];
      if (ch.col_entry >= 0) since = std::min(since, min_delay_[size_t(col_cmd)]);
      if (ch.other_col_legal) since = std::min(since, col_channel_delay_[size_t(col_cmd)]);
      next = std::max(c + 1, std::min(next, c + since));
    }
  }
  if (!pending_refresh_mask_) next = std::min(next, std::max(c + 1, refresh_due_));
  next_try_ = next;
}

void HbmChannel::sample(uint64_t cycle) {
  samples_.push_back({cycle, counters_.reads, counters_.writes, counters_.activates, counters_.refreshes,
                      uint64_t(queued_)});
}

void HbmChannel::keep_samples_at_multiples_of(uint64_t interval) {
  samples_.erase(std::remove_if(samples_.begin(), samples_.end(),
                                [interval](const ChannelSample& x) { return x.cycle % interval != 0; }),
                 samples_.end());
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
      {"read_write_turnarounds", counters_.turnarounds},
      {"queue_occupancy",
       {{"mean", double(counters_.occupancy_integral +
                        queued_ * (elapsed_cycles - std::min(elapsed_cycles, occupancy_since_))) /
                     cycles},
        {"max", counters_.occupancy_max}}},
      {"bandwidth_bytes_per_cycle", double((counters_.reads + counters_.writes) * burst) / cycles},
      {"bandwidth_bytes_per_s", double((counters_.reads + counters_.writes) * burst) / cycles * double(cfg_->clock_hz)},
      {"data_bus_utilization", double((counters_.reads + counters_.writes) * cfg_->timing.tBURST()) / cycles},
      {"latency_cycles", latency_cycles_.to_json()},
  };
  if (!samples_.empty()) {
    // One array per counter (a column each, ready for numpy): an object per sample
    // cost ~2.4 KB of memory each on the way to stats.json.
    std::vector<uint64_t> cycle, reads, writes, activates, refreshes, queued;
    for (const auto& x : samples_) {
      cycle.push_back(x.cycle), reads.push_back(x.reads), writes.push_back(x.writes);
      activates.push_back(x.activates), refreshes.push_back(x.refreshes), queued.push_back(x.queued);
    }
    j["samples"] = {{"cycle", cycle}, {"reads", reads}, {"writes", writes}, {"activates", activates},
                    {"refreshes", refreshes}, {"queued", queued}};
  }
  return j;
}

}  // namespace tpusim::hbm
