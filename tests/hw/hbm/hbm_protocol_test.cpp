// Random traffic against an independent protocol checker: every command the
// controller issues is replayed against the JEDEC rules written out here pairwise
// (not through the controller's rule table), and the data bus must never carry two
// bursts at once. The same traffic run cycle by cycle (detailed) and event-driven
// (fast) must give the identical command stream, completions and statistics.
#include "hbm_test_util.h"

#include <algorithm>
#include <deque>
#include <random>

namespace tpusim::hbm::testing {
namespace {

using C = Command;
constexpr int64_t kLongAgo = -1000000000;

void check_protocol(const HbmConfig& cfg, const std::vector<IssuedCommand>& log) {
  const auto& t = cfg.timing;
  const int64_t burst = t.tBURST();
  const uint32_t banks = cfg.banks();
  std::vector<int64_t> act(banks, kLongAgo), pre(banks, kLongAgo), rd(banks, kLongAgo), wr(banks, kLongAgo),
      refsb(banks, kLongAgo);
  std::vector<int64_t> open(banks, -1);
  std::vector<int64_t> group_act(cfg.bank_groups, kLongAgo), group_col(cfg.bank_groups, kLongAgo);
  int64_t any_act = kLongAgo, any_col = kLongAgo, any_rd = kLongAgo, any_wr = kLongAgo, ref = kLongAgo;
  std::deque<int64_t> last_four;
  std::vector<std::pair<int64_t, int64_t>> bus;  // data intervals [start, end)
  for (const auto& cmd : log) {
    const int64_t c = int64_t(cmd.cycle);
    const uint32_t b = cmd.bank, g = b / cfg.banks_per_group;
    SCOPED_TRACE(std::string(command_name(cmd.cmd)) + " at " + std::to_string(c) + " bank " + std::to_string(b));
    switch (cmd.cmd) {
      case C::kAct:
        ASSERT_EQ(open[b], -1) << "ACT to an open bank";
        EXPECT_GE(c - pre[b], t[tRP]);
        EXPECT_GE(c - act[b], t[tRC]);
        EXPECT_GE(c - group_act[g], t[tRRD_L]);
        EXPECT_GE(c - any_act, t[tRRD_S]);
        if (last_four.size() == 4) {
          EXPECT_GE(c - last_four.front(), t[tFAW]);
        }
        EXPECT_GE(c - ref, t[tRFC]);
        EXPECT_GE(c - refsb[b], t[tRFCsb]);
        open[b] = cmd.row, act[b] = c, group_act[g] = c, any_act = c;
        last_four.push_back(c);
        if (last_four.size() > 4) last_four.pop_front();
        break;
      case C::kRd:
      case C::kWr: {
        const bool is_rd = cmd.cmd == C::kRd;
        ASSERT_EQ(open[b], int64_t(cmd.row)) << "column command to a closed bank or another row";
        EXPECT_GE(c - act[b], t[tRCD]);
        EXPECT_GE(c - group_col[g], t[tCCD_L]);
        EXPECT_GE(c - any_col, t[tCCD_S]);
        if (is_rd) {
          EXPECT_GE(c, any_wr + t[tCWL] + burst + t[tWTR]);
        } else {
          EXPECT_GE(c + t[tCWL], any_rd + t[tCL] + burst + t[tRTRS]);
        }
        const int64_t start = c + (is_rd ? t[tCL] : t[tCWL]);
        bus.push_back({start, start + burst});
        (is_rd ? rd : wr)[b] = c;
        (is_rd ? any_rd : any_wr) = c;
        group_col[g] = c, any_col = c;
        break;
      }
      case C::kPre:
        ASSERT_NE(open[b], -1) << "PRE to a closed bank";
        EXPECT_GE(c - act[b], t[tRAS]);
        EXPECT_GE(c - rd[b], t[tRTP]);
        EXPECT_GE(c, wr[b] + t[tCWL] + burst + t[tWR]);
        open[b] = -1, pre[b] = c;
        break;
      case C::kRef:
        for (uint32_t i = 0; i < banks; ++i) {
          EXPECT_EQ(open[i], -1) << "REF with bank " << i << " open";
          EXPECT_GE(c - pre[i], t[tRP]);
        }
        ref = c;
        break;
      case C::kRefSb:
        EXPECT_EQ(open[b], -1);
        EXPECT_GE(c - pre[b], t[tRP]);
        refsb[b] = c;
        break;
      default:
        FAIL() << "unknown command";
    }
  }
  std::sort(bus.begin(), bus.end());
  for (size_t i = 1; i < bus.size(); ++i) EXPECT_LE(bus[i - 1].second, bus[i].first) << "data bus overlap";
}

struct Offer {
  uint64_t ps;
  mem::MemRequest req;
};

// A mixed pattern in a small region (so rows hit, miss and conflict), with sizes from
// one burst to 512 B at any alignment and bursts of arrivals that overflow the queue.
std::vector<Offer> mixed_traffic(const HbmConfig& cfg, uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::vector<Offer> out;
  uint64_t ps = 0;
  const uint64_t region = std::min<uint64_t>(cfg.capacity_bytes(), 1 << 20);
  for (int i = 0; i < n; ++i) {
    ps += (rng() % 4 == 0) ? rng() % 40000 : rng() % 2000;
    mem::MemRequest r;
    r.id = uint64_t(i);
    r.bytes = uint32_t(1 + rng() % 512);
    r.addr = rng() % (region - r.bytes);
    r.is_write = rng() % 3 == 0;
    out.push_back({ps, r});
  }
  return out;
}

struct RunResult {
  std::vector<IssuedCommand> log;
  std::vector<mem::MemCompletion> done;
  nlohmann::json stats;
};

// Offers each request at its time, retrying every nanosecond while pushed back.
RunResult run(const HbmConfig& cfg, const std::vector<Offer>& offers, bool every_cycle) {
  HbmMemory mem(cfg);
  mem.set_every_cycle(every_cycle);
  for (uint32_t ch = 0; ch < mem.channel_count(); ++ch) mem.channel(ch).record_commands(true);
  RunResult out;
  uint64_t now = 0;
  auto drain = [&] {
    mem::MemCompletion c;
    while (mem.pop_completion(c)) out.done.push_back(c);
  };
  for (const auto& o : offers) {
    now = std::max(now, o.ps);
    while (!mem.try_enqueue(o.req, now)) {
      drain();
      now += 1000;
    }
    drain();
  }
  while (mem.outstanding()) {
    const uint64_t next = mem.next_event_ps();
    EXPECT_NE(next, mem::kNever);
    if (next == mem::kNever) break;
    mem.advance_to(next);
    drain();
  }
  for (uint32_t ch = 0; ch < mem.channel_count(); ++ch) {
    const auto& l = mem.channel(ch).command_log();
    out.log.insert(out.log.end(), l.begin(), l.end());
  }
  out.stats = mem.stats_json();
  return out;
}

void check_config(const HbmConfig& cfg, uint64_t seed) {
  const auto offers = mixed_traffic(cfg, seed, 3000);
  const RunResult fast = run(cfg, offers, false);
  ASSERT_EQ(fast.done.size(), offers.size());
  // Completions come out in (time, id) order.
  for (size_t i = 1; i < fast.done.size(); ++i) {
    const auto& a = fast.done[i - 1];
    const auto& b = fast.done[i];
    ASSERT_TRUE(a.done_ps < b.done_ps || (a.done_ps == b.done_ps && a.id < b.id)) << i;
  }
  HbmMemory probe(cfg);
  if (probe.channel_count() == 1) check_protocol(cfg, fast.log);
  const RunResult detailed = run(cfg, offers, true);
  ASSERT_EQ(detailed.log.size(), fast.log.size());
  for (size_t i = 0; i < fast.log.size(); ++i) {
    ASSERT_EQ(detailed.log[i].cycle, fast.log[i].cycle) << i;
    ASSERT_EQ(detailed.log[i].cmd, fast.log[i].cmd) << i;
    ASSERT_EQ(detailed.log[i].bank, fast.log[i].bank) << i;
  }
  ASSERT_EQ(detailed.done.size(), fast.done.size());
  for (size_t i = 0; i < fast.done.size(); ++i) {
    ASSERT_EQ(detailed.done[i].id, fast.done[i].id);
    ASSERT_EQ(detailed.done[i].done_ps, fast.done[i].done_ps);
  }
  EXPECT_EQ(detailed.stats, fast.stats);
}

TEST(HbmProtocol, OpenPagePerBankRefresh) { check_config(small_config("{tREFI: 3200}"), 1); }
TEST(HbmProtocol, ClosedPagePerBankRefresh) { check_config(small_config("{page_policy: closed, tREFI: 3200}"), 2); }
TEST(HbmProtocol, OpenPageAllBankRefresh) { check_config(small_config("{refresh_mode: all_bank, tREFI: 900}"), 3); }
TEST(HbmProtocol, ShallowQueueBackPressure) { check_config(small_config("{queue_entries: 20, tREFI: 3200}"), 4); }
TEST(HbmProtocol, PresetTimingTable) {
  // The v4 table on one pseudo-channel, so the checker sees every command.
  check_config(load_hbm_preset("hbm2_v4", {"hbm.stacks=1", "hbm.channels_per_stack=1",
                                           "hbm.pseudo_channels_per_channel=1"}),
               5);
}
TEST(HbmModes, FastEqualsDetailedOnAFullPreset) {
  check_config(load_hbm_preset("hbm2_v3", {"hbm.sample_interval_cycles=500"}), 6);
}

TEST(HbmModes, SkipEqualsTicks) {
  const HbmConfig cfg = small_config("{tREFI: 1600, sample_interval_cycles: 97}");
  HbmMemory a(cfg), b(cfg);
  for (auto* m : {&a, &b}) {
    mem::MemRequest r;
    r.id = 1, r.addr = 4096, r.bytes = 1024;
    ASSERT_TRUE(m->try_enqueue(r, 0));
  }
  for (int i = 0; i < 5000; ++i) a.tick();
  b.skip(5000);
  EXPECT_EQ(a.cycle(), b.cycle());
  EXPECT_EQ(a.stats_json(), b.stats_json());
  EXPECT_EQ(a.channel(0).samples().size(), 5000u / 97);
}

}  // namespace
}  // namespace tpusim::hbm::testing
