// stats.json schema and derived figures, checked against closed forms of the
// contract (shared/spec/cli.md): seconds = cycles / clock_hz,
// mxu_utilization = flops / (peak_flops_per_s * seconds).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "sim/run/report.h"
#include "sim/run/stats.h"

namespace tpusim::run {
namespace {

using nlohmann::json;

RunFigures v3_figures() {
  RunFigures f;
  f.preset = "v3";
  f.mode = "fast";
  f.clock_hz = 940e6;
  f.cycles = 1880;  // 2 us at 940 MHz
  // v3 peak: 2 cores x 2 MXUs x 128 x 128 MACs x 2 FLOP x 940 MHz.
  f.peak_flops_per_s = 2.0 * 2 * 2 * 128 * 128 * 940e6;
  // A quarter of the chip's MXU MACs over the run.
  f.flops = uint64_t(2) * 2 * 2 * 128 * 128 * 1880 / 4;
  f.hbm_bytes_read = 1 << 20;
  f.hbm_bytes_written = 1 << 19;
  f.hbm_peak_bytes_per_s = 0.9e12;
  f.wall_seconds = 0.25;
  f.units = {{"chip0.core0.mxu0", {{"busy_cycles", 470}, {"lhs_vregs", 12}}}};
  return f;
}

TEST(Stats, DerivedFiguresFollowTheContract) {
  const json s = make_stats(v3_figures());
  EXPECT_EQ(s["preset"], "v3");
  EXPECT_EQ(s["mode"], "fast");
  EXPECT_EQ(s["cycles"].get<uint64_t>(), 1880u);
  EXPECT_DOUBLE_EQ(s["seconds"].get<double>(), 2e-6);
  EXPECT_DOUBLE_EQ(s["mxu_utilization"].get<double>(), 0.25);
  EXPECT_EQ(s["hbm"]["bytes_read"].get<uint64_t>(), 1u << 20);
  EXPECT_EQ(s["hbm"]["bytes_written"].get<uint64_t>(), 1u << 19);
  EXPECT_DOUBLE_EQ(s["hbm"]["peak_bytes_per_s"].get<double>(), 0.9e12);
  EXPECT_DOUBLE_EQ(s["host"]["wall_seconds"].get<double>(), 0.25);
  EXPECT_EQ(s["units"]["chip0.core0.mxu0"]["busy_cycles"].get<int>(), 470);
  EXPECT_TRUE(check_stats(s).empty()) << check_stats(s).front();
}

TEST(Stats, ZeroCycleRunIsValidJsonWithZeroUtilization) {
  RunFigures f = v3_figures();
  f.cycles = 0;
  f.flops = 0;
  const json s = make_stats(f);
  EXPECT_EQ(s["seconds"].get<double>(), 0.0);
  EXPECT_EQ(s["mxu_utilization"].get<double>(), 0.0);
  EXPECT_TRUE(check_stats(s).empty());
  // NaN would serialise as null and break every reader.
  EXPECT_EQ(json::parse(stats_text(s)), s);
}

TEST(Stats, EveryRequiredKeyIsChecked) {
  const json good = make_stats(v3_figures());
  const char* top[] = {"preset", "mode", "clock_hz", "cycles", "seconds", "flops",
                       "peak_flops_per_s", "mxu_utilization", "hbm", "host", "units"};
  for (const char* key : top) {
    json s = good;
    s.erase(key);
    const auto p = check_stats(s);
    ASSERT_FALSE(p.empty()) << key;
    EXPECT_NE(p.front().find(key), std::string::npos) << p.front();
  }
  for (const char* key : {"bytes_read", "bytes_written", "peak_bytes_per_s"}) {
    json s = good;
    s["hbm"].erase(key);
    ASSERT_FALSE(check_stats(s).empty()) << key;
  }
  json s = good;
  s["host"].erase("wall_seconds");
  EXPECT_FALSE(check_stats(s).empty());
}

TEST(Stats, WrongTypesAndInconsistentFiguresAreReported) {
  const json good = make_stats(v3_figures());
  json s = good;
  s["cycles"] = -5;
  EXPECT_FALSE(check_stats(s).empty());
  s = good;
  s["cycles"] = "1880";
  EXPECT_FALSE(check_stats(s).empty());
  s = good;
  s["mode"] = "turbo";
  EXPECT_FALSE(check_stats(s).empty());
  s = good;
  s["seconds"] = 1.0;
  EXPECT_FALSE(check_stats(s).empty());
  s = good;
  s["mxu_utilization"] = 0.5;
  EXPECT_FALSE(check_stats(s).empty());
  s = good;
  s["units"]["chip0.core0.mxu0"]["busy_cycles"] = nullptr;
  EXPECT_FALSE(check_stats(s).empty());
  s = good;
  s["units"]["chip0.hbm"]["latency_ns"]["p99"] = nullptr;
  EXPECT_FALSE(check_stats(s).empty());
  s = good;
  s["units"]["chip0.mxu"] = 3;
  EXPECT_FALSE(check_stats(s).empty());
  // Histograms and labels are fine.
  s = good;
  s["units"]["chip0.hbm"] = {{"model", "simple"}, {"latency_ns", {{"p50", 100}, {"mean", 100.0}}}};
  EXPECT_TRUE(check_stats(s).empty());
  // Per-channel records come as arrays of objects; a null deep inside one is still caught.
  s["units"]["chip0.hbm"]["channels"] = json::array({{{"reads", 4}, {"row_hits", 3}}, {{"reads", 0}}});
  EXPECT_TRUE(check_stats(s).empty());
  s["units"]["chip0.hbm"]["channels"][1]["reads"] = nullptr;
  const auto problems = check_stats(s);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("units.chip0.hbm.channels[1].reads"), std::string::npos) << problems[0];
  EXPECT_FALSE(check_stats(json::array()).empty());
}

TEST(Stats, DeterministicPartDropsOnlyWallTime) {
  RunFigures a = v3_figures(), b = v3_figures();
  b.wall_seconds = 9.5;
  EXPECT_NE(make_stats(a), make_stats(b));
  EXPECT_EQ(deterministic_part(make_stats(a)), deterministic_part(make_stats(b)));
  b.cycles += 1;
  EXPECT_NE(deterministic_part(make_stats(a)), deterministic_part(make_stats(b)));
  // Across modes only "mode" may differ.
  RunFigures d = v3_figures();
  d.mode = "detailed";
  EXPECT_NE(deterministic_part(make_stats(a)), deterministic_part(make_stats(d)));
  EXPECT_EQ(deterministic_part(make_stats(a), true), deterministic_part(make_stats(d), true));
  EXPECT_TRUE(deterministic_part(make_stats(a))["host"].is_object());
}

TEST(Stats, WriteThenReadRoundTripsExactly) {
  const std::string dir = ::testing::TempDir() + "stats_rt_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/stats.json";
  const json s = make_stats(v3_figures());
  write_stats(path, s);
  EXPECT_EQ(read_stats(path), s);
  // No temporary left beside the file.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  std::filesystem::remove_all(dir);
}

TEST(Stats, ReadRejectsNonStatsFilesWithTheirName) {
  const std::string dir = ::testing::TempDir() + "stats_bad_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/stats.json";
  std::ofstream(path) << "{\"cycles\": 3";
  try {
    read_stats(path);
    FAIL() << "truncated JSON accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  std::ofstream(path, std::ios::trunc) << "{\"cycles\": 3}";
  EXPECT_THROW(read_stats(path), std::runtime_error);
  EXPECT_THROW(read_stats(dir + "/absent.json"), std::runtime_error);
  std::filesystem::remove_all(dir);
}

TEST(Report, StatesCyclesTimeThroughputAndUtilization) {
  const std::string r = format_report(make_stats(v3_figures()));
  EXPECT_NE(r.find("1880"), std::string::npos) << r;
  EXPECT_NE(r.find("2.000 us"), std::string::npos) << r;
  EXPECT_NE(r.find("940 MHz"), std::string::npos) << r;
  // Peak 123.2 TFLOPS; a quarter of it achieved.
  EXPECT_NE(r.find("30.802 TFLOPS of 123.2 TFLOPS peak"), std::string::npos) << r;
  EXPECT_NE(r.find("25.00%"), std::string::npos) << r;
  EXPECT_NE(r.find("v3"), std::string::npos) << r;
}

}  // namespace
}  // namespace tpusim::run
