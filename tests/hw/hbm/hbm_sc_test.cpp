// The two SystemC views of the controller, driven by the same requester with the
// same mixed pattern (reads and writes, 32 B to 4 KiB, any alignment, bursts of
// arrivals that hit back-pressure), deliver every completion at the same simulated
// time and end with identical statistics. Also: the fast view stays asleep while
// nothing is outstanding.
#include "hw/hbm/hbm_sc.h"

#include <gtest/gtest.h>

#include <random>

namespace tpusim::hbm {
namespace {

struct Delivered {
  uint64_t id, done_ps, seen_ps;
  bool operator==(const Delivered& o) const { return id == o.id && done_ps == o.done_ps && seen_ps == o.seen_ps; }
};

SC_MODULE(Requester) {
  HbmModuleBase* target = nullptr;
  std::vector<std::pair<uint64_t, mem::MemRequest>> plan;  // (offer time ps, request)
  std::vector<Delivered> got;
  uint64_t retries = 0;

  SC_CTOR(Requester) {
    SC_THREAD(offer);
    SC_THREAD(collect);
  }
  static uint64_t now() { return sc_core::sc_time_stamp().value(); }
  void offer() {
    for (const auto& [at, req] : plan) {
      if (at > now()) wait(sc_core::sc_time::from_value(at - now()));
      while (!target->request(req)) {
        ++retries;
        wait(sc_core::sc_time(1, sc_core::SC_NS));
      }
    }
  }
  void collect() {
    for (;;) {
      wait(target->completion_event());
      mem::MemCompletion c;
      while (target->take_completion(c)) got.push_back({c.id, c.done_ps, now()});
    }
  }
};

std::vector<std::pair<uint64_t, mem::MemRequest>> mixed_plan(uint64_t capacity) {
  std::mt19937_64 rng(11);
  std::vector<std::pair<uint64_t, mem::MemRequest>> plan;
  uint64_t t = 0;
  for (uint64_t i = 0; i < 1500; ++i) {
    t += rng() % 8 == 0 ? 20000 + rng() % 200000 : rng() % 1500;
    mem::MemRequest r;
    r.id = i;
    r.bytes = rng() % 2 ? 32u << (rng() % 8) : uint32_t(1 + rng() % 4096);
    r.addr = rng() % 3 ? (i * 4096) % capacity : rng() % (capacity - 4096);
    r.is_write = rng() % 3 == 0;
    plan.push_back({t, r});
  }
  return plan;
}

TEST(HbmSystemC, FastAndDetailedViewsAgree) {
  const HbmConfig cfg = load_hbm_preset("hbm2_v3", {"hbm.stacks=1", "hbm.queue_entries=16"});
  HbmFastModule fast("hbm_fast", cfg);
  HbmDetailedModule detailed("hbm_detailed", cfg);
  Requester a("req_fast"), b("req_detailed");
  a.target = &fast, b.target = &detailed;
  a.plan = b.plan = mixed_plan(cfg.capacity_bytes());
  sc_core::sc_start(sc_core::sc_time(2, sc_core::SC_MS));
  ASSERT_EQ(a.got.size(), a.plan.size());
  EXPECT_GT(a.retries, 0u);  // the pattern did meet back-pressure
  EXPECT_EQ(a.retries, b.retries);
  ASSERT_EQ(a.got.size(), b.got.size());
  for (size_t i = 0; i < a.got.size(); ++i) {
    ASSERT_EQ(a.got[i], b.got[i]) << i;
    EXPECT_EQ(a.got[i].done_ps, a.got[i].seen_ps);  // delivered exactly when done
  }
  EXPECT_EQ(fast.core().outstanding(), 0u);
  EXPECT_EQ(fast.core().next_event_ps(), mem::kNever);  // idle: nothing to wake for
  // The fast view stopped at its last completion; the detailed one ticked on.
  EXPECT_LT(fast.core().cycle(), detailed.core().cycle() / 10);
  // Brought to the same time (the idle refreshes catch up), the statistics agree.
  const uint64_t end_ps = sc_core::sc_time_stamp().value();
  fast.core().advance_to(end_ps);
  detailed.core().advance_to(end_ps);
  EXPECT_EQ(fast.core().stats_json(), detailed.core().stats_json());
}

}  // namespace
}  // namespace tpusim::hbm
