// Per-channel statistics (stats_json "channels") and the per-channel timeline
// counters, against counts that follow from the address mapping and against the
// channel's own counter samples.
#include "hbm_test_util.h"

#include "hw/hbm/traffic.h"
#include "hw/timeline/timeline.h"

namespace tpusim::hbm::testing {
namespace {

// 64 sequential 4 KiB reads on one v3 stack (16 pseudo-channels): the default
// mapping spreads each request as 8 bursts over every pseudo-channel, so each
// reads 64 x 8 = 512 bursts, 16 KiB: 16 rows of 1 KiB, each opened at least once.
TEST(HbmStats, PerChannelCountersAddUpForASequentialStream) {
  const HbmConfig cfg = load_hbm_preset("hbm2_v3", {"hbm.stacks=1"});
  ASSERT_EQ(cfg.channels(), 16u);
  HbmMemory mem(cfg);
  TrafficSpec spec = TrafficSpec::defaults(Pattern::kSequential, 64);
  run_traffic(mem, spec, cfg.capacity_bytes());
  const auto j = mem.stats_json();
  ASSERT_EQ(j["channels"].size(), 16u);
  EXPECT_EQ(j["bursts"]["reads"].get<uint64_t>(), 64u * 128);
  EXPECT_EQ(j["requests"]["reads"].get<uint64_t>(), 64u);
  EXPECT_EQ(j["request_latency_ps"]["count"].get<uint64_t>(), 64u);
  for (const auto& ch : j["channels"]) {
    SCOPED_TRACE(ch["channel"].dump());
    EXPECT_EQ(ch["reads"].get<uint64_t>(), 512u);
    EXPECT_EQ(ch["writes"].get<uint64_t>(), 0u);
    EXPECT_EQ(ch["bytes"].get<uint64_t>(), 512u * 32);
    const uint64_t hits = ch["row_hits"], misses = ch["row_misses"], conflicts = ch["row_conflicts"];
    EXPECT_EQ(hits + misses + conflicts, 512u);
    EXPECT_EQ(misses + conflicts, ch["activates"].get<uint64_t>());
    EXPECT_GE(ch["activates"].get<uint64_t>(), 16u);
    EXPECT_LE(ch["queue_occupancy"]["max"].get<uint64_t>(), cfg.queue_entries);
    EXPECT_GT(ch["queue_occupancy"]["mean"].get<double>(), 0.0);
    const auto& lat = ch["latency_cycles"];
    EXPECT_EQ(lat["count"].get<uint64_t>(), 512u);
    // A read burst takes at least tCL + BL/2 after its RD, itself at least tRCD after an ACT.
    EXPECT_GE(lat["p50"].get<uint64_t>(), cfg.timing[tCL] + cfg.timing.tBURST());
    EXPECT_LE(lat["p50"].get<uint64_t>(), lat["p99"].get<uint64_t>());
    EXPECT_LE(lat["p99"].get<uint64_t>(), lat["max"].get<uint64_t>());
    // Bandwidth per channel = bytes / elapsed cycles, at most 16 B/cycle (64 bits, both edges).
    const double bpc = ch["bandwidth_bytes_per_cycle"];
    EXPECT_DOUBLE_EQ(bpc, double(512 * 32) / double(j["cycles"].get<uint64_t>()));
    EXPECT_LE(bpc, 16.0);
    EXPECT_DOUBLE_EQ(ch["bandwidth_bytes_per_s"].get<double>(), bpc * double(cfg.clock_hz));
  }
}

// read_write_turnarounds counts the column commands whose kind differs from the
// one before, as read off each channel's command log; a read-only stream has none.
TEST(HbmStats, TurnaroundsAreTheChangesOfKindInTheCommandStream) {
  const HbmConfig cfg = load_hbm_preset("hbm2_v3", {"hbm.stacks=1"});
  for (Pattern p : {Pattern::kMix, Pattern::kSequential}) {
    HbmMemory mem(cfg);
    for (uint32_t ch = 0; ch < mem.channel_count(); ++ch) mem.channel(ch).record_commands(true);
    run_traffic(mem, TrafficSpec::defaults(p, 400), cfg.capacity_bytes());
    const auto j = mem.stats_json();
    uint64_t total = 0;
    for (uint32_t ch = 0; ch < mem.channel_count(); ++ch) {
      uint64_t changes = 0;
      Command last = Command::kCount;
      for (const auto& c : mem.channel(ch).command_log()) {
        if (c.cmd != Command::kRd && c.cmd != Command::kWr) continue;
        changes += last != Command::kCount && c.cmd != last;
        last = c.cmd;
      }
      EXPECT_EQ(j["channels"][ch]["read_write_turnarounds"].get<uint64_t>(), changes) << ch;
      total += changes;
    }
    EXPECT_EQ(j["read_write_turnarounds"].get<uint64_t>(), total);
    if (p == Pattern::kMix) EXPECT_GT(total, 0u);
    else EXPECT_EQ(total, 0u);
  }
}

// A sample interval that would take more than kMaxSamplesPerChannel samples doubles
// until it does not, dropping every other sample each time: what is left is the
// series a run sampled at the final interval from the start takes, to the sample.
TEST(HbmStats, SamplesPastTheCapCoarsenToTheSeriesOfTheFinalInterval) {
  auto run = [](uint64_t interval) {
    const HbmConfig cfg = load_hbm_preset("hbm2_v3", {"hbm.stacks=1", "hbm.sample_interval_cycles=" +
                                                                          std::to_string(interval)});
    auto mem = std::make_unique<HbmMemory>(cfg);
    TrafficSpec spec = TrafficSpec::defaults(Pattern::kMix, 400);
    run_traffic(*mem, spec, cfg.capacity_bytes());
    mem->skip(3000);
    return mem;
  };
  const auto fine = run(3);
  const uint64_t cycles = fine->cycle();
  const uint64_t used = fine->stats_json()["sample_interval_cycles"].get<uint64_t>();
  // 3 x 2^k, the least that keeps the run's cycles / interval samples within the cap.
  uint64_t want = 3;
  while (cycles / want > HbmMemory::kMaxSamplesPerChannel) want *= 2;
  ASSERT_GT(want, 3u) << "the run is too short to reach the cap: " << cycles << " cycles";
  EXPECT_EQ(used, want);
  const auto direct = run(used);
  ASSERT_EQ(direct->cycle(), cycles);  // sampling does not change the run
  for (uint32_t i : {0u, 7u, 15u}) {
    SCOPED_TRACE(i);
    const auto& a = fine->channel(i).samples();
    const auto& b = direct->channel(i).samples();
    ASSERT_EQ(a.size(), cycles / used);
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) {
      EXPECT_EQ(a[k].cycle, (k + 1) * used);
      EXPECT_EQ(a[k].cycle, b[k].cycle);
      EXPECT_EQ(a[k].reads, b[k].reads);
      EXPECT_EQ(a[k].writes, b[k].writes);
      EXPECT_EQ(a[k].activates, b[k].activates);
      EXPECT_EQ(a[k].queued, b[k].queued);
    }
  }
  // stats.json carries them as one array per counter.
  const auto j = fine->stats_json()["channels"][0]["samples"];
  EXPECT_EQ(j["cycle"].size(), cycles / used);
  EXPECT_EQ(j["reads"].back().get<uint64_t>(), fine->channel(0).samples().back().reads);
}

// The timeline's per-channel counters follow the channel samples taken at the same
// boundaries: bandwidth = bursts in the interval x 32 B / interval, queued = queue.
TEST(HbmStats, TimelineCountersFollowTheChannelSamples) {
  const HbmConfig cfg = load_hbm_preset("hbm2_v3", {"hbm.stacks=1", "hbm.sample_interval_cycles=97"});
  HbmMemory mem(cfg);
  timeline::Options o;
  o.clock_hz = 1e12;  // the timeline counts picoseconds
  timeline::Timeline tl(o);
  mem.set_timeline(&tl, "chip0", 1);
  TrafficSpec spec = TrafficSpec::defaults(Pattern::kMix, 300);
  run_traffic(mem, spec, cfg.capacity_bytes());
  mem.skip(5000);  // idle tail: the counters fall to 0 once, then nothing
  const auto events = nlohmann::json::parse(tl.to_json());
  const auto& list = events.is_object() ? events["traceEvents"] : events;
  const double interval_s = double(mem.clock().cycle_to_ps(97)) * 1e-12;
  for (uint32_t i : {0u, 5u, 15u}) {
    SCOPED_TRACE(i);
    const auto& samples = mem.channel(i).samples();
    ASSERT_GT(samples.size(), 10u);
    std::vector<double> want_bw, want_q;
    uint64_t before = 0;
    double last_bw = 0, last_q = 0;
    for (const auto& s : samples) {
      const double bw = double((s.reads + s.writes - before) * 32) / interval_s * 1e-9;
      before = s.reads + s.writes;
      if (bw != last_bw) want_bw.push_back(bw), last_bw = bw;
      if (double(s.queued) != last_q) want_q.push_back(double(s.queued)), last_q = double(s.queued);
    }
    std::vector<double> got_bw, got_q;
    const std::string unit = "hbm.ch" + std::to_string(i);
    for (const auto& e : list) {
      if (e.value("ph", "") != "C") continue;
      if (e["name"] == unit + " GB/s") got_bw.push_back(e["args"]["value"].get<double>());
      if (e["name"] == unit + " queued") got_q.push_back(e["args"]["value"].get<double>());
    }
    ASSERT_EQ(got_bw.size(), want_bw.size());
    for (size_t k = 0; k < got_bw.size(); ++k) EXPECT_NEAR(got_bw[k], want_bw[k], 1e-9 * want_bw[k] + 1e-12) << k;
    EXPECT_EQ(got_q, want_q);
    EXPECT_EQ(got_bw.back(), 0.0);  // the idle tail
  }
}

}  // namespace
}  // namespace tpusim::hbm::testing
