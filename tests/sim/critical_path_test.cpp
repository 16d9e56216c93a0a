// `tpusim run --critical-path` (hw/system/critical_path.h) on programs whose
// critical path is known by construction, against the published figures the
// presets are calibrated to (shared/design/architecture.md):
// - a ping-pong of 64 KiB pushes between two v4 chips: every hop is a neighbour
//   push, 1941 + 24.77 K cycles, so the path is ici but for a few cycles of issue
//   (the last push's completion comes back over the link: + 500);
// - a chain of HBM -> VMEM loads, each waited for before the next: 483.6 + 1.105 K
//   cycles each, all hbm;
// - a barrier: the core that arrives first waits for the other's load chain, so
//   the walk crosses the barrier to the last arrival and finds the loads there;
// - a join of a forked stream: the walk goes into the stream and its load;
// - a forked stream that outlives stream 0: the walk starts in it;
// - a core with no waits at all: issue and its unit queues only.
// Each time the segments tile [0, cycles], by_cause sums to cycles, stats.json
// and the report carry the summary, and fast and detailed modes write the same file.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/sim/cli_fixture.h"

using tpusim::testing::Completed;
using tpusim::testing::slurp;

namespace {

class CriticalPath : public tpusim::testing::TpusimCli {
 protected:
  // Assembles `text`, runs it on `preset` in `mode` with --critical-path; returns
  // the path document (and leaves stats.json and the report to look at).
  nlohmann::json run(const std::string& text, const std::string& preset, const std::string& mode = "fast",
                     const std::vector<std::string>& extra = {}) {
    const std::string src = dir_ + "/p.s", bundle = dir_ + "/p.tpb";
    std::ofstream(src) << text;
    Completed c = tpusim({"asm", src, "-o", bundle});
    EXPECT_EQ(c.exit_code, 0) << c.err;
    const std::string path = dir_ + "/cp_" + mode + ".json";
    std::vector<std::string> args = {"run", bundle, "--preset", preset, "--mode", mode, "--out", dir_ + "/out",
                                     "--critical-path", path};
    args.insert(args.end(), extra.begin(), extra.end());
    c = tpusim(args);
    EXPECT_EQ(c.exit_code, 0) << c.err;
    report_ = c.out;
    text_ = slurp(path);
    return nlohmann::json::parse(text_);
  }
  std::string report_, text_;
};

uint64_t cause(const nlohmann::json& p, const char* c) {
  return p.at("by_cause").contains(c) ? p["by_cause"][c].get<uint64_t>() : 0;
}

// The segments cover [0, cycles] end to end, and the causes add up to it.
void expect_tiles(const nlohmann::json& p) {
  const auto& s = p.at("segments");
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s.front()["begin"].get<uint64_t>(), 0u);
  for (size_t i = 1; i < s.size(); ++i) EXPECT_EQ(s[i]["begin"], s[i - 1]["end"]) << "segment " << i;
  EXPECT_EQ(s.back()["end"], p["cycles"]);
  uint64_t sum = 0;
  for (const auto& [k, v] : p.at("by_cause").items()) sum += v.get<uint64_t>();
  EXPECT_EQ(sum, p["cycles"].get<uint64_t>());
}

