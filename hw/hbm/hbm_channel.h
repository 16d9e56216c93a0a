// One HBM pseudo-channel: its banks and row buffers, its request queue, and the
// FR-FCFS scheduler that turns queued bursts into ACT/PRE/RD/WR/REF commands.
//
// Time here is DRAM clock cycles. evaluate(c) is everything the channel does at
// cycle c: at most one row command (ACT, PRE, REF) and one column command (RD, WR),
// since HBM has separate row and column command buses. After evaluate, next_try()
// is a lower bound on the next cycle at which evaluate could do anything, so the
// event-driven mode may skip to it and still match the every-cycle mode exactly.
#pragma once

#include "hw/hbm/hbm_config.h"
#include "hw/mem/latency_histogram.h"

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

namespace tpusim::hbm {

enum class Command : uint8_t { kAct, kPre, kRd, kWr, kRef, kRefSb, kCount };
const char* command_name(Command c);

inline constexpr uint64_t kNeverCycle = std::numeric_limits<uint64_t>::max();

struct IssuedCommand {
  uint64_t cycle;
  Command cmd;
  uint32_t bank;  // flat bank index (bank_group * banks_per_group + bank); all banks for REF
  uint32_t row;
};

// A burst waiting in the queue.
struct QueuedBurst {
  uint32_t slot;          // the request it belongs to (owned by HbmMemory)
  uint16_t bank;          // flat
  uint16_t bank_group;
  uint32_t row;
  uint32_t column;
  uint64_t arrival_cycle;
  bool is_write;
};

struct BurstDone {
  uint32_t slot;
  uint64_t end_cycle;  // the cycle the last data beat leaves the bus
};

struct ChannelCounters {
  uint64_t reads = 0, writes = 0;  // bursts
  uint64_t activates = 0, precharges = 0, refreshes = 0;
  uint64_t row_misses = 0;     // ACT to a closed bank
  uint64_t row_conflicts = 0;  // another row was open and had to be closed first
  uint64_t occupancy_integral = 0;  // sum over cycles of queued bursts
  uint64_t occupancy_max = 0;
  uint64_t turnarounds = 0;  // RD after WR or WR after RD on the column bus
};

struct ChannelSample {
  uint64_t cycle;
  uint64_t reads, writes, activates, refreshes, queued;
};

class HbmChannel {
 public:
  HbmChannel(const HbmConfig& cfg, uint32_t index);

  bool has_room(uint32_t bursts) const { return queued_ + bursts <= cfg_->queue_entries; }
  size_t queued() const { return queued_; }
  void enqueue(const QueuedBurst& b);
  // Everything at cycle c; appends finished bursts to `done`.
  void evaluate(uint64_t c, std::vector<BurstDone>& done);
  uint64_t next_try() const { return next_try_; }

  void account_occupancy(uint64_t up_to_cycle);
  void sample(uint64_t cycle);
  // Drops the samples whose cycle is not a multiple of `interval` (HbmMemory's
  // coarsening when the samples reach their cap).
  void keep_samples_at_multiples_of(uint64_t interval);
  const ChannelCounters& counters() const { return counters_; }
  uint64_t row_hits() const {
    return counters_.reads + counters_.writes - counters_.row_misses - counters_.row_conflicts;
  }
  const mem::LatencyHistogram& latency_cycles() const { return latency_cycles_; }
  const std::vector<ChannelSample>& samples() const { return samples_; }
  nlohmann::json stats_json(uint64_t elapsed_cycles) const;

  // Tests read the command stream to check every constraint of the timing table.
  void record_commands(bool on) { record_ = on; }
  const std::vector<IssuedCommand>& command_log() const { return log_; }

 private:
  enum Scope : uint8_t { kBankScope, kGroupScope, kChannelScope };
  struct Rule {
    Command next;
    Scope scope;
    uint32_t delay;
  };
  static constexpr int kCmds = int(Command::kCount);

