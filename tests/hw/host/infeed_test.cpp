// A program that reads N input batches of 64 KiB from host: space (all DMAs
// issued up front, one VMEM buffer each) and adds one tile of each, run with an
// ample and with a starved host (host.infeed_bytes_per_s, host.batch_prep_us).
// Starved, the host paces the program: every further batch costs
// prep + bytes / rate (the host-rate bound, computed here from the --set values),
// the sequencer's waits count as stall_infeed_cycles, and the timeline marks them.
// Values equal the reference in every case; fast and detailed agree.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kBatchBytes = 65536;
constexpr double kClockHz = 940e6;  // v3
constexpr double kStarvedRate = 0.25e9;
constexpr double kStarvedPrepUs = 20;

struct RunOut {
  nlohmann::json j;
  int status = -1;
};

RunOut core_run(const std::string& prog, const std::string& mode, const std::vector<std::string>& extra) {
  static int counter = 0;
  const fs::path out = fs::temp_directory_path() /
                       ("infeed_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".json");
  std::string cmd = std::string(TPUSIM_CORE_RUN) + " '" + prog + "' v3 " + mode + " '" + out.string() + "'";
  for (const auto& e : extra) cmd += " '" + e + "'";
  RunOut r;
  r.status = std::system(cmd.c_str());
  std::ifstream in(out);
  if (in) in >> r.j;
  fs::remove(out);
  return r;
}

std::string program(int batches) {
  const uint64_t elems = kBatchBytes / 4;
  std::string s = ".target chips=1 cores=1 mxus=1\n";
  s += ".input x f32 [" + std::to_string(batches * elems) + "] host:0x0\n";
  s += ".output y f32 [1024] hbm:0x0\n.core chip0.core0\n  vbcast v0, 0.0\n";
  for (int i = 0; i < batches; ++i)
    s += "  dma vmem:[s0 + " + std::to_string(i * kBatchBytes) + "], host:[s0 + " + std::to_string(i * kBatchBytes) +
         "], bytes=" + std::to_string(kBatchBytes) + ", flag=f1\n";
  for (int i = 0; i < batches; ++i) {
    s += "  wait.sub f1, 1\n";
    s += "  vld v1, [s0 + " + std::to_string(i * kBatchBytes) + "]\n";
    s += "  vadd v0, v0, v1\n";
  }
  s += "  vst v0, [s0 + 0x100000]\n  dma hbm:[s0 + 0], vmem:[s0 + 0x100000], bytes=4096, flag=f2\n";
  s += "  wait.sub f2, 1\n  halt\n";
  return s;
}

std::vector<std::string> host_rate(double rate, double prep_us) {
  return {"--set", "host.infeed_bytes_per_s=" + std::to_string(rate), "--set",
          "host.batch_prep_us=" + std::to_string(prep_us)};
}

RunOut run(int batches, const std::vector<std::string>& sets, const std::string& mode = "fast",
           std::vector<std::string> extra = {}) {
  const fs::path p = fs::temp_directory_path() /
                     ("infeed_" + std::to_string(::getpid()) + "_" + std::to_string(batches) + ".s");
  std::ofstream(p) << program(batches);
  extra.insert(extra.end(), sets.begin(), sets.end());
  RunOut r = core_run(p.string(), mode, extra);
  fs::remove(p);
  EXPECT_EQ(r.status, 0);
  EXPECT_FALSE(r.j.value("faulted", true)) << r.j.value("fault", std::string());
  EXPECT_TRUE(r.j.value("ref_ok", false));
  EXPECT_EQ(r.j["outputs"], r.j["ref_outputs"]);
  return r;
}

uint64_t cycles(const RunOut& r) { return r.j.value("cycles", uint64_t{0}); }
uint64_t infeed_stall(const RunOut& r) {
  return r.j["units"]["chip0.core0.sequencer"].value("stall_infeed_cycles", uint64_t{0});
}

TEST(Infeed, StarvedHostPacesEachBatchAtTheHostRateBound) {
  const auto starved = host_rate(kStarvedRate, kStarvedPrepUs);
  const RunOut s4 = run(4, starved), s8 = run(8, starved);
  const double bound = (static_cast<double>(kBatchBytes) / kStarvedRate + kStarvedPrepUs * 1e-6) * kClockHz;
  const double step = static_cast<double>(cycles(s8) - cycles(s4)) / 4;
  EXPECT_NEAR(step, bound, 0.05 * bound) << "starved step " << step << " cycles, host-rate bound " << bound;
  // The ample host (every byte ready at once) is far faster than that bound.
  const RunOut a4 = run(4, host_rate(0, 0)), a8 = run(8, host_rate(0, 0));
  const double ample_step = static_cast<double>(cycles(a8) - cycles(a4)) / 4;
  EXPECT_LT(ample_step, 0.5 * bound);
  // The difference is attributed to infeed: the extra cycles are infeed stalls.
  const double extra = static_cast<double>(cycles(s8)) - static_cast<double>(cycles(a8));
  const double extra_stall = static_cast<double>(infeed_stall(s8)) - static_cast<double>(infeed_stall(a8));
  EXPECT_GT(extra, 0);
  EXPECT_NEAR(extra_stall, extra, 0.05 * extra);
  // The other flag stall (the output's HBM write, ~420 cycles) does not depend on
  // the host: equal but for the DRAM clock's phase at the two runs' different
  // start times (the link's 64.73 cycles/KiB ends the infeed mid-cycle).
  const auto other_flag_stall = [](const RunOut& r) {
    return static_cast<double>(r.j["units"]["chip0.core0.sequencer"].value("stall_flag_cycles", uint64_t{0}));
  };
  EXPECT_GT(other_flag_stall(a8), 400);
  EXPECT_NEAR(other_flag_stall(s8), other_flag_stall(a8), 2);
  EXPECT_EQ(s8.j["units"]["chip0.host"].value("infeed_batches", uint64_t{0}), 8u);
}

TEST(Infeed, FastAndDetailedAgreeAndTheTimelineMarksTheStall) {
  const auto starved = host_rate(4e9, 5);
  const fs::path tl = fs::temp_directory_path() / ("infeed_tl_" + std::to_string(::getpid()) + ".json");
  const RunOut fast = run(2, starved, "fast", {"--timeline", tl.string()});
  const RunOut det = run(2, starved, "detailed");
  EXPECT_EQ(cycles(fast), cycles(det));
  EXPECT_EQ(fast.j["units"], det.j["units"]);
  EXPECT_GT(infeed_stall(fast), 0u);
  std::ifstream in(tl);
  nlohmann::json t;
  in >> t;
  fs::remove(tl);
  uint64_t marked = 0;
  for (const auto& e : t["traceEvents"])
    if (e.value("name", std::string()) == "stall: infeed" && e.value("ph", std::string()) == "X") ++marked;
  EXPECT_GE(marked, 1u);
}

}  // namespace