TEST_F(CriticalPath, PingPongOverALinkIsIciAtTheNeighbourFigure) {
  constexpr int kHops = 6, kKib = 64;
  std::string a = ".target chips=2 cores=1 mxus=1\n.core chip0.core0\n", b = ".core chip1.core0\n";
  const std::string push = ", vmem:[s0 + 0], bytes=" + std::to_string(kKib * 1024);
  for (int i = 0; i < kHops / 2; ++i) {
    a += "  dma vmem@chip1.c0:[s0 + 0]" + push + ", rflag=f3\n  wait.sub f4, 1\n";
    b += "  wait.sub f3, 1\n  dma vmem@chip0.c0:[s0 + 0]" + push + ", rflag=f4\n";
  }
  const nlohmann::json p = run(a + "  halt\n" + b + "  halt\n", "v4-8");
  ASSERT_NO_FATAL_FAILURE(expect_tiles(p));
  // The run ends when chip1's last push is complete back at chip1: that hop is
  // the figure plus the completion's way back over the link (v4's
  // ici.link_latency_cycles, 500).
  EXPECT_EQ(p["ends_on"], "chip1.core0");
  EXPECT_EQ(p["dma_hops"].get<uint64_t>(), uint64_t{kHops});
  const double published = kHops * (1941 + 24.77 * kKib) + 500;
  EXPECT_NEAR(double(cause(p, "ici")), published, 0.01 * published);
  // The rest is the cores passing each landing on and the first issue.
  EXPECT_LT(p["cycles"].get<uint64_t>() - cause(p, "ici"), uint64_t{20 * kHops});
  // Each hop names its push: chip0's at pcs 0, 2, 4 and chip1's at 1, 3, 5 (each
  // program alternates push and wait, chip1's starting with the wait).
  size_t named = 0;
  for (const auto& s : p["segments"])
    if (s["cause"] == "ici") {
      ASSERT_TRUE(s.contains("pc")) << s;
      EXPECT_EQ(s["pc"].get<int>() % 2, s["core"] == "chip0.core0" ? 0 : 1) << s;
      EXPECT_LT(s["pc"].get<int>(), kHops) << s;
      ++named;
    }
  EXPECT_EQ(named, size_t{kHops});
  // The summary is in stats.json (without the segments) and in the report.
  const nlohmann::json s = nlohmann::json::parse(slurp(dir_ + "/out/stats.json"));
  EXPECT_EQ(s.at("critical_path").at("by_cause"), p["by_cause"]);
  EXPECT_FALSE(s["critical_path"].contains("segments"));
  EXPECT_NE(report_.find("critical path: " + std::to_string(p["cycles"].get<uint64_t>()) + " cycles, ending on chip1.core0"),
            std::string::npos)
      << report_;
  // Both modes walk the same path, to the byte.
  const std::string fast = text_;
  run(a + "  halt\n" + b + "  halt\n", "v4-8", "detailed");
  EXPECT_EQ(text_, fast);
  // Walking it changes nothing else: the same run without it has the same stats.
  Completed c = tpusim({"run", dir_ + "/p.tpb", "--preset", "v4-8", "--out", dir_ + "/plain", "-q"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  nlohmann::json with = nlohmann::json::parse(slurp(dir_ + "/out/stats.json")),
                 without = nlohmann::json::parse(slurp(dir_ + "/plain/stats.json"));
  for (auto* j : {&with, &without}) j->at("host").erase("wall_seconds");
  with.erase("critical_path");
  with.erase("mode");
  without.erase("mode");
  EXPECT_EQ(with, without);
  // With a timeline: every segment a slice on its core's "critical path" track,
  // named by its cause, and an arrow where the path changes core.
  const nlohmann::json q = run(a + "  halt\n" + b + "  halt\n", "v4-8", "fast", {"--timeline", dir_ + "/t.json"});
  const nlohmann::json tl = nlohmann::json::parse(slurp(dir_ + "/t.json"));
  std::map<std::pair<int, int>, std::string> threads;  // (pid, tid) -> name
  for (const auto& e : tl["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") threads[{e["pid"], e["tid"]}] = e["args"]["name"];
  size_t slices = 0, arrows = 0, changes = 0;
  uint64_t ici = 0;
  for (const auto& e : tl["traceEvents"]) {
    if (e["ph"] == "X" && threads[{e["pid"], e["tid"]}] == "core0.critical path") {
      ++slices;
      if (e["name"] == "ici") {
        ici += static_cast<uint64_t>(std::llround(e["dur"].get<double>() * 1e-6 * 1.05e9));
        EXPECT_TRUE(e["args"].contains("pc")) << e;  // the push it is the time of
      }
    }
    arrows += e["ph"] == "s" && e["name"] == "critical path";
  }
  for (size_t i = 1; i < q["segments"].size(); ++i) changes += q["segments"][i]["core"] != q["segments"][i - 1]["core"];
  EXPECT_EQ(slices, q["segments"].size());
  EXPECT_EQ(arrows, changes);
  EXPECT_GT(changes, 0u);
  EXPECT_NEAR(double(ici), double(cause(q, "ici")), 2.0 * kHops);  // microsecond timestamps, rounded
}

TEST_F(CriticalPath, ChainOfHbmLoadsIsHbmAtThePublishedFigure) {
  constexpr int kLoads = 4, kKib = 256;
  std::string t = ".target chips=1 cores=1 mxus=1\n.core chip0.core0\n";
  for (int i = 0; i < kLoads; ++i)
    t += "  dma vmem:[s0 + 0], hbm:[s0 + " + std::to_string(i * kKib * 1024) + "], bytes=" +
         std::to_string(kKib * 1024) + ", flag=f1\n  wait.sub f1, 1\n";
  const nlohmann::json p = run(t + "  halt\n", "v3");
  ASSERT_NO_FATAL_FAILURE(expect_tiles(p));
  EXPECT_EQ(p["dma_hops"].get<uint64_t>(), uint64_t{kLoads});
  const double published = kLoads * (483.6 + 1.105 * kKib);
  EXPECT_NEAR(double(cause(p, "hbm")), published, 0.02 * published);
  EXPECT_EQ(cause(p, "ici") + cause(p, "core_to_core") + cause(p, "host"), 0u);
  // Load i is the DMA at pc 2i; its segments name it, in path order.
  std::vector<int> pcs;
  for (const auto& s : p["segments"])
    if (s["cause"] == "hbm") pcs.push_back(s.at("pc").get<int>());
  EXPECT_EQ(pcs, (std::vector<int>{0, 2, 4, 6}));
}

TEST_F(CriticalPath, BarrierLeadsToTheLastArrivalsLoads) {
  constexpr int kKib = 512;
  const std::string load = "  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=" + std::to_string(kKib * 1024) +
                           ", flag=f1\n  wait.sub f1, 1\n";
  const std::string t = ".target chips=1 cores=2 mxus=1\n.core chip0.core0\n" + load + load +
                        "  barrier\n  halt\n.core chip0.core1\n  barrier\n  halt\n";
  const nlohmann::json p = run(t, "v3");
  ASSERT_NO_FATAL_FAILURE(expect_tiles(p));
  EXPECT_EQ(p["dma_hops"].get<uint64_t>(), 2u);
  // core1 waits at the barrier for core0 (barrier_hops 1) if the walk starts on core1.
  EXPECT_LE(p["barrier_hops"].get<uint64_t>(), 1u);
  const double published = 2 * (483.6 + 1.105 * kKib);
  EXPECT_NEAR(double(cause(p, "hbm")), published, 0.02 * published);
  bool crossed = false;
  for (const auto& s : p["segments"]) crossed |= s["core"] == "chip0.core0" && s["cause"] == "hbm";
  EXPECT_TRUE(crossed);
}

// A join: stream 0 waits for stream 1's fadd, stream 1 for its own load. The walk
// follows the fadd into stream 1, the load, and back to stream 0 at the fork.
TEST_F(CriticalPath, JoinLeadsIntoTheForkedStreamsLoad) {
  constexpr int kKib = 256;
  const std::string t = ".target chips=1 cores=1 mxus=1\n.core chip0.core0\n  fork child\n  wait f9, 1\n  halt\n"
                        "child:\n  dma vmem:[s0 + 0], hbm:[s0 + 0], bytes=" +
                        std::to_string(kKib * 1024) + ", flag=f1\n  wait f1, 1\n  fadd f9, 1\n  halt\n";
  const nlohmann::json p = run(t, "v3");
  ASSERT_NO_FATAL_FAILURE(expect_tiles(p));
  EXPECT_EQ(p["dma_hops"].get<uint64_t>(), 1u);
  const double published = 483.6 + 1.105 * kKib;
  EXPECT_NEAR(double(cause(p, "hbm")), published, 0.02 * published);
  EXPECT_LT(cause(p, "issue"), 20u);
  for (const auto& s : p["segments"])  // the forked stream's load: pc 3, after fork, wait, halt
    if (s["cause"] == "hbm") {
      EXPECT_EQ(s.at("pc"), 3) << s;
    }
}

// A forked stream that outlives stream 0 (which halts without joining it): the
// walk starts on the stream that issued last, so its two loads are the path.
TEST_F(CriticalPath, AForkedStreamThatOutlivesStreamZeroIsWalked) {
  constexpr int kKib = 256;
  std::string t = ".target chips=1 cores=1 mxus=1\n.core chip0.core0\n  fork child\n  halt\nchild:\n";
  for (int i = 0; i < 2; ++i)
    t += "  dma vmem:[s0 + 0], hbm:[s0 + " + std::to_string(i * kKib * 1024) + "], bytes=" +
         std::to_string(kKib * 1024) + ", flag=f1\n  wait f1, " + std::to_string(i + 1) + "\n";
  const nlohmann::json p = run(t + "  vadd v1, v1, v2\n  halt\n", "v3");
  ASSERT_NO_FATAL_FAILURE(expect_tiles(p));
  EXPECT_EQ(p["dma_hops"].get<uint64_t>(), 2u);
  const double published = 2 * (483.6 + 1.105 * kKib);
  EXPECT_NEAR(double(cause(p, "hbm")), published, 0.02 * published);
  EXPECT_LT(cause(p, "issue"), 20u);
}

TEST_F(CriticalPath, ACoreWithoutWaitsIsItsOwnIssue) {
  std::string t = ".target chips=1 cores=1 mxus=1\n.core chip0.core0\n";
  for (int i = 0; i < 2000; ++i) t += "  vadd v1, v1, v2\n";
  const nlohmann::json p = run(t + "  halt\n", "v3");
  ASSERT_NO_FATAL_FAILURE(expect_tiles(p));
  EXPECT_EQ(p["dma_hops"].get<uint64_t>(), 0u);
  EXPECT_EQ(cause(p, "issue") + cause(p, "unit_queue"), p["cycles"].get<uint64_t>());
  EXPECT_GE(p["cycles"].get<uint64_t>(), 2000u);  // one vector ALU op a cycle
}

}  // namespace