  uint64_t earliest(Command cmd, uint32_t bank, uint32_t group) const;
  void issue(uint64_t c, Command cmd, uint32_t bank, uint32_t group, uint32_t row);
  void start_refresh_if_due(uint64_t c);
  // The best command each bus could issue at cycle c, and the earliest cycle any
  // candidate becomes legal (for next_try_).
  struct Choice {
    int32_t col_entry = -1;
    uint64_t col_seq = kNeverCycle;
    int32_t row_bank = -1;
    Command row_cmd = Command::kAct;
    bool row_for_refresh = false;
    bool row_conflict = false;  // a PRE that closes a row another request's row displaces
    uint64_t row_seq = kNeverCycle;
    uint64_t min_next = kNeverCycle;
    bool other_col_legal = false;  // a column command besides the chosen one was legal at c
    bool other_row_legal = false;  // a row command besides the chosen one was legal at c (or not looked at)
  };
  Choice choose(uint64_t c) const;
  void unlink(int32_t entry);
  // first_hit_ of bank b after a change of its open row: a walk of its list.
  void find_first_hits(uint32_t b);

  const HbmConfig* cfg_;
  uint32_t index_;
  std::array<std::vector<Rule>, kCmds> rules_;  // by the earlier command
  std::array<uint64_t, kCmds> min_delay_{};     // the shortest rule of each command
  std::array<uint64_t, kCmds> col_channel_delay_{};  // its shortest channel-wide rule to RD or WR
  // Earliest cycle each command may issue, per scope.
  std::vector<std::array<uint64_t, kCmds>> bank_next_;
  std::vector<std::array<uint64_t, kCmds>> group_next_;
  std::array<uint64_t, kCmds> channel_next_{};
  std::array<uint64_t, 4> last_acts_{};  // ring of the last four ACT cycles, for tFAW
  uint32_t act_ring_pos_ = 0;
  uint32_t acts_seen_ = 0;

  static constexpr uint32_t kClosed = std::numeric_limits<uint32_t>::max();
  std::vector<uint32_t> open_row_;
  std::vector<uint8_t> closed_for_conflict_;
  uint64_t open_mask_ = 0;

  // The queue: a pool of entries, threaded into one arrival-ordered list per bank,
  // so the scheduler looks at banks (16) instead of entries (64).
  struct Entry {
    QueuedBurst burst;
    uint64_t seq;  // arrival order within the channel
    int32_t next;  // next entry of the same bank, or -1
    int32_t prev;  // the one before, or -1
  };
  std::vector<Entry> pool_;
  std::vector<int32_t> free_;
  std::vector<int32_t> bank_head_, bank_tail_;
  std::vector<uint32_t> bank_count_;
  std::vector<uint32_t> bank_writes_;  // of bank_count_, how many are writes
  std::vector<uint32_t> hit_count_;  // queued entries for the bank's open row
  // Per bank, its oldest queued read [0] and write [1] to the open row (-1: none):
  // the only column commands first-ready can pick there. Kept up to date on
  // enqueue, issue and ACT/PRE, so choose() need not walk the bank's list: that
  // walk, its entries out of cache, was most of the scheduler's time in a
  // DMA-heavy run (docs/validation.md, "Simulation speed").
  std::vector<std::array<int32_t, 2>> first_hit_;
  uint64_t nonempty_mask_ = 0;
  size_t writes_queued_ = 0;
  uint64_t seq_ = 0;
  size_t queued_ = 0;
  uint64_t next_try_ = kNeverCycle;

  // Refresh: due every refresh_interval_ cycles; pending_refresh_mask_ names the
  // banks the pending REF covers (all of them, or one for single-bank refresh).
  uint64_t refresh_interval_ = 0;
  uint64_t refresh_due_ = 0;
  uint64_t pending_refresh_mask_ = 0;
  uint64_t refreshed_this_round_ = 0;
  // Tie-breaks of the single-bank refresh choice: the last ACT cycle of each bank
  // (+1; 0 = never), and each bank's rank by the address of its first byte.
  std::vector<uint64_t> last_act_;
  std::vector<uint32_t> address_rank_;
  uint64_t all_banks_mask_ = 0;
  bool last_col_was_read_ = true;  // for counting turnarounds

  ChannelCounters counters_;
  uint64_t occupancy_since_ = 0;
  mem::LatencyHistogram latency_cycles_;
  std::vector<ChannelSample> samples_;
  bool record_ = false;
  std::vector<IssuedCommand> log_;
};

}  // namespace tpusim::hbm
